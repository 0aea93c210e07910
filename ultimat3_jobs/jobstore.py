"""The job store: the only module where job rows are created or change status.

Enqueue (one job, or a scheduler round's in bulk), claim, finish, retry, recover, give back,
cancel and retry-failed all live here, so the rules a job row follows are read in one place.
Every transition of a claimed job is conditional on the row still being the claimer's, so a
worker that lost a job (recovered by another, cancelled) can never overwrite it. Raw
PostgreSQL statements come from ``sql.py``; other databases go through the ORM.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    Q,
    QuerySet,
    Value,
)
from django.db.models.functions import Concat, Now

from . import clock, sql
from .conf import Settings, get_settings
from .db import copy_rows, dumps, instant_texts, instants_from_microseconds, json_rows
from .handles import EnqueueResult
from .inputs import check_key, check_run_at
from .listener import NOTIFY_CHANNEL, RELAY_PAYLOAD, notify
from .models import Job, JobStatus, Node

if TYPE_CHECKING:
    from .handles import JobHandle

#: key -> (job id, created)
Enqueued = Mapping[str, tuple[int, bool]]

FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
#: Orphaned jobs recovered per pass; the rest wait for the next pass.
RECOVER_BATCH = 1000


class Copied(Mapping[str, tuple[int, bool]]):
    """The jobs one COPY created, ``Enqueued`` without a tuple per job until one is read: at
    10,000 jobs, half a megabyte less for the rest of the round."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __getitem__(self, key: str) -> tuple[int, bool]:
        return self.ids[key], True

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class Recovered:
    """How many jobs of dead workers went back to the queue, and how many ended failed."""

    requeued: int
    failed: int
    jobs: tuple[int, ...] = ()


# -- new rows -------------------------------------------------------------------------------------


def job_fields(
    handle: JobHandle,
    data: dict[str, Any] | orjson.Fragment,
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
    queue, max_attempts, status = _defaults(handle, queue, config)
    return {
        "name": handle.name,
        "key": key,
        "input": data,
        "queue": queue,
        "max_attempts": max_attempts,
        "run_at": run_at or now,
        "created_at": now,
        "task": task,
        "occurrence": occurrence,
        "catch_up": catch_up,
        "enqueued_by": enqueued_by,
        "priority": handle.priority,
        "backend": handle.backend,
        "status": status,
        "relay": handle.relay,
    }


def _defaults(handle: JobHandle, queue: str | None, config: Settings) -> tuple[str, int, str]:
    """A new row's queue, max_attempts and status, from the job and the settings."""
    # A relayed entry is an outbox row: the relay sends it, our worker never claims it.
    status = JobStatus.OUTBOX if handle.relay else JobStatus.QUEUED
    queue = queue or handle.queue or config.default_queue
    return queue, handle.max_attempts or config.max_attempts, status.value


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
    using: str = DEFAULT_DB_ALIAS,
) -> EnqueueResult:
    """Insert one job, or return the one that already holds ``key``.

    The key and ``run_at`` are checked here too, so no caller reaches the table with a value
    it refuses (``InvalidJobKeyError``, ``InvalidRunAtError``).
    """
    check_key(handle.name, key)
    check_run_at(handle.name, run_at)
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
        with transaction.atomic(using=using):
            job.save(force_insert=True, using=using)
            notify([wake_payload(job.queue, job.relay)], using=using)
    except IntegrityError:
        existing = Job.objects.using(using).filter(key=key).values_list("pk", flat=True).first()
        if existing is None:
            raise
        return EnqueueResult(created=False, job_id=existing, key=key)
    return EnqueueResult(created=True, job_id=job.pk, key=key)


