# The claim reads queued rows through the partial index u3j_job_ready (priority, run_at, id);
# the wide index over every row's status, queue and run_at only cost each finish an update.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("ultimat3_jobs", "0005_relay"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="u3j_job_claim",
        ),
    ]
