# The jobs that ended failed or cancelled get an index of their own, newest first. Finished
# jobs pile up between prunes (10,000 tasks a minute keep 200 million over the default 14
# days) while failures stay few, and the admin's "failed" list and its count walked every
# finished job to find them. Only failed and cancelled rows enter it, so a worker's finishes
# cost nothing more. Built without locking the table on PostgreSQL: workers go on finishing
# jobs meanwhile. Every job stays.

from django.db import migrations, models

from ._operations import AddIndexWithoutLocking


class Migration(migrations.Migration):

    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("ultimat3_jobs", "0013_occurrence_recorded_index"),
    ]

    operations = [
        AddIndexWithoutLocking(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["failed", "cancelled"])),
                fields=["status", "-id"],
                name="u3j_job_failed",
            ),
        ),
    ]
