"""The job store: the only module where job rows are created or change status.

Enqueue (one job, or a scheduler round's in bulk), claim, finish, retry, recover, give back,
cancel and retry-failed all live here, so the rules a job row follows are read in one place.
Every transition of a claimed job is conditional on the row still being the claimer's, so a
worker that lost a job (recovered by another, cancelled) can never overwrite it. Raw
PostgreSQL statements come from ``sql.py``; other databases go through the ORM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Q, QuerySet, Value
from django.db.models.functions import Concat, Now

from . import clock, sql
from .conf import Settings, get_settings
from .db import copy_rows, dumps, instant_texts, json_rows
from .listener import notify
from .models import Job, JobStatus, Node

if TYPE_CHECKING:
    from .registry import JobHandle

#: key -> (job id, created)
Enqueued = dict[str, tuple[int, bool]]

FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
#: Orphaned jobs recovered per pass; the rest wait for the next pass.
RECOVER_BATCH = 1000


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """``created`` is False when a job with this key already existed; ``job_id`` is that job."""

    created: bool
    job_id: int
    key: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """How many jobs of dead workers went back to the queue, and how many ended failed."""

    requeued: int
    failed: int
    jobs: tuple[int, ...] = ()


# -- new rows -------------------------------------------------------------------------------------


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
    config: Settings | None = None,
) -> dict[str, Any]:
    """The fields of a new job row, with the defaults the job and the settings give.

    ``config``: the settings, read once by a caller that builds many rows.
    """
    config = config or get_settings()
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


def insert_many(jobs: Sequence[Job], using: str = DEFAULT_DB_ALIAS) -> Enqueued:
    """Insert ``jobs`` through the ORM, skipping keys that exist; ``{key: (id, created)}``.

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


class Rows(Protocol):
    """Rows that know their count and may be made as they are read (a round's 10,000 need
    not all exist at once). Reading them twice makes them twice."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[dict[str, Any]]: ...


def insert_round(rows: Rows, using: str = DEFAULT_DB_ALIAS) -> Enqueued:
    """A scheduler round's jobs (``job_fields`` dicts), in the caller's transaction.

    On PostgreSQL one COPY writes every row, with ids reserved from the sequence first, inside
    a savepoint; a key that already exists (a watermark moved back by hand) rolls that back to
    one ``INSERT ... ON CONFLICT DO NOTHING`` of the whole round, which reports the existing
    jobs. Elsewhere ``insert_many``. Workers are notified at commit.
    """
    if not len(rows):
        return {}
    queues: set[str] = set()
    if connections[using].vendor != "postgresql":
        jobs = [Job(**row) for row in rows]
        queues.update(job.queue for job in jobs)
        enqueued = insert_many(jobs, using=using)
    else:
        try:
            with transaction.atomic(using=using):
                enqueued = _copy_jobs(rows, queues, using)
        except psycopg.errors.UniqueViolation:
            listed = list(rows)
            queues.update(row["queue"] for row in listed)
            enqueued = _insert_jobs(listed, using)
    notify(queues, using=using)
    return enqueued


def _copy_jobs(rows: Rows, queues: set[str], using: str) -> Enqueued:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.RESERVE_JOB_IDS, [len(rows)])
        ids = [pk for (pk,) in cursor.fetchall()]
    at = instant_texts()
    enqueued: Enqueued = {}

    def copied() -> Iterator[tuple[Any, ...]]:
        for pk, r in zip(ids, rows, strict=True):
            enqueued[r["key"]] = (pk, True)
            queues.add(r["queue"])
            # In the order of sql.JOB_COLUMNS.
            yield (pk, r["name"], r["key"], dumps(r["input"]), JobStatus.QUEUED.value,
                   r["queue"], 0, r["max_attempts"], at(r["run_at"]), at(r["created_at"]), "",
                   r["task"], at(r["occurrence"]), r["catch_up"], r["enqueued_by"], "")  # fmt: skip

    copy_rows(using, sql.COPY_JOBS, copied())
    return enqueued


def _insert_jobs(rows: list[dict[str, Any]], using: str) -> Enqueued:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.INSERT_JOBS, [json_rows(rows)])
        enqueued = {key: (pk, True) for key, pk in cursor.fetchall()}
        existing = [row["key"] for row in rows if row["key"] not in enqueued]
        if existing:
            cursor.execute(sql.EXISTING_JOBS, [existing])
            enqueued.update({key: (pk, False) for key, pk in cursor.fetchall()})
    return enqueued


def ids_of(keys: Iterable[str], using: str = DEFAULT_DB_ALIAS) -> dict[str, int]:
    """The ids of the jobs that hold ``keys`` (missing keys are left out)."""
    wanted = [key for key in keys if key]
    if not wanted:
        return {}
    return dict(Job.objects.using(using).filter(key__in=wanted).values_list("key", "pk"))


# -- the worker's transitions ---------------------------------------------------------------------


def claim(
    *,
    using: str,
    worker: str,
    limit: int,
    now: datetime,
    queues: frozenset[str] | None = None,
) -> list[Job]:
    """Mark up to ``limit`` due jobs running on ``worker``, oldest ``run_at`` first."""
    if limit < 1:
        return []
    if connections[using].vendor == "postgresql":
        params: dict[str, Any] = {"now": now, "limit": limit, "worker": worker}
        if queues is not None:
            params["queues"] = sorted(queues)
        statement = sql.CLAIM_ANY_QUEUE if queues is None else sql.CLAIM_QUEUES
        jobs = list(Job.objects.using(using).raw(statement, params))
        return sorted(jobs, key=lambda job: (job.run_at, job.pk))
    # Without SKIP LOCKED: each row is taken by a conditional update of its own, which only
    # one claimer can win, so a job is never claimed twice even by racing workers.
    rows = Job.objects.using(using)
    due = rows.filter(status=JobStatus.QUEUED, run_at__lte=now)
    if queues is not None:
        due = due.filter(queue__in=sorted(queues))
    ids = list(due.order_by("run_at", "pk").values_list("pk", flat=True)[:limit])
    won = [
        pk
        for pk in ids
        if rows.filter(pk=pk, status=JobStatus.QUEUED).update(
            status=JobStatus.RUNNING,
            attempts=F("attempts") + 1,
            started_at=now,
            finished_at=None,
            worker=worker,
        )
    ]
    return list(rows.filter(pk__in=won).order_by("run_at", "pk"))


def _if_ours(using: str, job_id: int, claimed_by: str, **changes: Any) -> bool:
    rows = Job.objects.using(using).filter(pk=job_id, status=JobStatus.RUNNING, worker=claimed_by)
    return bool(rows.update(**changes))


def succeed(*, using: str, job_id: int, worker: str, now: datetime) -> bool:
    """Running -> succeeded, if the job is still ``worker``'s; False if it is not."""
    return _if_ours(
        using, job_id, worker, status=JobStatus.SUCCEEDED, finished_at=now, last_error=""
    )