def enqueue_task(
    handle: JobHandle,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    run_at: datetime | None,
    using: str = DEFAULT_DB_ALIAS,
) -> Job:
    """Insert one Django Task's row in the caller's transaction: its rollback leaves nothing.

    The key is fresh: the framework has no idempotency key, so every enqueue is a run.
    """
    job = build_job(
        handle,
        kwargs,
        key=f"{handle.name}:{uuid.uuid4().hex}"[-255:],
        run_at=run_at,
        queue=None,
        enqueued_by="code",
        now=clock.now(),
    )
    job.args = args
    if connections[using].vendor != "postgresql":
        job.save(force_insert=True, using=using)
        notify([job.queue], using=using)
        return job
    params = {
        field: getattr(job, field)
        for field in (
            "name",
            "key",
            "queue",
            "max_attempts",
            "run_at",
            "created_at",
            "enqueued_by",
            "priority",
            "backend",
        )
    }
    params.update(input=json.dumps(kwargs), args=json.dumps(args), channel=NOTIFY_CHANNEL)
    with connections[using].cursor() as cursor:
        cursor.execute(sql.INSERT_TASK, params)
        job.pk = cursor.fetchone()[0]
    job._state.adding = False
    job._state.db = using
    return job


def read_task(job_id: int, *, backend: str, using: str = DEFAULT_DB_ALIAS) -> Job | None:
    """The row of a Django Task enqueued through ``backend``; None for any other id."""
    return Job.objects.using(using).filter(pk=job_id, backend=backend).first()


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
    ``insert_reporting``. Elsewhere ``insert_many``. Workers are notified at commit.
    """
    if not len(rows):
        return {}
    if connections[using].vendor != "postgresql":
        jobs = [Job(**row) for row in rows]
        enqueued = insert_many(jobs, using=using)
        notify({wake_payload(job.queue, job.relay) for job in jobs}, using=using)
        return enqueued
    at = instant_texts()
    enqueued_new = insert_new((copy_row(row, at) for row in rows), len(rows), using)
    return enqueued_new if enqueued_new is not None else insert_reporting(list(rows), using)


def insert_reporting(rows: list[dict[str, Any]], using: str = DEFAULT_DB_ALIAS) -> Enqueued:
    """Jobs (``job_fields`` dicts) some of whose keys may exist, on PostgreSQL, in the caller's
    transaction: one ``INSERT ... ON CONFLICT DO NOTHING``, which reports the existing jobs."""
    enqueued = _insert_jobs(rows, using)
    notify({wake_payload(row["queue"], row.get("relay", "")) for row in rows}, using=using)
    return enqueued


def insert_new(
    copied: Iterable[tuple[Any, ...]], expected: int, using: str = DEFAULT_DB_ALIAS
) -> Enqueued | None:
    """Jobs none of whose keys exists (``copy_row`` tuples), on PostgreSQL, in the caller's
    transaction, each row taken as it comes, ``expected`` of them (a streamed round knows how
    many occurrences it fires, not how many jobs their tasks return).

    One COPY writes the first ``expected`` rows with ids reserved before it; the rows past
    them, if any, wait for a second reservation and COPY. None when a key exists: the COPY is
    rolled back to its savepoint and nothing is written; the caller writes the rows again with
    ``insert_reporting``, which then reports the existing jobs. Workers are notified at commit.
    """
    enqueued = Copied()
    created = enqueued.ids
    wakes: set[str] = set()
    beyond: list[tuple[Any, ...]] = []

    def with_ids(rows: Iterable[tuple[Any, ...]], ids: list[int]) -> Iterator[tuple[Any, ...]]:
        free = iter(ids)
        for row in rows:
            pk = next(free, None)
            if pk is None:
                beyond.append(row)
                continue
            created[row[_KEY]] = pk
            wakes.add(wake_payload(row[_QUEUE], row[_RELAY]))
            yield (pk, *row)

    try:
        with transaction.atomic(using=using):
            copy_rows(using, sql.COPY_JOBS, with_ids(copied, _reserve_ids(expected, using)))
            if beyond:
                more = _reserve_ids(len(beyond), using)
                copy_rows(using, sql.COPY_JOBS, with_ids(beyond, more))
    except psycopg.errors.UniqueViolation:
        return None
    notify(wakes, using=using)
    return enqueued


def _reserve_ids(count: int, using: str) -> list[int]:
    """``count`` ids from the job table's sequence, for rows written by COPY."""
    if count <= 0:
        return []
    with connections[using].cursor() as cursor:
        cursor.execute(sql.RESERVE_JOB_IDS, [count])
        return [pk for (pk,) in cursor.fetchall()]


