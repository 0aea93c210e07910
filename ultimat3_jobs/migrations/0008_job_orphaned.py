# A job taken back from a dead worker is marked (its next starts are recorded before it runs),
# every row kept:
# a constant database default, so PostgreSQL adds the column without rewriting the table, and a
# worker of the previous release (which names the columns it writes) leaves it false.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0007_lean_job_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="orphaned",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
