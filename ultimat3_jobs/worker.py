"""The worker role: threads that run claimed jobs, the claiming loop, drain and stop.

Job rows change only through the job store (``store``); running one attempt and writing how
it ended is ``attempts``'s; the life it shares with the other roles (signals and drain, backoff
while the database is down, LISTEN) comes from ``lifecycle``, its heartbeat from ``nodes``:
this module holds no SQL.

The thread that calls ``run()`` is the dispatcher: it claims jobs in batches sized to the idle
job threads and hands them over. It alone heartbeats and recovers the jobs of dead workers, so
a long job can stall neither. The first SIGTERM stops claiming and waits for the jobs in flight
(bounded by a grace period); the second exits at once.

Claimed is not started: the jobs a claim hands straight to idle threads are marked started by
the claim itself, and a job claimed ahead gets its start mark from the thread that takes it,
before its function runs. Only a started attempt counts when its worker dies. A job this worker
claimed but can no longer account for (a claim, a start mark, a release or an outcome whose
write failed) goes back through ``release_unheld``: a live worker's rows are never recovered by
the others, so none may stay ``running`` without a thread or an outcome here holding it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

from . import clock as default_clock
from . import instruments, nodes, shutdown
from .attempts import (
    REFUSED_ERRORS,
    UNKNOWN_JOB_FIX,
    UNKNOWN_TASK_FIX,
    Attempts,
    Ended,
    Outcome,
    Written,
    died,
    timed_out,
    timeout_of,
)
from .checkins import CheckIns
from .conf import get_settings, stale_after_problem
from .db import cancel_for_dead_clients, cancel_statements, thread_connections
from .errors import JobUnknownError, WorkerLostError
from .lifecycle import (
    BURST_GIVE_UP_AFTER,
    DATABASE_ERRORS,
    UNAVAILABLE_EXIT,
    Backoff,
    Lifecycle,
    database_away,
    drop_broken_connections,
    listen,
    rest_heard,
)
from .listener import Listener
from .logs import emit, failure_fields
from .nodes import RunStatus, new_node_id
from .pool import Child, ChildDied, ChildSetup, ChildTimedOut
from .registry import registry
from .store import ClaimedJob, JobStore, Recovered, StartedTask, store_for

if TYPE_CHECKING:
    from .errors import UltimateError

logger = logging.getLogger("ultimat3_jobs.worker")

#: How long a job this worker does not declare is put off before a worker looks at it again.
UNKNOWN_JOB_RETRY = timedelta(seconds=5)

#: The longest an outcome waits to be written with the next claim; past it, it is written alone.
FLUSH_AFTER = 0.005
#: Outcomes that are written at once, whatever their age.
FLUSH_BATCH = 200

#: Seconds at most between attempts to get a lost LISTEN connection back.
LISTEN_RETRY = 1.0
#: Claimed jobs that may wait for a free thread, unless told otherwise.
DEFAULT_PREFETCH = 100

#: Exit status of a clean stop: every job in flight finished.
CLEAN_EXIT = 0
#: Exit status when the drain ran out of grace and jobs in flight went back to the queue.
ABANDONED_EXIT = shutdown.FORCED_EXIT
#: An error the loop does not handle ended it (the command prints its traceback).
CRASHED_EXIT = 1

Pool = Literal["thread", "process"]
#: Where job functions run: in the worker's threads, or each slot's child process.
POOLS: tuple[Pool, ...] = ("thread", "process")


def claims_ahead(*, waiting: int, running: int, concurrency: int, low_water: int) -> bool:
    """Whether a worker whose last jobs ran short claims a batch ahead: when little work waits
    (``low_water`` or less) and the threads are working through it, or one is idle, so the next
    batch is there before they run dry. Not when nothing waits and every thread is busy: those
    jobs may be long. ``running`` counts the claimed jobs, ``waiting`` included."""
    return waiting <= low_water and (waiting > 0 or running < concurrency)


@dataclass(eq=False)
class _Slot:
    """One of ``concurrency`` job slots: its thread and, in the process pool, its child. In
    the thread pool, the job it runs with a timeout, and when it began and must end (by
    ``time.monotonic()``); ``abandoned`` once the dispatcher timed it out."""

    thread: threading.Thread = field(init=False)
    child: Child | None = None
    job: ClaimedJob | None = None
    #: The job's started row, for a Django Task: a timeout ends its run and tells of it.
    row: StartedTask | None = None
    started: float = 0.0
    deadline: float = 0.0
    abandoned: bool = False
    #: The Django connections of its thread, whose statement a timeout cancels.
    databases: list[Any] = field(default_factory=list)


class Worker:
    """Claims due jobs and runs them in ``concurrency`` threads until stopped.

    ``burst`` returns once nothing is due and nothing runs; ``max_jobs`` stops claiming after
    that many. ``prefetch`` (default ``DEFAULT_PREFETCH``) is how many claimed jobs may wait
    for a free thread, so short jobs are claimed in batches rather than a thread's worth at a
    time. They are claimed ahead only while jobs run short, once little work waits
    (``claims_ahead``); jobs that wait longer than the poll interval, or when a drain begins,
    go back to the queue unrun with their attempt uncounted. Durations default to the
    ``ULTIMAT3_JOBS`` settings; ``clock`` and ``rand`` are injectable for tests, and ``store``
    (default: ``store_for(using)``) too.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        prefetch: int | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: timedelta | None = None,
        heartbeat_interval: timedelta | None = None,
        stale_after: timedelta | None = None,
        drain_grace: timedelta | None = None,
        backoff_base: float | None = None,
        backoff_max: timedelta | None = None,
        listen: bool = True,
        using: str = DEFAULT_DB_ALIAS,
        node_id: str | None = None,
        clock: Callable[[], datetime] | None = None,
        rand: Callable[[], float] | None = None,
        drain_on_shutdown: bool = True,
        store: JobStore | None = None,
        checkins: CheckIns | None = None,
        pool: Pool = "thread",
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        max_abandoned_threads: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if prefetch is not None and prefetch < 0:
            raise ValueError(f"prefetch must be at least 0, not {prefetch}")
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, not {max_jobs}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
        config = get_settings()
        # A start mark is a statement of its own: one left waiting when this process dies must
        # not land after it.
        cancel_for_dead_clients()
        self.pool = pool
        self.max_jobs_per_child = max_jobs_per_child
        self.max_memory_per_child = max_memory_per_child
        self.max_abandoned_threads = max_abandoned_threads or config.max_abandoned_threads
        self.queues = frozenset(queues) if queues else None
        self.concurrency = concurrency
        self.prefetch = DEFAULT_PREFETCH if prefetch is None else prefetch
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = poll_interval or config.worker_poll_interval
        self.heartbeat_interval = heartbeat_interval or config.heartbeat_interval
        self.stale_after = stale_after or config.worker_stale_after
        self.drain_grace = drain_grace if drain_grace is not None else config.worker_drain_grace
        self.backoff_base = backoff_base if backoff_base is not None else config.retry_backoff_base
        self.backoff_max = backoff_max or config.retry_backoff_max
        self.listen = listen
        self.using = using
        self.store = store or store_for(using)
        #: Sentry check-ins closed by the jobs this worker ends (``checkins``).
        self.checkins = checkins or CheckIns(using=using, store=self.store)
        self.node_id = node_id or new_node_id()
        self.clock = clock or default_clock.now
        self.rand = rand or random.random
        self._low_water = self.prefetch // 2
        # Jobs are claimed ahead only while the last ones ran short enough for the threads to
        # work through a batch in half a poll interval; past that, waiting jobs go back.
        self._short_ms = (
            self.poll_interval.total_seconds() * 1000 * concurrency / (2 * max(self.prefetch, 1))
        )
        problem = stale_after_problem(self.stale_after, self.heartbeat_interval)
        if problem is not None:
            raise problem
        self.life = Lifecycle("jobs.worker", drain_on_shutdown=drain_on_shutdown)
        self.node = nodes.Heartbeat(
            using=using,
            node_id=self.node_id,
            role="worker",
            every=self.heartbeat_interval,
            clock=self.clock,
            skew_warning=config.clock_skew_warning,
        )
        #: How far this worker's clock ran ahead of the database's at its last heartbeat:
        #: its claims take what is due less that (``_claim_now``).
        self._ahead = timedelta(0)
        self.exit_code: int | None = None
        self.last_error = ""
        #: Jobs claimed since ``run()`` started (those given back unrun are taken off).
        self.claimed = 0
        self._abandoned = threading.Event()
        #: The drain gave up and the process pool's children were killed: their threads
        #: leave without a word, their jobs given back already.
        self._leaving = threading.Event()
        #: Runs the attempts, writes and reports how they ended.
        self.attempts = Attempts(
            store=self.store,
            node_id=self.node_id,
            clock=self.clock,
            rand=self.rand,
            backoff_base=self.backoff_base,
            backoff_max=self.backoff_max,
            retry_every=self.poll_interval,
            abandoned=self._abandoned,
            checkins=self.checkins,
        )
        self._lock = threading.Lock()
        self._in_flight: dict[int, ClaimedJob] = {}
        #: Attempts that ran and whose outcome is not written yet; the dispatcher writes them
        #: with its next claim, so a busy worker spends one statement per turn of its loop.
        self._pending: list[Ended] = []
        # SimpleQueue: its put and get are C, without the Condition that queue.Queue takes
        # and notifies per job.
        self._inbox: queue.SimpleQueue[ClaimedJob | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: The job slots, one per thread; in the thread pool, those whose job has a timeout.
        self._slots: list[_Slot] = []
        self._timed: set[_Slot] = set()
        self._next_deadline = float("inf")
        #: Threads left running a job past its timeout (the thread pool cannot kill them).
        self._stuck: list[threading.Thread] = []
        #: Seconds each job name may run (None: no limit), resolved once per name.
        self._timeouts: dict[tuple[str, str], float | None] = {}
        #: Why each Django Task this worker was handed cannot be imported here (None: it can).
        self._tasks_missing: dict[str, str | None] = {}
        self._handed_at = 0.0
        self._pending_since = 0.0
        self._short = True
        #: Rows may be running as ours with nothing here holding them: a claim failed (it may
        #: have committed with its answer lost), or a start mark, a release or an outcome's
        #: write did (see ``_let_go``). The next turn calls ``release_unheld``.
        self._unsure = False
        #: Of those, the jobs whose function ran: their attempt stays counted.
        self._lost: set[int] = set()
        #: The error a burst gave up on (``run_worker --burst``'s failure says it).
        self.gave_up: BaseException | None = None
        self._crashed = False
        self._listener: Listener | None = None

    @property
    def status(self) -> RunStatus:
        """Where the worker is in its life: idle, running, draining, stopped."""
        return self.life.status

    @property
    def outcomes(self) -> dict[Outcome, int]:
        """How the attempts that ended since ``run()`` started ended, by outcome."""
        return self.attempts.outcomes

    # -- the job table ----------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Record that this node is alive, by the database clock that judges staleness; and,
        draining, that it takes no more jobs (``jobs_status --check`` reads it)."""
        draining = f"{nodes.DRAINING} ({self.life.reason})" if self.life.draining.is_set() else ""
        skew_ms = self.node.compare_clocks()
        self._ahead = timedelta(milliseconds=max(skew_ms, 0))
        self.node.beat(last_error=self.last_error or draining, clock_skew_ms=skew_ms)

    def _claim_now(self) -> datetime:
        """The instant a claim takes due jobs at: this worker's clock, less how far it ran
        ahead of the database's at the last heartbeat. A job is never run before its
        ``run_at`` on the database's clock (an occurrence a backfill enqueued ahead, a retry's
        backoff, a Django Task's ``run_after``); a worker behind it runs them late."""
        now = self.clock()
        return now - self._ahead if self._ahead else now

    def _heartbeat_tried(self) -> None:
        """``heartbeat`` while the loop backs off from a claim that failed with the database
        up (a lock, a statement timeout): the node is alive. One that fails is the next
        pass's to meet."""
        with contextlib.suppress(*DATABASE_ERRORS):
            self.heartbeat()

    def recover(self) -> Recovered:
        """Return the running jobs of workers that stopped heartbeating to the queue."""
        recovered = self.store.recover(stale_after=self.stale_after, now=self.clock())
        if recovered.jobs:
            emit(
                logger,
                "jobs.worker.recovered",
                logging.WARNING,
                requeued=recovered.requeued,
                failed=recovered.failed,
                released=recovered.released,
                jobs=list(recovered.jobs),
                code=WorkerLostError.code,
                fix=WorkerLostError.FIX,
            )
        if recovered.failed:
            instruments.recovered_failed(recovered.failed_jobs)
            self._tell_lost(recovered.jobs)
        return recovered

    def _tell_lost(self, job_ids: Sequence[int]) -> None:
        """Jobs a lost worker's end (a dead one's recovery, a drain out of grace, a release of
        jobs whose outcome was never written) may have failed, out of attempts: their Sentry
        occurrences close, and ``task_finished`` is sent for the Django Tasks among them (none
        without the framework installed: then no such row is ours to run)."""
        self.checkins.ended((job_id, None) for job_id in job_ids)
        try:
            from .backends import finished_lost
        except ImportError:
            return
        finished_lost(job_ids, using=self.store.using)

    # -- threads ----------------------------------------------------------------------------

    def _job_thread(self, slot: _Slot) -> None:
        slot.databases = thread_connections()
        try:
            if slot.child is not None:
                # Ready before the first job: a child takes a while to start. One that cannot
                # is tried again, and told of, by the first job's ``_take``.
                with contextlib.suppress(ChildDied):
                    slot.child.ensure()
            while True:
                try:
                    job = self._inbox.get(timeout=self.poll_interval.total_seconds())
                except queue.Empty:
                    # Idle: let Django's rules (CONN_MAX_AGE) close the connection, as the end
                    # of a request would. Closing it after every job instead would open a new
                    # connection per job while busy.
                    close_old_connections()
                    continue
                if job is None:
                    return
                try:
                    drop_broken_connections()
                    self._take(job, slot)
                except Exception as error:
                    if slot.abandoned:
                        return
                    # Whether it ran or not, nothing here accounts for it any more.
                    self._let_go(job, error, ran=True)
                finally:
                    with self._lock:
                        if not slot.abandoned:
                            self._in_flight.pop(job.id, None)
                if slot.abandoned:
                    # Timed out and replaced: what the job did after its timeout is dropped.
                    emit(logger, "jobs.worker.thread-returned", logging.WARNING, job=job.id)
                    return
        finally:
            if slot.child is not None:
                slot.child.stop()
            connections.close_all()

    def _timeout_of(self, job: ClaimedJob) -> float | None:
        name = (job.name, job.backend)
        if name not in self._timeouts:
            self._timeouts[name] = timeout_of(job.name, backend=job.backend)
        return self._timeouts[name]

    def _take(self, job: ClaimedJob, slot: _Slot) -> None:
        """Start one job a thread took from the inbox, run it, and hand over how it ended."""
        # A @job's input that is no object (written by SQL) raises the same at every attempt.
        if job.unreadable or not (job.backend or isinstance(job.input, dict)):
            self._hand_in(self.attempts.unreadable(job))
            return
        if job.backend:
            missing = self._task_missing(job.name)
            # Past its grace it runs, and fails with what its import raises.
            if missing is not None and self._put_off_unknown(job, missing):
                return
        elif registry.get_job(job.name) is None:
            if not self._put_off_unknown(job, None):
                grace = get_settings().unknown_job_grace
                self._hand_in(self.attempts.unknown(job, time.monotonic(), grace))
            return
        if slot.child is not None:
            try:
                slot.child.ensure()  # A replaced child starts before the job is marked started.
            except ChildDied as death:
                emit(
                    logger,
                    "jobs.worker.child-start-failed",
                    logging.ERROR,
                    job=job.id,
                    exit_code=death.exit_code,
                )
                # Never started: it goes back uncounted, for a slot whose child can run it.
                self._let_go(job, None, ran=False)
                return
        try:
            started = self.attempts.start(job)
        except DATABASE_ERRORS as error:
            # Not run, and maybe marked started: it goes back uncounted.
            self._let_go(job, error, ran=False)
            return
        if started is False:
            self.attempts.lost(job)
            self.life.wake.set()
            return
        timeout = self._timeout_of(job)
        if slot.child is not None:
            self._run_in_child(job, slot, None if started is True else started, timeout)
            return
        if timeout is not None:
            # The dispatcher watches the deadline: this thread may never come back from the job.
            with self._lock:
                slot.job, slot.started = job, time.monotonic()
                slot.row = None if started is True else started
                slot.deadline = slot.started + timeout
                self._timed.add(slot)
                sooner = slot.deadline < self._next_deadline
            if sooner:
                self.life.wake.set()  # The dispatcher sleeps past this deadline otherwise.
        ended = self.attempts.run(job) if started is True else self.attempts.run_task(job, started)
        if self._done(slot):
            self._hand_in(ended)

    def _task_missing(self, name: str) -> str | None:
        """Why the Django Task at ``name`` cannot be imported in this worker, None if it can.
        Only an ``ImportError`` says the code is not here; a module that raises anything else
        is here and broken, and its run fails with what it raises."""
        if name not in self._tasks_missing:
            why = None
            try:
                from .backends import load_task

                load_task(name)
            except ImportError as error:
                why = f"{type(error).__name__}: {error}"
            except Exception:  # Here and broken: its run fails with what it raises.
                pass
            self._tasks_missing[name] = why
        return self._tasks_missing[name]

    def _put_off_unknown(self, job: ClaimedJob, missing: str | None) -> bool:
        """A @job this worker does not declare (``missing`` None), or a Django Task it cannot
        import (``missing`` says why), waits, unrun and uncounted, for a worker that has its
        code (one of the new release, in a rolling deploy): looked at again every
        ``UNKNOWN_JOB_RETRY``. False once ``UNKNOWN_JOB_GRACE`` has passed since the first
        worker that did not have it: the caller then fails it."""
        now = self.clock()
        grace = get_settings().unknown_job_grace
        if missing is None:
            what = f'job "{job.name}" is not declared in worker {self.node_id}'
            fix = UNKNOWN_JOB_FIX
        else:
            what = f'task "{job.name}" cannot be imported in worker {self.node_id} ({missing})'
            fix = UNKNOWN_TASK_FIX
        note = (
            f"{what}; waiting for a worker that has it, at most UNKNOWN_JOB_GRACE "
            f"({grace.total_seconds():g} s) from the first worker that did not"
        )
        try:
            waiting = self.store.put_off_unknown(
                job,
                worker=self.node_id,
                now=now,
                until=now + UNKNOWN_JOB_RETRY,
                grace=grace,
                note=note,
            )
        except DATABASE_ERRORS as error:
            self._let_go(job, error, ran=False)
            return True
        if waiting:
            emit(
                logger,
                "jobs.worker.job-unknown-waiting",
                logging.WARNING,
                job=job.id,
                name=job.name,
                grace=grace.total_seconds(),
                code=JobUnknownError.code,
                fix=fix,
            )
        return waiting

    def _done(self, slot: _Slot) -> bool:
        """The slot's job returned; False if the dispatcher timed it out meanwhile (the
        thread is abandoned: its outcome is dropped, a fresh thread has the slot)."""
        with self._lock:
            if slot.abandoned:
                return False
            self._timed.discard(slot)
            slot.job = None
            return True

    def _run_in_child(
        self, job: ClaimedJob, slot: _Slot, row: StartedTask | None, timeout: float | None
    ) -> None:
        assert slot.child is not None
        begun = time.monotonic()
        if row is None and registry.get_job(job.name) is None:
            self._hand_in(self.attempts.unknown(job, begun))
            return
        error: UltimateError | None = None
        try:
            reply = slot.child.run(job, row, timeout)
        except ChildTimedOut:
            error = timed_out(timeout or 0.0)
        except ChildDied as death:
            if self._leaving.is_set():
                return  # Killed by the worker on its way out: its job was given back.
            error = died(death.exit_code)
        if error is not None:
            emit(
                logger,
                "jobs.worker.child-replaced",
                logging.WARNING,
                job=job.id,
                name=job.name,
                code=error.code,
            )
            if row is not None:
                self.attempts.end_task(job, row, error, begun)
                self.life.wake.set()
            else:
                self._hand_in(self.attempts.broken_off(job, error, begun))
            return
        if reply.kind == "task":
            # The child wrote it, and logged it; None: every write of it was refused.
            if reply.outcome is None:
                self._let_go(job, None, ran=True)
            else:
                self.attempts.counted(job, reply.outcome, time.monotonic() - begun)
            self.life.wake.set()
        elif reply.kind == "raised":
            self._hand_in(self.attempts.raised(job, reply.text, reply.fields or {}, begun))
        else:
            self._hand_in(self.attempts.succeeded(job, begun))

    def _hand_in(self, ended: Ended) -> None:
        """An attempt ended: its outcome waits for the dispatcher's next statement."""
        job = ended.job
        wake = False
        with self._lock:
            self._in_flight.pop(job.id, None)
            late = self._abandoned.is_set()
            if not late:
                if not self._pending:
                    self._pending_since = time.monotonic()
                    wake = True
                self._pending.append(ended)
        # The dispatcher writes outcomes with its next claim: wake it when it may claim (little
        # work left waiting) and for the first outcome, whose age starts its flush timer.
        if wake or self._inbox.qsize() <= self._low_water:
            self.life.wake.set()
        if late:
            # The drain gave up and nobody writes for us: the row went back to the queue, so
            # this write only confirms the attempt was lost.
            self.attempts.report_all(self.attempts.record([ended]))

    def _expire(self) -> float:
        """End the thread pool's jobs past their timeout (the dispatcher's part); seconds until
        the next deadline (``inf``: none)."""
        now = time.monotonic()
        expired: list[tuple[_Slot, ClaimedJob, StartedTask | None, float, float]] = []
        with self._lock:
            for slot in list(self._timed):
                if slot.deadline <= now and slot.job is not None:
                    timeout = slot.deadline - slot.started
                    expired.append((slot, slot.job, slot.row, slot.started, timeout))
                    slot.abandoned = True
                    self._timed.discard(slot)
                    self._in_flight.pop(slot.job.id, None)
            nearest = min((slot.deadline for slot in self._timed), default=float("inf"))
            self._next_deadline = nearest
        for slot, job, row, begun, timeout in expired:
            # The stuck thread cannot be killed: it is left to itself, a fresh one takes its slot.
            # The statement it waits on, if any, is ended: its locks with its transaction.
            cancel_statements(slot.databases)
            self._stuck = [thread for thread in self._stuck if thread.is_alive()]
            self._stuck.append(slot.thread)
            self._start_slot(self._slots.index(slot))
            stuck = len(self._stuck)
            emit(
                logger,
                "jobs.worker.thread-abandoned",
                logging.WARNING,
                job=job.id,
                name=job.name,
                timeout_s=timeout,
                stuck=stuck,
                max_stuck=self.max_abandoned_threads,
            )
            error = timed_out(timeout)
            if row is not None:
                try:
                    self.attempts.end_task(job, row, error, begun)
                except DATABASE_ERRORS as failure:
                    self._let_go(job, failure, ran=True)
            else:
                self._hand_in(self.attempts.broken_off(job, error, begun))
            if stuck >= self.max_abandoned_threads:
                emit(
                    logger,
                    "jobs.worker.recycling",
                    logging.WARNING,
                    stuck=stuck,
                    fix="find the jobs that hang (jobs.worker.thread-abandoned names them) or "
                    "run them with --pool process, where a timeout kills them",
                )
                self.stop("abandoned-threads", wait=False)
        return max(0.0, nearest - now)

    def _let_go(self, job: ClaimedJob, error: BaseException | None, *, ran: bool) -> None:
        """A job this worker claimed and no longer holds, its row perhaps still running as
        ours: the next turn's ``release_unheld`` puts it back, its attempt counted if ``ran``."""
        if error is not None:
            emit(
                logger,
                "jobs.worker.record-failed",
                logging.ERROR,
                job=job.id,
                **failure_fields(error),
            )
        with self._lock:
            self._in_flight.pop(job.id, None)
            if ran:
                self._lost.add(job.id)
            else:
                self.claimed -= 1
            self._unsure = True
        self.life.wake.set()

    @property
    def listening(self) -> bool:
        """Whether a LISTEN connection is up now (PostgreSQL); polling covers the rest."""
        return self._listener is not None and self._listener.listening.is_set()

    def in_flight(self) -> list[int]:
        """Ids of the jobs this worker is running now."""
        with self._lock:
            return sorted(self._in_flight)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Claim and run jobs until stopped (or, in burst mode, until nothing is due).

        Returns the exit status: ``CLEAN_EXIT`` when every job in flight finished,
        ``ABANDONED_EXIT`` when the drain grace ran out and they went back to the queue.
        """
        self._begin()
        return self._serve()

    def start(self) -> threading.Thread:
        """``run()`` in a thread of its own; ``stop()`` drains it."""
        self._begin()

        def serve() -> None:
            try:
                self._serve()
            finally:
                connections.close_all()

        thread = threading.Thread(target=serve, name="ultimat3-worker", daemon=True)
        thread.start()
        return thread

    def _begin(self) -> None:
        with self._lock:
            if not self.life.begin():
                raise RuntimeError(f"worker {self.node_id} is already running")
            self.exit_code = None
            self.claimed = 0
            self._abandoned.clear()
            self._leaving.clear()
            self.gave_up, self._crashed = None, False

    def stop(self, reason: str = "stop", *, wait: bool = True) -> None:
        """Stop claiming and let the jobs in flight finish, within the drain grace."""
        with self._lock:
            # A worker that is not running has nothing to drain.
            first = self.life.status == "running" and self.life.drain(reason)
            in_flight = len(self._in_flight)
        if first:
            emit(
                logger,
                "jobs.worker.draining",
                reason=reason,
                in_flight=in_flight,
                grace_s=self.drain_grace.total_seconds(),
            )
        self.life.wake.set()
        if wait:
            self.life.wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the worker has stopped; True if it has."""
        return self.life.wait(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job threads to end (abandoned jobs may still be running); True if so."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _serve(self) -> int:
        exit_code = CLEAN_EXIT
        try:
            self._start_up()
            self._loop()
            exit_code = self._settle()
            if self.gave_up is not None and exit_code == CLEAN_EXIT:
                exit_code = UNAVAILABLE_EXIT
        except BaseException:
            # Its stopped line must not say it ended as asked; the error goes on to the caller.
            exit_code, self._crashed = CRASHED_EXIT, True
            raise
        finally:
            self._shut_down(exit_code)
        return exit_code

    def _start_up(self) -> None:
        self.life.hook(self.stop)
        self._slots, self._threads, self._stuck = [], [], []
        self._timed.clear()
        setup = self._child_setup() if self.pool == "process" else None
        for n in range(self.concurrency):
            self._slots.append(_Slot())
            self._threads.append(threading.Thread())
            self._start_slot(n, setup)
        # A burst worker never sleeps waiting for new work, so it has nothing to LISTEN for.
        if self.listen and not self.burst:
            self._listener = listen(
                "worker",
                store=self.store,
                queues=self.queues,
                wake=self.life.wake.set,
                # Reconnect soon even when polling is slow: NOTIFY is what keeps latency low.
                retry_after=min(self.poll_interval.total_seconds(), LISTEN_RETRY),
            )
        emit(
            logger,
            "jobs.worker.started",
            node=self.node_id,
            queues=sorted(self.queues) if self.queues else "all",
            concurrency=self.concurrency,
            pool=self.pool,
            burst=self.burst,
            max_jobs=self.max_jobs,
            listen=self._listener is not None,
        )

    def _start_slot(self, n: int, setup: ChildSetup | None = None) -> None:
        """Slot ``n`` gets a thread (a fresh one for a slot whose thread was abandoned)."""
        child = None
        if setup is not None:
            child = Child(
                setup, max_jobs=self.max_jobs_per_child, max_memory_mb=self.max_memory_per_child
            )
        slot = _Slot(child=child)
        slot.thread = threading.Thread(
            target=self._job_thread, args=(slot,), name=f"ultimat3-job-{n}", daemon=True
        )
        self._slots[n] = slot
        self._threads[n] = slot.thread
        slot.thread.start()

    def _child_setup(self) -> ChildSetup:
        return ChildSetup(
            databases={alias: connections[alias].settings_dict["NAME"] for alias in connections},
            using=self.using,
            node_id=self.node_id,
            backoff_base=self.backoff_base,
            backoff_max_s=self.backoff_max.total_seconds(),
            retry_every_s=self.poll_interval.total_seconds(),
        )

    def _ready_children(self) -> int:
        return sum(1 for slot in self._slots if slot.child is not None and slot.child.ready)

    def child_pids(self) -> list[int]:
        """The process pool's children alive now (tests, logs)."""
        return [pid for slot in self._slots if slot.child and (pid := slot.child.pid) is not None]

    def _loop(self) -> None:
        """Claim while there is room; sleep until a job ends, a NOTIFY, or the poll interval."""
        next_recovery = 0.0
        backoff = Backoff(self.poll_interval)
        # Since when this loop has reached the database without a failure. Another worker's
        # silence counts only once we have watched it that long: after an outage (a restart,
        # a failover) no worker could heartbeat, and the first back must not take the running
        # jobs of the live ones, still backing off, as a dead worker's. A burst worker, which
        # leaves once the queue is empty, cannot wait that out: it recovers from its start.
        stale_s = self.stale_after.total_seconds()
        reachable_since: float | None = time.monotonic() - (stale_s if self.burst else 0.0)
        while not self.life.draining.is_set():
            idle_wait = self.poll_interval.total_seconds()
            try:
                moment = time.monotonic()
                # A connection the server hung up on (a restart) is dropped before the claim
                # meets it, as the job threads do before each job.
                drop_broken_connections()
                if self.node.due():
                    self.heartbeat()
                if (
                    moment >= next_recovery
                    and reachable_since is not None
                    and moment - reachable_since >= stale_s
                ):
                    self.recover()
                    next_recovery = moment + self.heartbeat_interval.total_seconds()
                if self._unsure:
                    self._release_unheld()
                next_deadline = self._expire()
                # Cleared before claiming, so a job ending during the claim still wakes us.
                self.life.wake.clear()
                with self._lock:
                    running = len(self._in_flight)  # Claimed: running or waiting for a thread.
                waiting = self._inbox.qsize()
                room = self.concurrency - running
                if waiting and moment - self._handed_at > self.poll_interval.total_seconds():
                    # Stuck behind long jobs: let other workers run them instead.
                    self._release_waiting()
                elif self._short and claims_ahead(
                    waiting=waiting,
                    running=running,
                    concurrency=self.concurrency,
                    low_water=self._low_water,
                ):
                    room += self.prefetch
                if self.max_jobs is not None:
                    room = min(room, self.max_jobs - self.claimed)
                if self.life.draining.is_set():
                    room = 0
                with self._lock:
                    due = len(self._pending) >= FLUSH_BATCH or (
                        self._pending and moment - self._pending_since >= FLUSH_AFTER
                    )
                    if room > 0 or due:
                        ended, self._pending = self._pending, []
                    else:
                        ended = []
                    flush_in = FLUSH_AFTER if self._pending else idle_wait
                # New jobs that free threads take at once: the claim marks them started. In the
                # process pool, only as many as there are children ready to run them: a slot
                # whose child is starting marks its job itself, once the child is ready.
                free = self.concurrency if self.pool == "thread" else self._ready_children()
                start = max(0, min(room, free - running))
                try:
                    ids, jobs = self.store.finish_and_claim(
                        worker=self.node_id,
                        finishes=[e.finish for e in ended],
                        limit=room,
                        now=self._claim_now(),
                        queues=self.queues,
                        start=start,
                    )
                    written = Written(ids, ended)
                except REFUSED_ERRORS as error:
                    if not ended:
                        raise
                    # A value refused, not the connection: nothing was written or claimed.
                    # One by one, the outcome refused cannot hold the others back.
                    jobs = []
                    try:
                        written = self.attempts.write_each(ended, error)
                    except DATABASE_ERRORS as again:
                        self._keep_pending(ended, again)
                        raise
                except DATABASE_ERRORS as error:
                    self._keep_pending(ended, error)
                    with self._lock:
                        self._unsure = self._unsure or room > 0
                    raise
                self._report(written)
                self._hand_over(jobs)
                backoff.succeeded()
                if reachable_since is None:
                    reachable_since = moment
                self.last_error = ""
            except DATABASE_ERRORS as error:
                reachable_since = None
                fields = backoff.failed(error)
                # Back within half the stale time of the database's return, heartbeating,
                # before any other worker may judge us dead (see reachable_since).
                fields["retry_in"] = min(fields["retry_in"], stale_s / 2)
                self.last_error = str(fields["error"])
                emit(logger, "jobs.worker.loop-failed", logging.ERROR, **fields)
                if self.burst and backoff.failures >= BURST_GIVE_UP_AFTER:
                    self.gave_up = error
                    return
                self.life.wake.clear()
                # Not cut short by a job ending or a NOTIFY: only a drain ends the backoff.
                if database_away(error):
                    self.life.draining.wait(fields["retry_in"])
                else:
                    rest_heard(
                        self.life.draining.wait,
                        fields["retry_in"],
                        self.node,
                        self._heartbeat_tried,
                    )
                continue
            if self.max_jobs is not None and self.claimed >= self.max_jobs:
                return
            if self.burst and not jobs and running == 0 and not self._unsure:
                return
            if room > 0 and len(jobs) == room:
                continue  # Every slot we asked for was filled: more may be due right away.
            woken = self.life.rest(min(idle_wait, self.node.until_due(), flush_in, next_deadline))
            if not woken and running == 0 and not self._pending:
                # A quiet spell: let Django drop a broken or expired connection. Not while busy:
                # under CONN_MAX_AGE=0 that would reconnect after every short rest.
                close_old_connections()

    def _hand_over(self, jobs: list[ClaimedJob]) -> None:
        with self._lock:
            for job in jobs:
                self._in_flight[job.id] = job
            self.claimed += len(jobs)
        if jobs:
            self._handed_at = time.monotonic()
        debug = logger.isEnabledFor(logging.DEBUG)
        for job in jobs:
            if debug:
                emit(logger, "jobs.worker.job-started", logging.DEBUG, job=job.id, name=job.name)
            self._inbox.put(job)

    def _report(self, written: Written) -> None:
        if written.ended:
            self._short = all(one.duration_ms < self._short_ms for one in written.ended)
        self.attempts.report_all(written)
        if written.refused:
            with self._lock:
                self._lost.update(one.job.id for one in written.refused)
                self._unsure = True

    def _release_unheld(self) -> None:
        with self._lock:
            # Cleared first: a thread letting a job go from now on asks for the next pass.
            self._unsure = False
            held = [*self._in_flight, *(e.job.id for e in self._pending)]
            ran = sorted(self._lost)
        try:
            released = self.store.release_unheld(worker=self.node_id, held=held, ran=ran)
        except BaseException:
            with self._lock:
                self._unsure = True
            raise
        with self._lock:
            self._lost.difference_update(ran)
        if released:
            emit(logger, "jobs.worker.released", logging.WARNING, unheld=released)
            if ran:
                self._tell_lost(ran)

    def _keep_pending(self, ended: list[Ended], error: BaseException) -> None:
        """A write failed: its outcomes go back in front, for the next turn to write."""
        if ended:
            self.attempts.record_failed(ended, error)
            with self._lock:
                self._pending[:0] = ended

    def _release_waiting(self) -> None:
        """Put the claimed jobs no thread has started back in the queue, attempt uncounted."""
        waiting: list[ClaimedJob] = []
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._inbox.put(None)  # A thread's stop signal: not ours to take.
                break
            waiting.append(job)
        if not waiting:
            return
        unsure = True
        try:
            released = self.store.release(jobs=waiting, worker=self.node_id)
            unsure = False
        except DATABASE_ERRORS as error:
            # Still ours, maybe, with nothing holding them: the next release_unheld frees them.
            emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
            released = 0
        finally:
            with self._lock:
                for job in waiting:
                    self._in_flight.pop(job.id, None)
                self.claimed -= len(waiting)
                self._unsure = self._unsure or unsure
        emit(logger, "jobs.worker.released", jobs=[job.id for job in waiting], released=released)

    def _flush(self) -> None:
        """Write the outcomes waiting, without claiming (draining, stopping)."""
        with self._lock:
            ended, self._pending = self._pending, []
        if not ended:
            return
        try:
            written = self.attempts.write(ended)
        except DATABASE_ERRORS as error:
            self._keep_pending(ended, error)
            close_old_connections()
            return
        self._report(written)

    def _settle(self) -> int:
        """Wait for the jobs in flight and write their outcomes; past the drain grace, hand the
        unfinished ones back to the queue."""
        if self.life.draining.is_set():
            # Said at once, not at the next heartbeat: a probe then sends no more work here.
            with contextlib.suppress(*DATABASE_ERRORS):
                self.heartbeat()
        while True:
            self.life.wake.clear()
            if self.life.draining.is_set():
                self._release_waiting()
            self._flush()
            if self._unsure:
                try:
                    self._release_unheld()
                except DATABASE_ERRORS as error:
                    emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
            with self._lock:
                busy = bool(self._in_flight)
                if not busy and not self._pending:
                    return CLEAN_EXIT
            next_deadline = self._expire()
            deadline = None
            if self.life.draining.is_set():
                deadline = self.life.drain_started + self.drain_grace.total_seconds()
                if time.monotonic() >= deadline:
                    break
            if self.node.due():
                # Jobs still run: keep them from looking orphaned to the other workers.
                try:
                    self.heartbeat()
                except DATABASE_ERRORS as error:
                    emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
            timeout = self.node.until_due()
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
            # Short waits, so a SIGTERM arriving now starts the grace clock promptly, and an
            # outcome that failed to be written is tried again.
            self.life.rest(min(timeout, 0.5, next_deadline))
        with self._lock:
            # From here a job that ends writes its own outcome (see _job_thread).
            self._abandoned.set()
        self._flush()
        with self._lock:
            left = sorted(self._in_flight)
        if any(slot.child is not None for slot in self._slots):
            # The children still run those jobs: ended before they go back, so another worker
            # never claims one still running here. Their threads leave without a word.
            self._leaving.set()
            for slot in self._slots:
                if slot.child is not None:
                    slot.child.end_now()
        emit(
            logger,
            "jobs.worker.drain-timeout",
            logging.ERROR,
            jobs=left,
            grace_s=self.drain_grace.total_seconds(),
            fix='raise ULTIMAT3_JOBS["WORKER_DRAIN_GRACE"] (and the orchestrator\'s stop '
            "timeout) above your longest job, or split long jobs",
        )
        try:
            self.store.give_back(job_ids=left, worker=self.node_id, now=self.clock())
            self._tell_lost(left)
        except DATABASE_ERRORS as error:
            # The heartbeat stops with us, so the other workers recover them instead.
            emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
        return ABANDONED_EXIT

    def _shut_down(self, exit_code: int) -> None:
        clean = not self._abandoned.is_set()
        for slot in self._slots:
            if slot.child is not None:
                slot.child.cancel()  # A child still starting would hold its thread past the join.
        for _ in self._threads:
            self._inbox.put(None)
        if clean:
            self.join(timeout=5)
        elif self._leaving.is_set():
            # The threads reap the children ended in the drain now, not the interpreter's exit,
            # which would find them still replacing them.
            self.join(timeout=5)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        try:
            self.node.stopped()
        except DATABASE_ERRORS as error:
            emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
        self.checkins.close()
        with self._lock:
            self.exit_code = exit_code
            outcomes = {str(name): count for name, count in self.outcomes.items()}
        emit(
            logger,
            "jobs.worker.stopped",
            reason=self.life.reason
            or (
                "crashed"
                if self._crashed
                else "gave-up"
                if self.gave_up is not None
                else "burst"
                if self.burst
                else "max-jobs"
            ),
            exit_code=exit_code,
            claimed=self.claimed,
            **outcomes,
        )
        self.life.end()


__all__ = ["ABANDONED_EXIT", "CLEAN_EXIT", "UNAVAILABLE_EXIT", "Worker"]