def copy_row(r: dict[str, Any], at: Callable[[datetime | None], str | None]) -> tuple[Any, ...]:
    """A ``job_fields`` dict as a row of ``sql.COPY_JOBS``, but for its id; ``at`` formats
    instants (``db.instant_texts``)."""
    # In the order of sql.JOB_COLUMNS; the defaults are INSERT_JOBS' (a row need not carry
    # status, relay, priority or backend). str(): a status may be a JobStatus.
    return (r["name"], r["key"], dumps(r["input"]), str(r.get("status") or JobStatus.QUEUED),
            r["queue"], 0, r["max_attempts"], at(r["run_at"]), at(r["created_at"]), "",
            r["task"], at(r["occurrence"]), r["catch_up"], r["enqueued_by"], "",
            r.get("priority", 0), r.get("backend", ""), r.get("relay", ""))  # fmt: skip


def scheduled_row(
    handle: JobHandle,
    data: dict[str, Any] | str,
    *,
    key: str,
    task: str,
    occurrence: datetime,
    catch_up: bool,
    now: datetime,
    config: Settings,
    at: Callable[[datetime | None], str | None],
) -> tuple[Any, ...]:
    """``copy_row(job_fields(...))`` of a scheduler round's job, made without the dict (a
    round makes them by the ten thousand): the same defaults, the same columns."""
    queue, max_attempts, status = _defaults(handle, None, config)
    when = at(now)
    text = data if isinstance(data, str) else dumps(data)
    return (handle.name, key, text, status, queue, 0, max_attempts, when, when, "", task,
            at(occurrence), catch_up, "scheduler", "", handle.priority, handle.backend,
            handle.relay)  # fmt: skip


#: Where a key, a queue and a relay sit in a ``copy_row``.
_KEY, _QUEUE, _RELAY = 1, 4, 17


def _insert_jobs(rows: list[dict[str, Any]], using: str) -> Enqueued:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.INSERT_JOBS, [json_rows(rows)])
        enqueued = {key: (pk, True) for key, pk in cursor.fetchall()}
        existing = [row["key"] for row in rows if row["key"] not in enqueued]
        if existing:
            cursor.execute(sql.EXISTING_JOBS, [existing])
            enqueued.update({key: (pk, False) for key, pk in cursor.fetchall()})
    return enqueued


def busy_occurrences(tasks: Iterable[str], using: str = DEFAULT_DB_ALIAS) -> dict[str, datetime]:
    """Per task, the earliest occurrence with a job still queued or running: one statement.

    Only jobs of occurrences count (scheduled or backfilled); a direct or manual enqueue has
    none. Read inside the round's transaction, for the overlap policy.
    """
    names = sorted(set(tasks))
    if not names:
        return {}
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute(sql.BUSY_OCCURRENCES, [names])
            return dict(cursor.fetchall())
    rows = (
        Job.objects.using(using)
        .filter(
            task__in=names,
            status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
            occurrence__isnull=False,
        )
        .values("task")
        .annotate(earliest=Min("occurrence"))
        .order_by()
    )
    return {row["task"]: row["earliest"] for row in rows}


def wake_payload(queue: str, relay: str) -> str:
    """Whom a new row's NOTIFY wakes: the workers of its queue, or the relays."""
    return RELAY_PAYLOAD if relay else queue


def ids_of(keys: Iterable[str], using: str = DEFAULT_DB_ALIAS) -> dict[str, int]:
    """The ids of the jobs that hold ``keys`` (missing keys are left out)."""
    wanted = [key for key in keys if key]
    if not wanted:
        return {}
    return dict(Job.objects.using(using).filter(key__in=wanted).values_list("key", "pk"))