def retry(*, using: str, job_id: int, worker: str, run_at: datetime, error: str) -> bool:
    """Running -> queued again at ``run_at``, keeping the error in view until the next try."""
    return _if_ours(
        using, job_id, worker, status=JobStatus.QUEUED, run_at=run_at, last_error=error, worker=""
    )


def fail(*, using: str, job_id: int, worker: str, now: datetime, error: str) -> bool:
    """Running -> failed for good."""
    return _if_ours(
        using, job_id, worker, status=JobStatus.FAILED, finished_at=now, last_error=error
    )


def _requeue_or_fail(
    rows: QuerySet[Job], *, now: datetime, note: Any, exhausted: str
) -> tuple[int, int]:
    """Send ``rows`` back to the queue with their attempts counted; those out of attempts fail.

    Returns how many were requeued and how many failed.
    """
    requeued = rows.filter(attempts__lt=F("max_attempts")).update(
        status=JobStatus.QUEUED, run_at=now, worker="", last_error=note
    )
    failed = rows.filter(attempts__gte=F("max_attempts")).update(
        status=JobStatus.FAILED, finished_at=now, last_error=Concat(note, Value(exhausted))
    )
    return requeued, failed


def recover(*, using: str, stale_after: timedelta, now: datetime) -> Recovered:
    """Return the running jobs of workers that stopped heartbeating to the queue.

    Staleness is judged by the database clock, which every heartbeat is written with. The
    attempt they were on stays counted; a job whose attempts are used up ends ``failed``: it
    kept killing the workers that ran it.
    """
    stale_before = ExpressionWrapper(
        Now() - Value(stale_after, output_field=DurationField()), output_field=DateTimeField()
    )
    alive = Node.objects.using(using).filter(
        role="worker", stopped_at__isnull=True, last_seen_at__gte=stale_before
    )
    orphans = (
        Job.objects.using(using)
        .filter(status=JobStatus.RUNNING)
        .exclude(worker__in=alive.values("node_id"))
    )
    found = list(orphans.values_list("pk", flat=True)[:RECOVER_BATCH])
    if not found:
        return Recovered(0, 0)
    died = Concat(Value("worker "), F("worker"), Value(" stopped heartbeating during this attempt"))
    # Re-checked in the update: a job finished and claimed again by a live worker since the
    # read above is no longer an orphan.
    requeued, failed = _requeue_or_fail(
        orphans.filter(pk__in=found),
        now=now,
        note=died,
        exhausted="; no attempts left: the job kept killing its worker",
    )
    return Recovered(requeued, failed, tuple(found))


def give_back(*, using: str, job_ids: Sequence[int], worker: str, now: datetime) -> None:
    """Jobs a worker abandons (its drain ran out of grace) go back like a dead worker's."""
    if not job_ids:
        return
    ours = Job.objects.using(using).filter(
        pk__in=list(job_ids), status=JobStatus.RUNNING, worker=worker
    )
    note = Value(f"worker {worker} stopped before this attempt finished")
    _requeue_or_fail(ours, now=now, note=note, exhausted="; no attempts left")


# -- what staff do from the admin -----------------------------------------------------------------


def retry_failed(jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
    """Failed -> queued, due now, with a fresh set of attempts; how many moved.

    ``attempts`` goes back to 0, so the job gets its full ``max_attempts`` again and the first
    retry is not delayed by the backoff of the failures before it. ``last_error`` stays until
    the next attempt writes its own, so the reason is still in view.
    """
    failed = jobs.filter(status=JobStatus.FAILED)
    queues = list(failed.values_list("queue", flat=True).distinct())
    count = failed.update(
        status=JobStatus.QUEUED,
        attempts=0,
        run_at=now or clock.now(),
        started_at=None,
        finished_at=None,
        worker="",
    )
    notify(queues, using=jobs.db)
    return count


def cancel_queued(jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
    """Queued -> cancelled; how many moved. A job a worker already claimed is left alone."""
    return jobs.filter(status=JobStatus.QUEUED).update(
        status=JobStatus.CANCELLED, finished_at=now or clock.now()
    )


# -- retention ------------------------------------------------------------------------------------


def finished_before(cutoff: datetime, using: str = DEFAULT_DB_ALIAS) -> QuerySet[Job]:
    """Finished jobs older than ``cutoff``; queued and running ones are never among them."""
    # A job cancelled before it ever ran has no finished_at: its age is its creation.
    old = Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, created_at__lt=cutoff)
    return Job.objects.using(using).filter(old, status__in=FINISHED)
