"""The only writer of new job rows: single idempotent enqueues and a round's bulk insert."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from . import clock
from .conf import get_settings
from .models import Job

if TYPE_CHECKING:
    from .registry import JobHandle

#: The channel workers LISTEN on (PostgreSQL); the payload is the queue name.
NOTIFY_CHANNEL = "ultimat3_jobs"


@dataclass(frozen=True)
class EnqueueResult:
    """``created`` is False when a job with this key already existed; ``job_id`` is that job."""

    created: bool
    job_id: int
    key: str


def notify(queues: Sequence[str], using: str = "default") -> None:
    """Wake LISTENing workers; inside a transaction PostgreSQL delivers it at commit."""
    connection = connections[using]
    if connection.vendor != "postgresql" or not queues:
        return
    with connection.cursor() as cursor:
        for queue in sorted(set(queues)):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue])


def job_fields(
    handle: JobHandle,
    data: dict[str, Any],
    *,
    key: str,
    run_at: datetime | None,
    queue: str | None,
    enqueued_by: str,
    now: datetime,
    task: str = "",
    occurrence: datetime | None = None,
    catch_up: bool = False,
) -> dict[str, Any]:
    """The fields of a new job row, with the defaults the job and the settings give."""
    config = get_settings()
    return {
        "name": handle.name,
        "key": key,
        "input": data,
        "queue": queue or handle.queue or config.default_queue,
        "max_attempts": handle.max_attempts or config.max_attempts,
        "run_at": run_at or now,
        "created_at": now,
        "task": task,
        "occurrence": occurrence,
        "catch_up": catch_up,
        "enqueued_by": enqueued_by,
    }


def build_job(handle: JobHandle, data: dict[str, Any], **fields: Any) -> Job:
    """An unsaved job row: ``job_fields`` as a model instance."""
    return Job(**job_fields(handle, data, **fields))


def enqueue(
    handle: JobHandle,
    data: dict[str, Any],
    *,
    key: str,
    run_at: datetime | None = None,
    queue: str | None = None,
    enqueued_by: str = "code",
    task: str = "",
) -> EnqueueResult:
    """Insert one job, or return the one that already holds ``key``."""
    job = build_job(
        handle,
        data,
        key=key,
        run_at=run_at,
        queue=queue,
        enqueued_by=enqueued_by,
        now=clock.now(),
        task=task,
    )
    try:
        with transaction.atomic():
            job.save(force_insert=True)
            notify([job.queue])
    except IntegrityError:
        existing = Job.objects.filter(key=key).values_list("pk", flat=True).first()
        if existing is None:
            raise
        return EnqueueResult(created=False, job_id=existing, key=key)
    return EnqueueResult(created=True, job_id=job.pk, key=key)


def insert_many(jobs: Sequence[Job], using: str = "default") -> dict[str, tuple[int, bool]]:
    """Insert ``jobs``, skipping keys that exist; ``{key: (job_id, created)}`` for every one.

    Three statements whatever the count: the keys already there, one insert with ON CONFLICT
    DO NOTHING, the ids. Call it inside the transaction that also advances the watermarks.
    """
    if not jobs:
        return {}
    keys = [job.key for job in jobs]
    rows = Job.objects.using(using)
    before = set(rows.filter(key__in=keys).values_list("key", flat=True))
    rows.bulk_create(jobs, ignore_conflicts=True)
    ids = dict(rows.filter(key__in=keys).values_list("key", "pk"))
    return {key: (ids[key], key not in before) for key in keys if key in ids}