# -- the worker's transitions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker claimed: what running it needs, read in the claim itself.

    A plain record rather than a model instance: a busy worker claims thousands a second.
    """

    id: int
    name: str
    key: str
    input: dict[str, Any]
    queue: str
    #: This attempt's number, counted at claim time.
    attempts: int
    max_attempts: int
    run_at: datetime
    priority: int = 0
    #: The TASKS alias of a Django Task's row (run through ``backends``); empty for a @job.
    backend: str = ""

    @property
    def pk(self) -> int:
        return self.id


def load(*, using: str, job_id: int) -> Job:
    """The whole row of a claimed job, for what needs more than a ``ClaimedJob`` carries."""
    return Job.objects.using(using).get(pk=job_id)


@dataclass(frozen=True, slots=True)
class Finish:
    """How one attempt ended, to be written by ``finish`` (or with the next claim).

    ``status`` is succeeded or failed (``finished_at`` set), or queued for a retry at
    ``run_at``. ``attempts`` names the attempt, so a stale finish never lands on a later one.
    """

    job_id: int
    attempts: int
    status: str
    finished_at: datetime | None = None
    run_at: datetime | None = None
    error: str = ""


def succeeded(job: ClaimedJob, *, now: datetime) -> Finish:
    """Running -> succeeded."""
    return Finish(job.id, job.attempts, JobStatus.SUCCEEDED, finished_at=now)


def retrying(job: ClaimedJob, *, run_at: datetime, error: str) -> Finish:
    """Running -> queued again at ``run_at``, keeping the error in view until the next try."""
    return Finish(job.id, job.attempts, JobStatus.QUEUED, run_at=run_at, error=error)


def failed(job: ClaimedJob, *, now: datetime, error: str) -> Finish:
    """Running -> failed for good."""
    return Finish(job.id, job.attempts, JobStatus.FAILED, finished_at=now, error=error)


def _claim_params(
    worker: str, limit: int, now: datetime, queues: frozenset[str] | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"now": now, "limit": limit, "worker": worker}
    if queues is not None:
        params["queues"] = sorted(queues)
    return params


def _finish_params(worker: str, finishes: Sequence[Finish]) -> dict[str, Any]:
    # Objects keyed as ``sql.FINISH`` reads them. Dicts: orjson writes slotted dataclasses
    # ten times slower.
    rows = [
        {
            "job_id": f.job_id,
            "attempts": f.attempts,
            "status": str(f.status),
            "finished_at": f.finished_at,
            "run_at": f.run_at,
            "error": f.error,
        }
        for f in finishes
    ]
    return {"worker": worker, "finishes": dumps(rows)}


def _claimed_rows(rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """Claimed rows (``sql.CLAIMED_COLUMNS``) as records, in the claim's order."""
    instant = instants_from_microseconds()
    jobs = []
    for row in rows:
        # Django loads jsonb as text for JSONField to decode; this bypasses the field.
        data = row[3]
        run_at = instant(row[7])
        assert run_at is not None  # A NOT NULL column.
        jobs.append(
            ClaimedJob(
                row[0], row[1], row[2], json.loads(data) if isinstance(data, str) else data,
                row[4], row[5], row[6], run_at, *row[8:],
            )
        )  # fmt: skip
    return sorted(jobs, key=_oldest_first)


def claim(
    *,
    using: str,
    worker: str,
    limit: int,
    now: datetime,
    queues: frozenset[str] | None = None,
) -> list[ClaimedJob]:
    """Mark up to ``limit`` due jobs running on ``worker``, oldest ``run_at`` first."""
    return finish_and_claim(
        using=using, worker=worker, finishes=(), limit=limit, now=now, queues=queues
    )[1]


def finish(*, using: str, worker: str, finishes: Sequence[Finish]) -> set[int]:
    """Write how ``finishes`` ended, in one statement; the ids written.

    A finish whose row is no longer ``worker``'s running attempt (recovered by another worker,
    cancelled) is not written and its id is not returned.
    """
    return finish_and_claim(using=using, worker=worker, finishes=finishes, limit=0)[0]


