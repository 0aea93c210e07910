"""The job store: the one writer of job rows, and of the rows a round writes with them.

Enqueue (one job, or a scheduler round's in bulk), claim, finish, retry, recover, give back,
relay, cancel, retry-failed, delete and prune all go through a ``JobStore``, so the rules a
job row follows are read in one place. Each database alias has one, chosen once by
``store_for``: ``PostgresStore`` (``postgres.py``, named statements from ``sql.py``) on
PostgreSQL, ``PortableStore`` (``portable.py``, the ORM) elsewhere. The roles (scheduler state,
worker, relay, backfill, manual runs, retention, the admin) take a store, defaulting to
``store_for(using)``, so a test can hand them another.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.core.signals import setting_changed
from django.db import connections

from ..db import app_database
from .columns import started_task
from .portable import PortableStore
from .postgres import PostgresStore
from .values import (
    BUSY,
    CANCELLABLE,
    FINISHED,
    ClaimedJob,
    ClosedOccurrence,
    Copied,
    DecidedRecord,
    Enqueued,
    EnqueueResult,
    Finish,
    FiredOccurrence,
    LockedTask,
    Progress,
    Recovered,
    Rows,
    ScheduledJob,
    StartedTask,
    Swapped,
    Synced,
    TaskResultColumns,
    TaskState,
)

if TYPE_CHECKING:
    from collections.abc import Collection

    from django.db.models import QuerySet

    from ..handles import JobHandle, TaskHandle
    from ..history import HistoryEntry
    from ..models import Job, Occurrence, Task


class JobStore(Protocol):
    """Every read and write of job rows the app makes, and the round's writes beside them.

    Every method runs on the store's database, in the caller's transaction when there is one.
    Transitions of a claimed job are conditional on the row still being the claimer's: a
    worker that lost a job (recovered by another, cancelled) never overwrites it.
    """

    #: The database alias.
    using: str
    #: Whether a new row wakes LISTENing workers and relays (NOTIFY, at commit); elsewhere
    #: they poll.
    notifies: bool

    def can_stream(self) -> bool:
        """Whether ``insert_streamed`` may write a round while its rows are still being made
        in another thread (a connection of its own): PostgreSQL, outside a caller's
        transaction."""
        ...

    def missing_tables(self) -> list[str]:
        """The app's tables (the task and job tables) the database lacks: not migrated."""
        ...

    # -- new jobs ---------------------------------------------------------------------------------

    def enqueue(
        self,
        handle: JobHandle,
        data: dict[str, Any],
        *,
        key: str,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
        task: str = "",
    ) -> EnqueueResult:
        """Insert one job, or return the one that already holds ``key``.

        The key and ``run_at`` are checked here too, so no caller reaches the table with a
        value it refuses (``InvalidJobKeyError``, ``InvalidRunAtError``).
        """
        ...

    def enqueue_task(
        self,
        handle: JobHandle,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        run_at: datetime | None,
    ) -> Job:
        """Insert one Django Task's row in the caller's transaction: its rollback leaves nothing.

        The key is fresh: the framework has no idempotency key, so every enqueue is a run.
        """
        ...

    def insert_round(self, rows: Rows) -> Enqueued:
        """A round's or a backfill's jobs (``columns.job_fields`` dicts), in the caller's
        transaction, whatever their count in a constant number of statements; ``{key: (id,
        created)}``: a key that exists keeps its job. Workers are notified at commit."""
        ...

    def insert_reporting(self, rows: Sequence[dict[str, Any]]) -> Enqueued:
        """``insert_round``, for rows some of whose keys are known to exist: what its COPY
        falls back to once it met one."""
        ...

    def insert_streamed(
        self, fired: Iterable[FiredOccurrence], expected: int, *, now: datetime
    ) -> Enqueued | None:
        """The jobs of a round's occurrences, read as they come, ``expected`` occurrences of
        them (a streamed round knows how many it fires, not how many jobs their tasks return),
        in the caller's transaction.

        None when a key exists: nothing is written, and the caller's transaction can only roll
        back (no savepoint is paid for on the way: a round that meets a key is planned again
        and written by ``insert_round``, which reports the existing jobs).
        """
        ...

    # -- reads ------------------------------------------------------------------------------------

    def read_task(self, job_id: int, *, backend: str) -> Job | None:
        """The row of a Django Task enqueued through ``backend``; None for any other id."""
        ...

    def ids_of(self, keys: Iterable[str]) -> dict[str, int]:
        """The ids of the jobs that hold ``keys`` (missing keys are left out)."""
        ...

    def busy_occurrences(self, tasks: Iterable[str]) -> dict[str, datetime]:
        """Per task, the earliest occurrence with a job not done yet (``BUSY``: queued,
        running, or an outbox row not yet reported done by its engine): one statement.

        Only jobs of occurrences count (scheduled or backfilled); a direct or manual enqueue
        has none. Read inside the round's transaction, for the overlap policy.
        """
        ...

    def fired_occurrences(
        self, wanted: Mapping[str, Collection[datetime]]
    ) -> dict[str, set[datetime]]:
        """Per task, those of its ``wanted`` occurrences that already fired: a job of that task
        and occurrence, a fired or manual record of it, or a backfill record with a job of it
        (the record's key names the occurrence). Three statements whatever the count.

        What a backfill does not fire again, and what a round finds a backfill enqueued ahead.
        """
        ...

    def recent_records(
        self, task: str, limit: int, *, jobs_per_record: int | None = None
    ) -> list[HistoryEntry]:
        """The latest ``limit`` occurrence records of ``task``, newest first, with the id of
        each of their jobs that still exists: two queries.

        ``jobs_per_record`` keeps only the first jobs of each record (a backfill has one per
        occurrence), so a page of history never looks up thousands of keys.
        """
        ...

    # -- the worker's transitions -----------------------------------------------------------------

    def claim(
        self,
        *,
        worker: str,
        limit: int,
        now: datetime,
        queues: frozenset[str] | None = None,
        start: int | None = None,
    ) -> list[ClaimedJob]:
        """Mark up to ``limit`` due jobs running on ``worker``: highest priority first, then
        the longest due; the attempt is counted.

        The first ``start`` of them (default: all) are marked started: they go straight to
        idle threads. The others are claimed ahead (``ClaimedJob.started_at`` None) until
        ``mark_started``: a claimed-ahead job whose worker dies goes back with its attempt
        uncounted.
        """
        ...

    def finish(self, *, worker: str, finishes: Sequence[Finish]) -> set[int]:
        """Write how ``finishes`` ended, in one statement on PostgreSQL; the ids written.

        A finish whose row is no longer ``worker``'s running attempt (recovered by another
        worker, cancelled) is not written and its id is not returned.
        """
        ...

    def finish_and_claim(
        self,
        *,
        worker: str,
        finishes: Sequence[Finish],
        limit: int,
        now: datetime | None = None,
        queues: frozenset[str] | None = None,
        start: int | None = None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        """Write ``finishes`` and claim up to ``limit`` due jobs, in one round trip on
        PostgreSQL: the ids of the finishes written (see ``finish``) and the jobs claimed (see
        ``claim``, and its ``start``)."""
        ...

    def mark_started(self, *, jobs: Sequence[ClaimedJob], worker: str, now: datetime) -> set[int]:
        """Claimed-ahead jobs whose functions are about to run: their attempts now count even
        if their worker dies. The ids marked: one left out is no longer ``worker``'s same
        attempt (cancelled, recovered meanwhile) and must not run. One statement for all.

        Committed before it returns (lazily flushed on PostgreSQL: visible at once; a database
        crash may lose it, and the job then runs again uncounted), so a job that kills its
        worker as it starts still uses up its attempts.
        """
        ...

    def release(self, *, jobs: Sequence[ClaimedJob], worker: str) -> int:
        """Claimed jobs that never started go back to the queue as they were (not started);
        how many did.

        Their attempt is uncounted, since it never ran; a row no longer ``worker``'s same
        attempt is left alone. Other workers are woken for them.
        """
        ...

    def release_unheld(self, *, worker: str, held: Iterable[int], ran: Iterable[int] = ()) -> int:
        """Jobs running as ``worker``'s that it does not hold go back to the queue, attempt
        uncounted; those of them in ``ran`` (their function ran, their outcome could not be
        written) keep their attempt: requeued, or failed when it was their last. How many went.

        After a claim failed with the connection, it may have committed all the same: its jobs
        are ``worker``'s, yet no thread has them, and a live worker's jobs are never recovered.
        The same for a start mark, a release or an outcome whose write failed.
        """
        ...

    def recover(self, *, stale_after: timedelta, now: datetime) -> Recovered:
        """Return the running jobs of workers that stopped heartbeating to the queue.

        Staleness is judged by the database clock, which every heartbeat is written with. A
        started attempt stays counted; a job whose attempts are used up ends ``failed``: its
        workers died in each of them. A job claimed ahead that never started goes back
        as it was before the claim, its attempt uncounted (``Recovered.released``). A batch at
        a time; the rest wait for the next.
        """
        ...

    def put_off_unknown(
        self,
        job: ClaimedJob,
        *,
        worker: str,
        now: datetime,
        until: datetime,
        grace: timedelta,
        note: str,
    ) -> bool:
        """Send ``worker``'s claimed ``job``, whose code it does not have, back to the queue
        uncounted and unstarted until ``until`` (``note``, saying why, its ``last_error``),
        unless it has waited ``grace`` since the first worker that did not have it
        (``target_unknown_since``); False then, or when the row is no longer this attempt of
        ``worker``'s."""
        ...

    def give_back(self, *, job_ids: Sequence[int], worker: str, now: datetime) -> None:
        """Jobs a worker abandons (its drain ran out of grace) go back like a dead worker's:
        started ones counted, the others uncounted."""
        ...

    def close_occurrences(
        self, job_ids: Iterable[int], *, tasks: Iterable[str]
    ) -> list[ClosedOccurrence]:
        """The scheduled occurrences of ``job_ids`` (of the monitored ``tasks``) whose jobs have
        all ended (succeeded, failed or cancelled), each returned to one caller alone.

        Call it after the finishes of ``job_ids`` committed, outside a transaction: of the
        workers that end an occurrence's last jobs at once, the last to commit sees them all
        ended, and the unique key on (task, occurrence) closes it once whoever else did.
        """
        ...

    # -- the relay's outbox (``relay.py``, ``celery.py``) ----------------------------------------

    def claim_outbox(
        self, *, limit: int, now: datetime, resend: Sequence[str], resend_before: datetime
    ) -> list[Job]:
        """Lock up to ``limit`` rows to send, oldest first: outbox rows due by ``now``, and rows
        of the ``resend`` relays handed over before ``resend_before`` and not done since (nor
        put off past ``now`` by ``relay_deferred``).

        Call it inside the transaction that records them sent; the locks end with it.
        """
        ...

    def record_relayed(self, *, job_id: int, engine_id: str, now: datetime) -> bool:
        """The row was handed to its engine: keep the engine's id and when; count the send.

        A row the engine already reported done (it can run before we record) keeps its status.
        """
        ...

    def relay_refused(self, *, job_id: int, now: datetime, error: str) -> bool:
        """The row cannot be sent (the engine refused it, or its task stayed unknown here past
        the grace): failed, with the reason."""
        ...

    def relay_deferred(
        self, *, job_id: int, until: datetime, error: str, since: datetime | None
    ) -> bool:
        """This relay cannot send the row now (its task unknown here, or a resend refused): it
        waits, as it is, until ``until`` (its ``run_at``, so the rows behind it are sent
        meanwhile), the reason in its ``last_error``; ``since``, when given, is when the wait
        for its task began (``target_unknown_since``)."""
        ...

    def lock_relayed(self, *, job_id: int) -> Job | None:
        """The outbox row, locked until the caller's transaction ends (``SELECT ... FOR
        UPDATE``). Two copies of one message wait for each other here, so only one runs the
        body."""
        ...

    def relayed_done(
        self,
        *,
        job_id: int,
        now: datetime,
        ok: bool = True,
        return_value: Any = None,
        error: str = "",
        engine_id: str = "",
        name: str = "",
        relay: str | None = None,
    ) -> bool:
        """The engine reported the row done: succeeded (or failed) at ``now``, unless it
        already was (or, given ``relay``, is not a row of that relay).

        What any engine reports is stored: a return value JSON has no form for is dropped, one
        the row cannot keep (NUL, a lone surrogate, over the size) fails the row with
        ``jobs.job.result-unstorable`` instead, and ``error`` is kept storable and bounded.
        ``name`` (the job's) is for that error's message.
        """
        ...

    def relayed_tasks(self, *, backends: Sequence[str], after: int, limit: int) -> list[Job]:
        """Relayed Django Task rows of ``backends`` with an id above ``after``, in id order;
        locked (``SKIP LOCKED`` where the database has it) until the caller's transaction
        ends."""
        ...

    def relay_counts(self, *, stuck_before: datetime) -> dict[str, int]:
        """Outbox rows by state: waiting, relayed, done, failed, and relayed ones not done since
        ``stuck_before`` (stuck)."""
        ...

    def job_counts(
        self, *, stuck_before: datetime
    ) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """Jobs by (status, queue), and ``relay_counts``, from one read of the job table."""
        ...

    def stuck_relayed(self, *, before: datetime) -> int:
        """Relayed Celery rows handed over before ``before`` and not reported done since.

        Only Celery reports done; another Tasks backend's row is done when its ``enqueue()``
        ran it.
        """
        ...

    # -- what staff do from the admin -------------------------------------------------------------

    def retry_failed(self, jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
        """Failed -> queued (a relayed one: back to the outbox), due now, with a fresh set of
        attempts; how many moved.

        ``attempts`` goes back to 0, so the job gets its full ``max_attempts`` again and the
        first retry is not delayed by the backoff of the failures before it. ``last_error``
        stays until the next attempt writes its own, so the reason is still in view.
        """
        ...

    def cancel_queued(self, jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
        """Queued (or unsent outbox) -> cancelled; how many moved. A claimed job is left alone."""
        ...

    def delete_finished(self, jobs: QuerySet[Job]) -> int:
        """Delete those of ``jobs`` that are finished (``FINISHED``), freeing their keys; how
        many went. A queued or running one is left alone."""
        ...

    def delete_removed_tasks(self, tasks: QuerySet[Task]) -> int:
        """Delete those of ``tasks`` no longer declared in code; how many went. A declared one
        is left alone: it would come back at the next scheduler start with no watermark. Their
        occurrence records stay, the audit trail, until pruned."""
        ...

    # -- retention --------------------------------------------------------------------------------

    def prune(
        self,
        cutoff: datetime,
        *,
        batch_size: int,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> tuple[int, int, int]:
        """Delete finished jobs, occurrence records and nodes silent since before ``cutoff``,
        ``batch_size`` rows to a statement; how many of each went (``dry_run``: would go).

        Queued and running jobs are never among them, however old. ``progress`` is told after
        each batch what it deletes and how many of those went so far.
        """
        ...

    # -- occurrence records (``history.py`` gives their shape) -----------------------------------

    def write_records(
        self,
        fired: Iterable[FiredOccurrence],
        decided: Iterable[DecidedRecord],
        enqueued: Enqueued,
        *,
        at: datetime,
        node: str,
    ) -> None:
        """A round's records, in the caller's transaction: one per occurrence fired (with its
        jobs as ``enqueued`` says) and one per record of occurrences decided without firing."""
        ...

    def insert_record(self, row: dict[str, Any]) -> Occurrence:
        """One record (``history.manual``, ``history.backfill``), returned saved."""
        ...

    def pruned_before(self, task: str) -> datetime | None:
        """The latest cutoff of a prune (one recorded, ``history.pruned``, or one the nightly
        prune job of the release before this one ran, which recorded nothing) before which
        what ``task`` fired may have left no trace; None if there is none, or if the task was
        first seen after it (nothing of it was older than the cutoff)."""
        ...

    # -- the task table: declarations and watermarks ---------------------------------------------

    def sync_tasks(self, tasks: Sequence[TaskHandle]) -> Synced:
        """Mirror the declarations in the task table; mark stored tasks no longer declared.

        Returns the tasks whose declaration the database refused (a value past a column's
        limit that slipped past ``@task``): each is tried alone so the others still sync.
        And, unless it added a row, every stored task's state as it read them.
        """
        ...

    def task_states(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        """Watermarks and pauses of ``names`` (None: every stored task), in one read."""
        ...

    def swap_watermarks(
        self, watermarks: Mapping[str, tuple[datetime | None, datetime]]
    ) -> Swapped:
        """Compare-and-set ``{task: (expected, new)}``, locking the rows, in one statement on
        PostgreSQL. ``moved`` is None when every row held its expected watermark and now holds
        the new one, else a task that did not; ``backfilled`` names the tasks a backfill
        enqueued occurrences of past their expected watermark, read under the same locks.

        Call it inside a transaction, and roll that back when a task moved: some rows may have.
        """
        ...

    def set_watermarks(self, watermarks: Mapping[str, datetime]) -> None:
        """Set watermarks without comparing, on rows ``swap_watermarks`` locked in this
        transaction."""
        ...

    def lock_task(self, handle: TaskHandle) -> LockedTask:
        """The row of ``handle``'s task, locked until the caller's transaction ends (``SELECT
        ... FOR UPDATE``), the lock a round's ``swap_watermarks`` takes: the caller waits for a
        round writing that task, and such a round for the caller. A task not mirrored yet gets
        its row first, as ``sync_tasks`` writes it. Call it inside a transaction."""
        ...

    def mark_backfilled(self, task: str, through: datetime) -> None:
        """``Task.backfilled_to`` moves up to ``through``, never down, on the row ``lock_task``
        locked: a backfill enqueued occurrences the scheduler has not reached yet."""
        ...


def store_for(using: str | None = None) -> JobStore:
    """The job store of the database ``using`` (``app_database``'s when None): one per alias,
    chosen by its engine."""
    return _store_of(using or app_database())


@functools.cache
def _store_of(using: str) -> JobStore:
    if connections[using].vendor == "postgresql":
        return PostgresStore(using)
    return PortableStore(using)


def _forget_stores(*, setting: str, **kwargs: Any) -> None:
    # A test that points DATABASES elsewhere gets the stores of those databases.
    if setting == "DATABASES":
        _store_of.cache_clear()


setting_changed.connect(_forget_stores)


def enqueue(
    handle: JobHandle,
    data: dict[str, Any],
    *,
    key: str,
    run_at: datetime | None = None,
    queue: str | None = None,
    enqueued_by: str = "code",
    task: str = "",
    using: str | None = None,
) -> EnqueueResult:
    """``JobStore.enqueue`` on the store of ``using``."""
    return store_for(using).enqueue(
        handle, data, key=key, run_at=run_at, queue=queue, enqueued_by=enqueued_by, task=task
    )


__all__ = [
    "BUSY",
    "CANCELLABLE",
    "FINISHED",
    "ClaimedJob",
    "ClosedOccurrence",
    "Copied",
    "DecidedRecord",
    "EnqueueResult",
    "Enqueued",
    "Finish",
    "FiredOccurrence",
    "JobStore",
    "LockedTask",
    "PortableStore",
    "PostgresStore",
    "Progress",
    "Recovered",
    "Rows",
    "ScheduledJob",
    "StartedTask",
    "Swapped",
    "Synced",
    "TaskResultColumns",
    "TaskState",
    "enqueue",
    "started_task",
    "store_for",
]
