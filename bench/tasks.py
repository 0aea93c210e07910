"""The no-op Django Tasks the backend benchmark enqueues: one per backend."""

from django_tasks import task


@task(queue_name="bench")
def noop_jobs(n: int) -> int:
    return n


@task(queue_name="bench", backend="db")
def noop_db(n: int) -> int:
    return n