def finish_and_claim(
    *,
    using: str,
    worker: str,
    finishes: Sequence[Finish],
    limit: int,
    now: datetime | None = None,
    queues: frozenset[str] | None = None,
) -> tuple[set[int], list[ClaimedJob]]:
    """Write ``finishes`` and claim up to ``limit`` due jobs, in one round trip on PostgreSQL.

    Returns the ids of the finishes written (see ``finish``) and the jobs claimed, oldest
    ``run_at`` first.
    """
    limit = max(limit, 0)
    if not finishes and not limit:
        return set(), []
    if connections[using].vendor != "postgresql":
        return _finish_and_claim_orm(using, worker, finishes, limit, now, queues)
    params: dict[str, Any] = {}
    if limit:
        params.update(_claim_params(worker, limit, now or clock.now(), queues))
    if finishes:
        params.update(_finish_params(worker, finishes))
    if not limit:
        with connections[using].cursor() as cursor:
            cursor.execute(sql.FINISH, params)
            return {row[0] for row in cursor.fetchall()}, []
    if finishes:
        statement = (
            sql.FINISH_AND_CLAIM_ANY_QUEUE if queues is None else sql.FINISH_AND_CLAIM_QUEUES
        )
    else:
        statement = sql.CLAIM_ANY_QUEUE if queues is None else sql.CLAIM_QUEUES
    # A caller's transaction outlives ours: the setting must not outlive the claim in it.
    inside_caller = connections[using].in_atomic_block
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # Statistics taken while no job was queued (a fresh table, or one holding only
        # history) make the planner expect a few due rows: it then reads every due row and
        # sorts them, 30,000 rows per claim behind a burst. Without sorts it walks the ready
        # index in order and stops at the limit, whatever the statistics say.
        cursor.execute(sql.NO_SORT)
        cursor.execute(statement, params)
        rows = cursor.fetchall()
        if inside_caller:
            cursor.execute(sql.SORT_AGAIN)
    if not finishes:
        return set(), _claimed_rows(rows)
    written = {row[1] for row in rows if not row[0]}
    jobs = _claimed_rows(row[1:] for row in rows if row[0])
    return written, jobs


def _oldest_first(job: ClaimedJob) -> tuple[int, datetime, int]:
    """The claim's order: highest priority first, then the longest due, then the oldest id."""
    return -job.priority, job.run_at, job.id


def _finish_and_claim_orm(
    using: str,
    worker: str,
    finishes: Sequence[Finish],
    limit: int,
    now: datetime | None,
    queues: frozenset[str] | None,
) -> tuple[set[int], list[ClaimedJob]]:
    rows = Job.objects.using(using)
    written = set()
    for done in finishes:
        ours = rows.filter(
            pk=done.job_id, status=JobStatus.RUNNING, worker=worker, attempts=done.attempts
        )
        changes: dict[str, Any] = {
            "status": done.status,
            "finished_at": done.finished_at,
            "last_error": done.error,
        }
        if done.status == JobStatus.QUEUED:
            changes.update(run_at=done.run_at, worker="")
        if ours.update(**changes):
            written.add(done.job_id)
    if not limit:
        return written, []
    now = now or clock.now()
    # Without SKIP LOCKED: each row is taken by a conditional update of its own, which only
    # one claimer can win, so a job is never claimed twice even by racing workers.
    due = rows.filter(status=JobStatus.QUEUED, run_at__lte=now)
    if queues is not None:
        due = due.filter(queue__in=sorted(queues))
    ids = list(due.order_by("-priority", "run_at", "pk").values_list("pk", flat=True)[:limit])
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
    claimed = (
        rows.filter(pk__in=won)
        .order_by("-priority", "run_at", "pk")
        .values_list(*sql.CLAIMED_COLUMNS)
    )
    return written, [ClaimedJob(*row) for row in claimed]


def release(*, using: str, jobs: Sequence[ClaimedJob], worker: str) -> int:
    """Claimed jobs that never started go back to the queue as they were; how many did.

    Their attempt is uncounted, since it never ran; a row no longer ``worker``'s same attempt
    is left alone. Other workers are woken for them.
    """
    if not jobs:
        return 0
    attempt = Q()
    for job in jobs:
        attempt |= Q(pk=job.id, attempts=job.attempts)
    ours = Job.objects.using(using).filter(attempt, status=JobStatus.RUNNING, worker=worker)
    count = ours.update(
        status=JobStatus.QUEUED, attempts=F("attempts") - 1, started_at=None, worker=""
    )
    notify([job.queue for job in jobs], using=using)
    return count


def release_unheld(*, using: str, worker: str, held: Iterable[int]) -> int:
    """Jobs running as ``worker``'s that it does not hold go back to the queue, attempt
    uncounted; how many did.

    After a claim failed with the connection, it may have committed all the same: its jobs
    are ``worker``'s, yet no thread has them, and a live worker's jobs are never recovered.
    """
    ours = Job.objects.using(using).filter(status=JobStatus.RUNNING, worker=worker)
    return ours.exclude(pk__in=list(held)).update(
        status=JobStatus.QUEUED, attempts=F("attempts") - 1, started_at=None, worker=""
    )


