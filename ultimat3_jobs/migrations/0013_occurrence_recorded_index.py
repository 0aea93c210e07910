# The occurrence records get an index on when they were recorded. The history only grows
# between prunes (10,000 tasks a minute keep 200 million records over the default 14 days),
# and without it the admin's history list, the lateness jobs_status prints and each prune's
# search for old records read every record there is. Built without locking the table on
# PostgreSQL, so the scheduler goes on writing its rounds meanwhile; every record stays.

from django.db import migrations, models

from ._operations import AddIndexWithoutLocking


class Migration(migrations.Migration):

    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("ultimat3_jobs", "0012_task_fillfactor"),
    ]

    operations = [
        AddIndexWithoutLocking(
            model_name="occurrence",
            index=models.Index(fields=["-recorded_at"], name="u3j_occ_recorded"),
        ),
    ]
