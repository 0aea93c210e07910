# A worker of given queues (`run_worker --queues`) claims by an index of queued rows behind
# their queue's name, in claim order. On the ready index alone its claim read every due row of
# the other queues before reaching its own: behind a backlog of 1,000,000 jobs in another
# queue, 190 ms a claim. Its predicate is the status as a range of one value, which the claim
# of given queues matches and which does not imply the ready index's. Built without locking
# the table on PostgreSQL, as 0013's; every job stays.

from django.db import migrations, models

from ._operations import AddIndexWithoutLocking


class Migration(migrations.Migration):

    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("ultimat3_jobs", "0015_occurrence_unfired_index"),
    ]

    operations = [
        AddIndexWithoutLocking(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                models.F("id"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued")),
                name="u3j_job_queue_ready",
            ),
        ),
    ]