def _if_ours(using: str, job_id: int, claimed_by: str, **changes: Any) -> bool:
    rows = Job.objects.using(using).filter(pk=job_id, status=JobStatus.RUNNING, worker=claimed_by)
    return bool(rows.update(**changes))


def task_succeeded(
    *, using: str, job_id: int, worker: str, now: datetime, return_value: Any
) -> bool:
    """A Django Task's run succeeded: running -> succeeded with its JSON return value."""
    return _if_ours(
        using,
        job_id,
        worker,
        status=JobStatus.SUCCEEDED,
        finished_at=now,
        last_error="",
        return_value=return_value,
        # A retried row that failed before succeeds without its earlier error.
        error_class="",
        traceback="",
    )


def task_failed(
    *, using: str, job_id: int, worker: str, now: datetime, error: str, error_class: str, tb: str
) -> bool:
    """A Django Task raised: running -> failed after its one run (the framework never retries)."""
    return _if_ours(
        using,
        job_id,
        worker,
        status=JobStatus.FAILED,
        finished_at=now,
        last_error=error,
        error_class=error_class,
        traceback=tb,
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


# -- the relay's outbox (``relay.py``, ``celery.py``) --------------------------------------------

#: Finished for good: an outbox row in one of these is never sent again.
RELAY_DONE = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def claim_outbox(
    *,
    using: str,
    limit: int,
    now: datetime,
    resend: Sequence[str],
    resend_before: datetime,
) -> list[Job]:
    """Lock up to ``limit`` rows to send, oldest first: outbox rows due by ``now``, and rows of
    the ``resend`` relays handed over before ``resend_before`` and not done since.

    Call it inside the transaction that records them sent; the locks end with it.
    """
    if limit < 1:
        return []
    if connections[using].vendor == "postgresql":
        params = {
            "now": now,
            "limit": limit,
            "resend": list(resend),
            "resend_before": resend_before,
        }
        return list(Job.objects.using(using).raw(sql.CLAIM_OUTBOX, params))
    # Elsewhere one relay at a time: SQLite's write lock serialises whole transactions.
    due = Q(status=JobStatus.OUTBOX, run_at__lte=now) | Q(
        status=JobStatus.RELAYED, relay__in=list(resend), relayed_at__lt=resend_before
    )
    return list(
        Job.objects.using(using).select_for_update().filter(due).order_by("run_at", "pk")[:limit]
    )


def record_relayed(*, using: str, job_id: int, engine_id: str, now: datetime) -> bool:
    """The row was handed to its engine: keep the engine's id and when; count the send.

    A row the engine already reported done (it can run before we record) keeps its status.
    """
    rows = Job.objects.using(using).filter(pk=job_id)
    changed = rows.filter(status=JobStatus.OUTBOX).update(
        status=JobStatus.RELAYED,
        relayed_at=now,
        engine_id=engine_id,
        attempts=F("attempts") + 1,
        last_error="",
    )
    if not changed:
        changed = rows.update(relayed_at=now, engine_id=engine_id, attempts=F("attempts") + 1)
    return bool(changed)


def relay_refused(*, using: str, job_id: int, now: datetime, error: str) -> bool:
    """The row cannot be sent (its task is not known here): failed, with the reason."""
    return bool(
        Job.objects.using(using)
        .filter(pk=job_id, status__in=[JobStatus.OUTBOX, JobStatus.RELAYED])
        .update(status=JobStatus.FAILED, finished_at=now, last_error=error)
    )


def lock_relayed(*, using: str, job_id: int) -> Job | None:
    """The outbox row, locked until the caller's transaction ends (``SELECT ... FOR UPDATE``).

    Two copies of one message wait for each other here, so only one runs the body.
    """
    return Job.objects.using(using).select_for_update().filter(pk=job_id).first()


def relayed_done(
    *,
    using: str,
    job_id: int,
    now: datetime,
    ok: bool = True,
    return_value: Any = None,
    error: str = "",
    engine_id: str = "",
) -> bool:
    """The engine reported the row done: succeeded (or failed) at ``now``, unless it already was."""
    changes: dict[str, Any] = {
        "status": JobStatus.SUCCEEDED if ok else JobStatus.FAILED,
        "done_at": now,
        "finished_at": now,
        "return_value": return_value,
        "last_error": error,
    }
    if engine_id:
        changes["engine_id"] = engine_id
    rows = Job.objects.using(using).filter(pk=job_id, relay__gt="")
    return bool(rows.exclude(status__in=RELAY_DONE).update(**changes))


def relayed_tasks(*, using: str, backends: Sequence[str], after: int, limit: int) -> list[Job]:
    """Relayed Django Task rows of ``backends`` with an id above ``after``, in id order;
    locked (``SKIP LOCKED``) until the caller's transaction ends."""
    rows = Job.objects.using(using).filter(
        relay="tasks", status=JobStatus.RELAYED, backend__in=list(backends), pk__gt=after
    )
    if connections[using].features.has_select_for_update_skip_locked:
        rows = rows.select_for_update(skip_locked=True)
    return list(rows.order_by("pk")[:limit])


def relay_counts(*, using: str, stuck_before: datetime) -> dict[str, int]:
    """Outbox rows by state: waiting, relayed, done, failed, and relayed ones not done since
    ``stuck_before`` (stuck)."""
    rows = Job.objects.using(using).exclude(relay="")
    grouped = rows.order_by().values("status").annotate(n=Count("pk"))
    by_status = {row["status"]: row["n"] for row in grouped}
    return {
        "outbox": by_status.get(JobStatus.OUTBOX, 0),
        "relayed": by_status.get(JobStatus.RELAYED, 0),
        "done": by_status.get(JobStatus.SUCCEEDED, 0),
        "failed": by_status.get(JobStatus.FAILED, 0),
        "stuck": stuck_relayed(using=using, before=stuck_before),
    }


def stuck_relayed(*, using: str, before: datetime) -> int:
    """Relayed Celery rows handed over before ``before`` and not reported done since.

    Only Celery reports done; another Tasks backend's row is done when its ``enqueue()`` ran it.
    """
    return (
        Job.objects.using(using)
        .filter(status=JobStatus.RELAYED, relay__startswith="celery", relayed_at__lt=before)
        .count()
    )


# -- what staff do from the admin -----------------------------------------------------------------


def retry_failed(jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
    """Failed -> queued, due now, with a fresh set of attempts; how many moved.

    ``attempts`` goes back to 0, so the job gets its full ``max_attempts`` again and the first
    retry is not delayed by the backoff of the failures before it. ``last_error`` stays until
    the next attempt writes its own, so the reason is still in view.
    """
    failed = jobs.filter(status=JobStatus.FAILED)
    queues = list(failed.values_list("queue", "relay").distinct())
    changes: dict[str, Any] = {
        "attempts": 0,
        "run_at": now or clock.now(),
        "started_at": None,
        "finished_at": None,
        "worker": "",
    }
    count = failed.filter(relay="").update(status=JobStatus.QUEUED, **changes)
    # A relayed job goes back to the outbox, to be sent to its engine again.
    count += failed.exclude(relay="").update(
        status=JobStatus.OUTBOX, relayed_at=None, done_at=None, **changes
    )
    notify([wake_payload(queue, relay) for queue, relay in queues], using=jobs.db)
    return count


def cancel_queued(jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
    """Queued (or unsent outbox) -> cancelled; how many moved. A claimed job is left alone."""
    return jobs.filter(status__in=[JobStatus.QUEUED, JobStatus.OUTBOX]).update(
        status=JobStatus.CANCELLED, finished_at=now or clock.now()
    )


# -- retention ------------------------------------------------------------------------------------


def finished_before(cutoff: datetime, using: str = DEFAULT_DB_ALIAS) -> QuerySet[Job]:
    """Finished jobs older than ``cutoff``; queued and running ones are never among them."""
    # A job cancelled before it ever ran has no finished_at: its age is its creation.
    old = Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, created_at__lt=cutoff)
    return Job.objects.using(using).filter(old, status__in=FINISHED)
