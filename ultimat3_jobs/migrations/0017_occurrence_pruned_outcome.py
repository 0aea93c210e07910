# A prune is recorded under the app's prune task, its cutoff as the occurrence: a backfill
# then knows before when the jobs and records that said whether an occurrence fired may be
# gone. Choices only: no column changes, every row stays.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0016_job_queue_ready_index"),
    ]

    operations = [
        migrations.AlterField(
            model_name="occurrence",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("fired", "Fired"),
                    ("dropped", "Dropped"),
                    ("paused", "Paused"),
                    ("manual", "Manual"),
                    ("overlap", "Overlap"),
                    ("backfill", "Backfill"),
                    ("pruned", "Pruned"),
                ],
                max_length=16,
            ),
        ),
    ]
