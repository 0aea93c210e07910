"""The job store on PostgreSQL: the named statements of ``sql.py`` where the ORM would take
more statements or round trips (a round's COPY, the worker's one-statement finish-and-claim,
the relay's ``SKIP LOCKED`` claim), and NOTIFY to wake workers and relays at commit.

Everything else is ``PortableStore``'s, which this store extends.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import psycopg
from django.db import IntegrityError, connections, transaction
from psycopg.types.json import Jsonb

from .. import clock, history
from ..conf import get_settings
from ..db import (
    Ahead,
    copy_rows,
    dumps,
    execute_bound,
    execute_named,
    instant_texts,
    instants_from_microseconds,
    json_rows,
)
from ..listener import NOTIFY_CHANNEL
from ..models import Job
from . import sql
from .columns import (
    KEY,
    QUEUE,
    RELAY,
    copy_row,
    declaration,
    declared,
    job_names,
    scheduled_row,
    wake_payload,
)
from .portable import APP_TABLES, DECLARATIONS_READ, PortableStore
from .values import (
    ClaimedJob,
    ClosedOccurrence,
    Copied,
    DecidedRecord,
    Enqueued,
    Finish,
    FiredOccurrence,
    LockedTask,
    Rows,
    Swapped,
)

if TYPE_CHECKING:
    from ..handles import JobHandle, TaskHandle

#: New tasks per INSERT when their COPY gave way; past one slice, new rows are made in a thread.
SYNC_SLICE = 1000

_T = TypeVar("_T")


class PostgresStore(PortableStore):
    """The job store of the PostgreSQL database ``using`` (see ``JobStore``)."""

    #: New rows NOTIFY the workers of their queue (or the relays), at commit.
    notifies = True

    def _notify(self, payloads: Iterable[str]) -> None:
        names = sorted(set(payloads))
        if not names:
            return
        # Inside a transaction PostgreSQL delivers a NOTIFY at commit.
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.NOTIFY, [NOTIFY_CHANNEL, names])

    def can_stream(self) -> bool:
        # Outside the caller's transaction only: the task functions then run in a thread, on
        # a connection of their own, and would neither see that transaction nor be able to
        # wait on its locks.
        return not connections[self.using].in_atomic_block

    def missing_tables(self) -> list[str]:
        # Each looked up by name, as the statements will find it (on the search path), rather
        # than Django's listing of every table of the schema, which reads catalogs a fresh
        # connection has not read yet: the first statement of every command.
        connection = connections[self.using]
        quoted = [connection.ops.quote_name(table) for table in APP_TABLES]
        with connection.cursor() as cursor:
            cursor.execute(sql.MISSING_TABLES, quoted)
            row = cursor.fetchone()
        return [table for table, absent in zip(APP_TABLES, row or (), strict=True) if absent]

    # -- new jobs ---------------------------------------------------------------------------------

    def enqueue_task(
        self,
        handle: JobHandle,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        run_at: datetime | None,
    ) -> Job:
        fields = self._task_fields(handle, kwargs, run_at=run_at)
        params = {
            **fields,
            "input": json.dumps(kwargs),
            "args": json.dumps(args),
            "channel": NOTIFY_CHANNEL,
        }
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.INSERT_TASK, params)
            row = cursor.fetchone()
        assert row is not None  # The INSERT returns its row.
        job = Job(pk=row[0], **fields)
        job.args = args
        job._state.adding = False
        job._state.db = self.using
        return job

    def insert_round(self, rows: Rows) -> Enqueued:
        """One COPY writes every row, with ids reserved from the sequence first, inside a
        savepoint; a key that already exists (a watermark moved back by hand) rolls that back
        to ``insert_reporting``."""
        if not len(rows):
            return {}
        enqueued = self._copy_new((copy_row(row) for row in rows), len(rows))
        return enqueued if enqueued is not None else self.insert_reporting(list(rows))

    def insert_reporting(self, rows: Sequence[dict[str, Any]]) -> Enqueued:
        """One ``INSERT ... ON CONFLICT DO NOTHING``, then the ids of the keys that existed."""
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.INSERT_JOBS, [json_rows(rows)])
            enqueued = {key: (pk, True) for key, pk in cursor.fetchall()}
            existing = [row["key"] for row in rows if row["key"] not in enqueued]
            if existing:
                cursor.execute(sql.EXISTING_JOBS, [existing])
                enqueued.update({key: (pk, False) for key, pk in cursor.fetchall()})
        self._notify({wake_payload(row["queue"], row.get("relay", "")) for row in rows})
        return enqueued

    def insert_streamed(
        self, fired: Iterable[FiredOccurrence], expected: int, *, now: datetime
    ) -> Enqueued | None:
        """Each row is written as its occurrence comes, in one COPY (see ``_copy_new``), with
        no savepoint: a key that exists spoils the caller's transaction (``JobStore``)."""
        config = get_settings()
        defaults: dict[JobHandle, tuple[str, int, str]] = {}
        rows = (
            scheduled_row(
                p.job, p.data, key=p.key, task=f.task, occurrence=f.occurrence,
                catch_up=f.catch_up, now=now, config=config,
                trace_context=f.trace_context, defaults=defaults,
            )
            for f in fired
            for p in f.jobs
        )  # fmt: skip
        return self._copy_new(rows, expected, savepoint=False)

    def _copy_new(
        self, copied: Iterable[tuple[Any, ...]], expected: int, *, savepoint: bool = True
    ) -> Enqueued | None:
        """Jobs none of whose keys exists (COPY rows but for their ids), in the caller's
        transaction, each row taken as it comes, ``expected`` of them (a streamed round knows
        how many occurrences it fires, not how many jobs their tasks return).

        One COPY writes the first ``expected`` rows with ids reserved before it; the rows past
        them, if any, wait for a second reservation and COPY. None when a key exists: the COPY
        is rolled back to its savepoint and nothing is written; without ``savepoint``, for a
        caller that then rolls its whole transaction back, two round trips fewer. Workers are
        notified at commit.
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
                created[row[KEY]] = pk
                wakes.add(wake_payload(row[QUEUE], row[RELAY]))
                yield (pk, *row)

        def copy_jobs(rows: Iterable[tuple[Any, ...]], ids: list[int]) -> None:
            copy_rows(self.using, sql.COPY_JOBS, with_ids(rows, ids), sql.COPY_JOBS_TYPES)

        try:
            with transaction.atomic(using=self.using, savepoint=savepoint):
                copy_jobs(copied, self._reserve_ids(expected))
                if beyond:
                    copy_jobs(beyond, self._reserve_ids(len(beyond)))
        except psycopg.errors.UniqueViolation:
            return None
        self._notify(wakes)
        return enqueued

    def _reserve_ids(self, count: int) -> list[int]:
        """``count`` ids from the job table's sequence, for rows written by COPY."""
        if count <= 0:
            return []
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.RESERVE_JOB_IDS, [count])
            return [pk for (pk,) in cursor.fetchall()]

    # -- reads ------------------------------------------------------------------------------------

    def _busy_occurrences(self, names: list[str]) -> dict[str, datetime]:
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.BUSY_OCCURRENCES, [names])
            return dict(cursor.fetchall())

    # -- the worker's transitions -----------------------------------------------------------------

    def _finish_and_claim(
        self,
        worker: str,
        finishes: Sequence[Finish],
        limit: int,
        now: datetime | None,
        queues: frozenset[str] | None,
        start: int | None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        """One statement, and one round trip, for the finishes and the claim together; bound
        on the server (``execute_bound``), so prepared where Django's ``prepare_threshold``
        option says so."""
        params: dict[str, Any] = {}
        if limit:
            params.update(_claim_params(worker, limit, now or clock.now(), queues, start))
        if finishes:
            params.update(_finish_params(worker, finishes))
        connection = connections[self.using]
        if not limit:
            return {row[0] for row in execute_bound(self.using, sql.FINISH, params)}, []
        if finishes:
            statement = (
                sql.FINISH_AND_CLAIM_ANY_QUEUE if queues is None else sql.FINISH_AND_CLAIM_QUEUES
            )
        else:
            statement = sql.CLAIM_ANY_QUEUE if queues is None else sql.CLAIM_QUEUES
        # A caller's transaction outlives ours: the settings must not outlive the claim in it.
        inside_caller = connection.in_atomic_block
        with transaction.atomic(using=self.using):
            # Statistics taken while no job was queued (a fresh table, or one holding only
            # history) make the planner expect a few due rows: it then reads every due row and
            # sorts them behind a burst. Without sorts it walks the ready index in order and
            # stops at the limit, whatever the statistics say.
            execute_bound(self.using, sql.CLAIM_PLANNER, ())
            rows = execute_bound(self.using, statement, params)
            if inside_caller:
                execute_bound(self.using, sql.PLANNER_AGAIN, ())
        if not finishes:
            return set(), _claimed_rows(rows)
        written = {row[1] for row in rows if not row[0]}
        jobs = _claimed_rows(row[1:] for row in rows if row[0])
        return written, jobs

    def close_occurrences(
        self, job_ids: Iterable[int], *, tasks: Iterable[str]
    ) -> list[ClosedOccurrence]:
        """One statement (``sql.CLOSE_OCCURRENCES``)."""
        ids, names = list(job_ids), sorted(set(tasks))
        if not ids or not names:
            return []
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.CLOSE_OCCURRENCES, {"ids": ids, "tasks": names})
            return [ClosedOccurrence(*row) for row in cursor.fetchall()]

    def mark_started(self, *, jobs: Sequence[ClaimedJob], worker: str, now: datetime) -> set[int]:
        """One statement, committed without waiting for the disk (see ``sql.MARK_STARTED``):
        on its own, prepared by name in each session (``execute_named``); in a caller's
        transaction, its arrays sent apart from its text (``execute_bound``)."""
        if not jobs:
            return set()
        params = _start_params(jobs, worker, now)
        if connections[self.using].in_atomic_block:
            rows = execute_bound(self.using, sql.MARK_STARTED_IN_CALLER, params)
        else:
            rows = execute_named(self.using, sql.MARK_STARTED_NAMED, params)
        return {pk for (pk,) in rows}

    # -- the relay's outbox -----------------------------------------------------------------------

    def claim_outbox(
        self, *, limit: int, now: datetime, resend: Sequence[str], resend_before: datetime
    ) -> list[Job]:
        if limit < 1:
            return []
        params = {
            "now": now,
            "limit": limit,
            "resend": list(resend),
            "resend_before": resend_before,
        }
        return list(self._jobs().raw(sql.CLAIM_OUTBOX, params))

    # -- occurrence records -----------------------------------------------------------------------

    def write_records(
        self,
        fired: Iterable[FiredOccurrence],
        decided: Iterable[DecidedRecord],
        enqueued: Enqueued,
        *,
        at: datetime,
        node: str,
    ) -> None:
        """One COPY, a fired occurrence's row made without its dict."""

        def rows() -> Iterator[tuple[Any, ...]]:
            for f in fired:
                jobs = [
                    {"job": p.job.name, "key": p.key, "created": enqueued[p.key][1]} for p in f.jobs
                ]
                yield history.fired_copy_row(
                    f.task, f.occurrence, f.catch_up, jobs, at=at, node=node
                )
            for r in decided:
                record = history.decided(
                    r.task, r.outcome, r.span, detail=r.detail, at=at, node=node
                )
                yield history.copy_row(record)

        copy_rows(self.using, sql.COPY_OCCURRENCES, rows(), sql.COPY_OCCURRENCES_TYPES)

    # -- the task table ---------------------------------------------------------------------------

    def _every_declaration(self, expected: int) -> Iterator[Sequence[Any]]:
        # Past a slice's worth of tasks, through a server-side cursor as Django's
        # ``QuerySet.iterator`` reads (unless the database's DISABLE_SERVER_SIDE_CURSORS says
        # not to); fewer are read whole, in one round trip rather than four.
        connection = connections[self.using]
        sliced = expected > DECLARATIONS_READ and not connection.settings_dict.get(
            "DISABLE_SERVER_SIDE_CURSORS"
        )
        with connection.chunked_cursor() if sliced else connection.cursor() as cursor:
            cursor.execute(sql.TASK_DECLARATIONS)
            while True:
                rows = cursor.fetchmany(DECLARATIONS_READ)
                yield from rows
                if len(rows) < DECLARATIONS_READ:
                    return

    def _watermarks(self) -> Callable[[Any], datetime | None]:
        # As ``TASK_DECLARATIONS`` reads the watermark: as ``TASK_STATES`` does.
        return instants_from_microseconds()

    def _update_declarations(self, changed: list[TaskHandle], rearmed: set[str]) -> None:
        """One statement (``sql.UPDATE_DECLARATIONS``): ``bulk_update``'s ``CASE`` per column
        grows with the square of the rows, minutes at 10,000 changed tasks."""
        at = clock.now()
        rows = [
            {
                "name": handle.name,
                **declaration(handle),
                "jobs": job_names(handle, at),
                "rearm": handle.name in rearmed,
            }
            for handle in changed
        ]
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.UPDATE_DECLARATIONS, [dumps(rows)])

    def _insert_tasks(self, handles: Sequence[TaskHandle]) -> None:
        # One COPY, in a savepoint: it takes new tasks far faster than INSERT from JSON
        # (README, "Figures"). COPY cannot leave a row alone, so a name another node
        # wrote since this one read the table rolls it back to the INSERTs, whose ON CONFLICT
        # does. With more than one slice of tasks, their rows are made in a thread (calling
        # every task's function for its job names) while PostgreSQL takes the ones before.
        try:
            with transaction.atomic(using=self.using):
                self._copy_tasks(handles)
        except IntegrityError as error:
            if not isinstance(error.__cause__, psycopg.errors.UniqueViolation):
                raise
            self._insert_task_slices(handles)

    def _copy_tasks(self, handles: Sequence[TaskHandle]) -> None:
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(sql.TRANSACTION_NOW)
            [(now,)] = cursor.fetchall()
        made = _new_task_rows(handles, now.isoformat())
        # As Django's errors: a value the table refuses is a DataError to ``sync_tasks``.
        with _made_for(handles, made) as rows, connection.wrap_database_errors:
            copy_rows(self.using, sql.COPY_TASKS, rows)

    def _insert_task_slices(self, handles: Sequence[TaskHandle]) -> None:
        # In slices: one statement for every new task would hold all their rows and their
        # JSON text at once, the scheduler's peak of memory for the life of the process.
        made = _new_task_slices(handles)
        with (
            _made_for(handles, made, chunk=1, buffered=2) as texts,
            connections[self.using].cursor() as cursor,
        ):
            for text in texts:
                cursor.execute(sql.INSERT_TASKS, [text])

    def _every_task_state(self) -> Iterable[tuple[str, datetime | None, bool]]:
        # By a plain cursor: over every task, the ORM's per-row work is most of the cost.
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.TASK_STATES)
            instant = instants_from_microseconds()
            return [(name, instant(us), paused) for name, us, paused in cursor.fetchall()]

    def swap_watermarks(
        self, watermarks: Mapping[str, tuple[datetime | None, datetime]]
    ) -> Swapped:
        """One statement; a second names a task that moved when they did not all swap."""
        together: dict[tuple[datetime | None, datetime], list[str]] = {}
        for name, pair in watermarks.items():
            group = together.get(pair)
            if group is None:
                together[pair] = [name]
            else:
                group.append(name)
        text = instant_texts()
        rows = [(group, text(old), text(new)) for (old, new), group in together.items()]
        param = Jsonb(rows, orjson.dumps)
        [(swapped, names, through)] = execute_bound(self.using, sql.SWAP_WATERMARKS, [param])
        if swapped == len(watermarks):
            instant = instants_from_microseconds()
            backfilled = {}
            for name, us in zip(names or (), through or (), strict=True):
                at = instant(us)
                if at is not None:
                    backfilled[name] = at
            return Swapped(backfilled=backfilled)
        found = execute_bound(self.using, sql.UNSWAPPED_WATERMARK, [param])
        return Swapped(moved=found[0][0] if found else next(iter(watermarks)))

    def _locked_task(self, name: str) -> LockedTask | None:
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.LOCK_TASK, [name])
            row = cursor.fetchone()
        return None if row is None else LockedTask(*row)

    def set_watermarks(self, watermarks: Mapping[str, datetime]) -> None:
        moved = [{"name": name, "watermark": new} for name, new in watermarks.items()]
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.SET_WATERMARKS, [dumps(moved)])


