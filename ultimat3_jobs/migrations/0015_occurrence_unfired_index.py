# The occurrence records that are not of a fired occurrence (dropped, paused, manual, overlap,
# backfill) get an index of their own, newest first. They are few among the fired ones, and
# the admin's history list filtered by one of them, and its count, walked every record to find
# them. A fired occurrence's record writes nothing to it. Built without locking the table on
# PostgreSQL, as 0013's; every record stays.

from django.db import migrations, models

from ._operations import AddIndexWithoutLocking


class Migration(migrations.Migration):

    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("ultimat3_jobs", "0014_job_failed_index"),
    ]

    operations = [
        AddIndexWithoutLocking(
            model_name="occurrence",
            index=models.Index(
                condition=models.Q(("outcome", "fired"), _negated=True),
                fields=["-recorded_at"],
                name="u3j_occ_unfired",
            ),
        ),
    ]