@contextlib.contextmanager
def _made_for(
    handles: Sequence[TaskHandle], made: Iterable[_T], **options: Any
) -> Iterator[Iterable[_T]]:
    """The rows ``made`` for ``handles`` (calling each task's function for its job names):
    past one slice, by a thread of their own while the statements take the ones before
    (``Ahead`` with ``options``); else all of them first. A function that queries the database
    then never does so on the connection a COPY is under way on."""
    if len(handles) <= SYNC_SLICE:
        yield list(made)
        return
    ahead = Ahead(made, closes_connections=True, **options)
    try:
        yield ahead.rows(0)
    finally:
        ahead.close()


def _new_task_rows(handles: Sequence[TaskHandle], now: str) -> Iterator[tuple[Any, ...]]:
    """``COPY_TASKS``' rows for ``handles``; ``now``: their first sight and sync, as text."""
    for start in range(0, len(handles), SYNC_SLICE):
        at = clock.now()  # Each task's function is called for its jobs' names, at one instant.
        for handle in handles[start : start + SYNC_SLICE]:
            jobs = dumps(job_names(handle, at))
            yield (handle.name, *declared(handle), jobs, False, "", "", True, now, now)


def _new_task_slices(handles: Sequence[TaskHandle]) -> Iterator[str]:
    """``INSERT_TASKS``' rows for ``handles``, ``SYNC_SLICE`` to a statement, as JSON text."""
    for start in range(0, len(handles), SYNC_SLICE):
        at = clock.now()
        rows = [
            {"name": handle.name, **declaration(handle), "jobs": job_names(handle, at)}
            for handle in handles[start : start + SYNC_SLICE]
        ]
        yield dumps(rows)


def _claim_params(
    worker: str, limit: int, now: datetime, queues: frozenset[str] | None, start: int | None
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "now": now,
        "limit": limit,
        "worker": worker,
        "start": limit if start is None else max(start, 0),
    }
    if queues is not None:
        params["queues"] = sorted(queues)
    return params


def _start_params(jobs: Sequence[ClaimedJob], worker: str, now: datetime) -> dict[str, Any]:
    ids, attempts = [job.id for job in jobs], [job.attempts for job in jobs]
    return {"now": now, "ids": ids, "attempts": attempts, "worker": worker}


def _finish_params(worker: str, finishes: Sequence[Finish]) -> dict[str, Any]:
    # Objects keyed as ``sql.FINISH`` reads them. Dicts: orjson writes slotted dataclasses
    # far slower.
    rows = []
    for f in finishes:
        row = {
            "job_id": f.job_id,
            "attempts": f.attempts,
            "status": str(f.status),
            "finished_at": f.finished_at,
            "run_at": f.run_at,
            "error": f.error,
        }
        if f.result is not None:
            row.update(
                task=True,
                return_value=f.result.return_value,
                error_class=f.result.error_class,
                traceback=f.result.traceback,
            )
        rows.append(row)
    return {"worker": worker, "finishes": dumps(rows)}


def _claimed_rows(rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """Claimed rows (``CLAIMED_COLUMNS``, then ``started``) as records, in the claim's order.

    A row that cannot be read comes back ``unreadable``, to be failed alone: raising here
    would leave its whole batch claimed and never run."""
    instant = instants_from_microseconds()
    jobs = []
    for row in rows:
        try:
            jobs.append(_claimed(row, instant))
        except (ValueError, OverflowError, RecursionError) as error:
            why = f"{type(error).__name__}: {error}"
            jobs.append(
                ClaimedJob(
                    row[0], row[1], row[2], {}, row[4], row[5], row[6], UNREADABLE_AT, row[8],
                    row[9], row[10], unreadable=why[:1000],
                )
            )  # fmt: skip
    return sorted(jobs, key=_by_priority_then_due)


#: An unreadable row's ``run_at``: first in its batch, as the earliest due would be.
UNREADABLE_AT = datetime.min.replace(tzinfo=UTC)


def _claimed(row: Sequence[Any], instant: Callable[[int | None], datetime | None]) -> ClaimedJob:
    # Django loads jsonb as text for JSONField to decode; this bypasses the field.
    data, args = row[3], row[11]
    return ClaimedJob(
        row[0], row[1], row[2], json.loads(data) if isinstance(data, str) else data,
        row[4], row[5], row[6], _finite(instant, row[7], "run_at"), row[8], row[9], row[10],
        json.loads(args) if isinstance(args, str) else args,
        # Only a Django Task's run reads it.
        _finite(instant, row[12], "created_at") if row[9] else None,
        instant(row[13]),
    )  # fmt: skip


def _finite(
    instant: Callable[[int | None], datetime | None], value: int | None, column: str
) -> datetime:
    # NOT NULL columns: NULL is an instant the claim could not send.
    found = instant(value)
    if found is None:
        raise ValueError(f"{column} is not an instant of years 1 to 9999 in UTC")
    return found


def _by_priority_then_due(job: ClaimedJob) -> tuple[int, datetime, int]:
    """The claim's order: highest priority first, then the longest due, then the oldest id."""
    return -job.priority, job.run_at, job.id
