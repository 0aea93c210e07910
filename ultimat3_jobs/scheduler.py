"""The scheduler role: one node walks every task's cron, dispatches what it owes, enqueues jobs.

Exactly one node dispatches per round (a leader election) and one round runs at a time inside
a node: the loop re-arms after the round it just finished, and any other caller of ``tick()``
joins the round in flight rather than opening a second one over the same watermarks.
"""

from __future__ import annotations

import functools
import heapq
import logging
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from . import clock as default_clock
from . import collector, instruments, tracing
from .catchup import Decision
from .checkins import CheckIns
from .conf import get_settings
from .db import Ahead, OwnLockWaits, instant_texts
from .errors import RoundLockWaitError
from .handles import EnqueueResult, TaskHandle, TaskJobResult
from .leaders import LeaderElection, SoleLeader
from .lifecycle import Backoff, Lifecycle, database_away
from .logs import Lines, emit, failure_fields
from .nodes import RunStatus
from .planner import (
    Deferred,
    PlannedOccurrence,
    RoundPlan,
    Streamed,
    TaskStep,
    fire_task,
    plan_task,
)
from .registry import registry
from .state import FencingLost, KeyExisted, SchedulerState, WatermarkMoved
from .store import Enqueued, TaskState

logger = logging.getLogger("ultimat3_jobs.scheduler")
#: One line per task and occurrence (dispatched, armed): a logger of their own, so a site with
#: thousands of tasks can keep the round summaries and silence these.
per_task = logging.getLogger("ultimat3_jobs.scheduler.occurrences")

#: Rounds with this many tasks due, and rebuilds of this many tasks' schedule, run with the
#: cyclic garbage collector paused.
GC_PAUSE_FROM = 1000


#: Rounds firing this many occurrences make their lines in a thread while they commit.
LINES_AHEAD_FROM = 100

#: Rounds with this many tasks due are written while their task functions run.
STREAM_FROM = 100

#: Seconds past an occurrence's instant at which the loop wakes for it.
WAKE_MARGIN = 0.002

#: Schedule answers kept between rounds; the cache starts over when it is full.
RESOLVE_CACHE_SIZE = 65_536


@dataclass(slots=True)
class Dispatched:
    """One occurrence a round fired, with the outcome of each of its jobs."""

    task: str
    occurrence: datetime
    jobs: list[TaskJobResult]
    catch_up: bool


class Report(Sequence[Dispatched]):
    """What a round fired, as ``Dispatched`` made when read: the loop and ``--once`` read
    none of it, and made up front the four objects of each occurrence would all be held at the
    round's peak. Equal to a list of the same ``Dispatched``."""

    __slots__ = ("_enqueued", "_fired")

    def __init__(self, fired: list[PlannedOccurrence], enqueued: Enqueued) -> None:
        self._fired, self._enqueued = fired, enqueued

    def __len__(self) -> int:
        return len(self._fired)

    @typing.overload
    def __getitem__(self, index: int) -> Dispatched: ...
    @typing.overload
    def __getitem__(self, index: slice) -> list[Dispatched]: ...
    def __getitem__(self, index: int | slice) -> Dispatched | list[Dispatched]:
        if isinstance(index, slice):
            return [self._made(fired) for fired in self._fired[index]]
        return self._made(self._fired[index])

    def __iter__(self) -> Iterator[Dispatched]:
        return map(self._made, self._fired)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Report | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def _made(self, fired: PlannedOccurrence) -> Dispatched:
        jobs = []
        for p in fired.jobs:
            job_id, created = self._enqueued[p.key]
            jobs.append(TaskJobResult(p.job.name, EnqueueResult(created, job_id, p.key)))
        return Dispatched(fired.task, fired.occurrence, jobs, fired.catch_up)


NOTHING = Report([], {})


def _counted(
    fired: list[PlannedOccurrence], enqueued: Enqueued
) -> Iterator[tuple[str, datetime, int, int]]:
    """Each occurrence as ``instruments.dispatched`` counts it: task, instant, jobs, created."""
    for f in fired:
        if len(f.jobs) == 1:
            yield f.task, f.occurrence, 1, enqueued[f.jobs[0].key][1]
        else:
            yield f.task, f.occurrence, len(f.jobs), sum(enqueued[p.key][1] for p in f.jobs)


class _Renewal:
    """A lease renewed while a round calls its task functions, at most every ``renew_every``:
    between two tasks, between two occurrences of one (a catch-up), and once all are planned.
    A round that outlives its lease unrenewed is written by no node: its fence finds the
    lease expired, and so does the next round's. Lost to another node, the round writes
    nothing. Never from the thread that fires a streamed round's tasks: the write's fence
    holds the lease's row until it commits."""

    __slots__ = ("at", "error", "every", "leader", "lost")

    def __init__(self, leader: LeaderElection) -> None:
        self.leader = leader
        every = getattr(leader, "renew_every", None)
        self.every = None if every is None else every.total_seconds()
        self.at = time.monotonic()
        self.lost = False
        #: What a renewal raised (the database): the round's failure, not a task's.
        self.error: Exception | None = None

    def held(self) -> bool:
        """Whether the lease is still this node's, renewed first if it is time; False once a
        renewal raised, for the round to raise ``error`` between its tasks."""
        if self.lost or self.every is None or time.monotonic() - self.at <= self.every:
            return not self.lost
        try:
            self.lost = not self.leader.acquire()
        except Exception as error:
            self.error, self.lost = error, True
        self.at = time.monotonic()
        return not self.lost

    def holding(self) -> bool:
        """``held`` between two tasks: a renewal that raised fails the round there."""
        held = self.held()
        if self.error is not None:
            raise self.error
        return held


class Scheduler:
    """Rounds, leadership, drain. State, clock, leader and task list are injected.

    ``state`` is required: production passes a ``DatabaseState``, tests may pass
    ``ultimat3_jobs.testing.MemoryState``.
    """

    def __init__(
        self,
        *,
        state: SchedulerState,
        leader: LeaderElection | None = None,
        clock: Callable[[], datetime] | None = None,
        tasks: Sequence[TaskHandle] | None = None,
        tick_interval: timedelta = timedelta(seconds=1),
        misfire_grace: timedelta = timedelta(seconds=60),
        drain_on_shutdown: bool = True,
        resolver: Callable[[TaskHandle, datetime], datetime] | None = None,
        checkins: CheckIns | None = None,
    ) -> None:
        self.state: SchedulerState = state
        self.leader: LeaderElection = leader or SoleLeader()
        self.clock = clock or default_clock.now
        self.tick_interval = tick_interval
        self.misfire_grace = misfire_grace
        self._fixed_tasks = list(tasks) if tasks is not None else None
        # The default is ``TaskHandle.next_after``, its answers remembered.
        self._resolve = resolver or _cached_next_occurrence()
        # The default resolver depends on a task's schedule, zone and DST options alone, so
        # tasks that share them share one catch-up decision per round.
        self._share_decisions = resolver is None
        self.is_leader = False
        self.life = Lifecycle("jobs.scheduler", drain_on_shutdown=drain_on_shutdown)
        self.last_error = ""
        self._lock = threading.Lock()
        self._round: Future[Report] | None = None
        self._stopping: Future[None] | None = None
        self._thread: threading.Thread | None = None
        #: Set once a run stops: its round watch ends (``_watch``).
        self._unwatched = threading.Event()
        # Next due instant per task, the tasks due at each instant, and a heap of those
        # instants: a round with nothing due pops nothing and touches no task, and tasks that
        # share a schedule share one instant (one heap entry rather than a tuple per task, each
        # popped through comparisons of their names). None until built from the watermarks on
        # taking leadership.
        self._due: dict[str, datetime] | None = None
        #: The instant the last leader round dispatched up to.
        self._round_at: datetime | None = None
        #: How far past ``misfire_grace`` this node's clock was ahead of the database's when
        #: its last round began: rounds plan from the clock less that (``_now``).
        self._ahead = timedelta(0)
        self._due_for: dict[str, TaskHandle] | None = None
        self._synced_for: dict[str, TaskHandle] | None = None
        self._refused: dict[str, Exception] = {}
        self._heap: list[datetime] = []
        self._due_at: dict[datetime, list[str]] = {}
        self._handles_cache: tuple[int, dict[str, TaskHandle]] | None = None
        #: The watermarks ``_rebuild`` read, until the round that rebuilt takes them.
        self._states_read: dict[str, TaskState] | None = None
        #: Sentry check-ins of the occurrences it fires (``checkins``), on the state's database.
        self.checkins = checkins
        if checkins is None and state.using is not None:
            self.checkins = CheckIns(using=state.using, tasks=tasks)
        #: ``time.monotonic()`` when the round in flight began and when the last one ended, and
        #: whether that one failed: what a health probe (``health.py``) reads.
        self.round_began: float | None = None
        self.round_ended: float | None = None
        self.round_failed = False
        #: The election said no in a round of this run: another node leads (``--once``).
        self.refused = False

    @property
    def status(self) -> RunStatus:
        """Where the scheduler is in its life: idle, running, draining, stopped."""
        return self.life.status

    # -- tasks and schedule -------------------------------------------------------------------

    def tasks(self) -> list[TaskHandle]:
        return list(self._handles().values())

    def _handles(self) -> dict[str, TaskHandle]:
        """The tasks by name, rebuilt only when the registry changes."""
        version = -1 if self._fixed_tasks is not None else registry.version
        if self._handles_cache is None or self._handles_cache[0] != version:
            tasks = self._fixed_tasks if self._fixed_tasks is not None else registry.tasks()
            self._handles_cache = (version, {handle.name: handle for handle in tasks})
        return self._handles_cache[1]

    def _set_due(self, name: str, at: datetime) -> None:
        assert self._due is not None
        self._due[name] = at
        names = self._due_at.get(at)
        if names is None:
            self._due_at[at] = [name]
            heapq.heappush(self._heap, at)
        else:
            names.append(name)

    def _rebuild(self, handles: dict[str, TaskHandle]) -> None:
        """Every task's next due instant from the stored watermarks: one read (at a start, the
        sync's own), kept for the round that rebuilt to plan from rather than read again
        (``_states_read``).

        The declarations are mirrored first, at each leadership this node takes (and again if
        they change), here in the loop rather than at start, so a database down at start is
        retried like any other.
        """
        states = None
        if self._synced_for is not handles:
            synced = self.state.sync(list(handles.values()))
            # A declaration the database refused stays out of the schedule, logged; the
            # others dispatch. It is tried again when the declarations change.
            self._refused = dict(synced.refused) if synced is not None else {}
            self._synced_for = handles
            for name, error in self._refused.items():
                self._task_failed(name, None, error)
            # What the sync read, unless it added a row: every row's state as it stands now.
            states = synced.states if synced is not None else None
        if states is None:
            states = self.state.load(list(handles))
        now = self._now()
        due: dict[str, datetime] = {}
        for name, handle in handles.items():
            if name in self._refused:
                continue
            stored = states.get(name)
            watermark = stored.watermark if stored is not None else None
            # No watermark yet: due now, so this round arms it.
            try:
                due[name] = now if watermark is None else self._resolve(handle, watermark)
            except Exception:
                # Planning it fails it alone, logged, like any task-specific error.
                due[name] = now
        self._due, self._due_for = due, handles
        self._due_at = {}
        for name, at in due.items():
            self._due_at.setdefault(at, []).append(name)
        self._heap = list(self._due_at)
        heapq.heapify(self._heap)
        self._states_read = states

    def _pop_due(self, now: datetime) -> list[str]:
        assert self._due is not None
        names: list[str] = []
        while self._heap and self._heap[0] <= now:
            at = heapq.heappop(self._heap)
            for name in self._due_at.pop(at):
                # A task moved to another instant since (or listed twice) is not due here.
                if self._due.get(name) == at:
                    del self._due[name]
                    names.append(name)
        return names

    # -- one round ------------------------------------------------------------------------------

    def _dispatching(self) -> bool:
        return self.status not in ("draining", "stopped")

    def _undispatching(self) -> bool:
        """A drain began: what the round has not reached is kept for the next one."""
        return not self._dispatching()

    def _concede(self) -> None:
        if self.is_leader:
            emit(logger, "jobs.scheduler.leadership-lost", logging.WARNING, at=self.clock())
        self.is_leader = False
        self._due = None

    def _run_round(self) -> Report:
        # Never take the lock a drain is on its way to releasing.
        if not self._dispatching():
            return NOTHING
        try:
            # Asked EVERY round: for a lease it is the renewal, and a node that cached "leader"
            # would keep dispatching past a lease another node already took.
            held = self.leader.acquire()
        except Exception:
            self._concede()  # A failed election concedes.
            raise
        if not held:
            self._concede()
            self.refused = True
            self.state.heartbeat(is_leader=False, round_at=None, error=self.last_error)
            return NOTHING
        handles = self._handles()
        self._measure_clock()
        if not self.is_leader:
            emit(logger, "jobs.scheduler.leadership-acquired", leader=self.leader.name)
            # Mirrored again: a node of another release may have led meanwhile, and written its
            # own declarations (marked ours removed, our crons changed).
            self._synced_for = None
        if not self.is_leader or self._due is None or handles is not self._due_for:
            # As a big round: reading every task's row makes objects by the thousand.
            with collector.paused(len(handles) >= GC_PAUSE_FROM):
                self._rebuild(handles)
        self.is_leader = True
        now = self._round_at = self._now()
        try:
            dispatched = self._dispatch_due(handles, now)
        except BaseException:
            self._due = None  # Rebuild from the database: the popped tasks were not rescheduled.
            raise
        finally:
            self._states_read = None
        self.state.heartbeat(is_leader=True, round_at=now, error=self.last_error)
        return dispatched

    def _dispatch_due(self, handles: dict[str, TaskHandle], now: datetime) -> Report:
        assert self._due is not None
        names = [name for name in self._pop_due(now) if name in handles]
        if not names:
            return NOTHING
        # Asked once a round: with no tracer provider set the round does no tracing work at all.
        tracer = tracing.tracer()
        traced = None
        if tracer is not None:
            traced = tracing.RoundTrace(tracer, due=len(names), node=self.state.node_id)
        try:
            with collector.paused(len(names) >= GC_PAUSE_FROM):
                return self._dispatch(handles, names, now, traced)
        except BaseException as error:
            if traced is not None:
                traced.failed(error)
            raise
        finally:
            if traced is not None:
                traced.end()

    def _dispatch(
        self,
        handles: dict[str, TaskHandle],
        names: list[str],
        now: datetime,
        traced: tracing.RoundTrace | None,
        *,
        stream: bool = True,
    ) -> Report:
        """Plan and write the round of ``names``; ``stream``: a big one may be written while
        its task functions run (``_streams``)."""
        started = time.perf_counter()
        # Watermarks a rebuild read in this round are the ones to plan from: at a start (and
        # each run of --once) one read of every task rather than two. Taken, not kept: the
        # round lets them go once it has decided.
        states, self._states_read = self._states_read, None
        if states is None:
            states = self.state.load(names)
        plan = RoundPlan(now=now, database=self.state.using)
        # Per name of ``names``, what planning it did; None for a task not reached, due again
        # now. A list beside the names, rather than a tuple per task.
        steps: list[TaskStep | None] = []
        missing = False
        renewal = _Renewal(self.leader)
        renews = renewal.every is not None  # Asked of every task: nothing to ask without a lease.
        decisions: dict[tuple[object, ...], tuple[Decision, TaskStep]] | None = (
            {} if self._share_decisions else None
        )
        # A big round is written while its task functions run: every task is decided first,
        # and the ones due to fire are fired in a thread (``_fire``) as the jobs are written.
        deferred: list[Deferred] | None = [] if stream and self._streams(handles, names) else None

        def undispatching() -> bool:
            # Between two occurrences of one task: a drain, or the lease lost.
            return self._undispatching() or not renewal.held()

        for name in names:
            if renews and not renewal.holding():
                self._concede()
                return NOTHING
            stored = states.get(name)
            # Re-read per task: a stop between two tasks means stop now. A task not reached
            # keeps its watermark and fires next time.
            if not self._dispatching() or stored is None:
                steps.append(None)
                missing = missing or stored is None
                continue
            handle = handles[name]
            try:
                step = plan_task(
                    handle,
                    watermark=stored.watermark,
                    paused=stored.paused,
                    now=now,
                    misfire_grace=self.misfire_grace,
                    next_after=functools.partial(self._resolve, handle),
                    plan=plan,
                    decisions=decisions,
                    deferred=deferred,
                    stopped=undispatching,
                )
            except Exception as error:
                # Planning writes to the plan only once its decision stands, so a task whose
                # schedule itself raised leaves nothing behind: it alone is retried next round.
                step = TaskStep(now, failed=error)
            steps.append(step)
        if renews and not renewal.holding():
            # The last task's function outlived the lease's renewal: renewed before the write,
            # whose fence would otherwise find it expired, round after round.
            self._concede()
            return NOTHING
        planned = time.perf_counter()
        if traced is not None and not deferred:
            # Before the rows are made: each job row keeps its occurrence's traceparent.
            for fired in plan.fired:
                traced.fire(fired, zone=handles[fired.task].tz, cron=handles[fired.task].cron)
        # The lines saying what fired are made while the round commits (after skip_overlaps,
        # which may take occurrences out of it) and written once it has.
        streamed, lines = None, None
        if deferred:
            streamed, lines = self._stream(plan, deferred, traced)
        elif not plan.skip_overlap:
            ahead = len(plan.fired) >= LINES_AHEAD_FROM
            lines = self._dispatched_lines(plan.fired, ahead=ahead)
        # And those of the tasks armed on first sight: at a first start, one per task.
        armed = self._armed_lines(names, steps)
        # Read and decided: what the rest of the round need not hold.
        del states, deferred
        enqueued: Enqueued | None = None
        replan = False
        try:
            enqueued = self._commit(plan, streamed)
        except KeyExisted:
            replan = True
        finally:
            if enqueued is None:
                armed.close()
                if lines is not None:
                    lines.close()
        if replan:
            # Nothing was written, and the inputs were let go as their rows were made: the
            # round is planned again (its task functions called again) and written once
            # planned, reporting the keys that exist.
            emit(logger, "jobs.scheduler.replanned", logging.WARNING, due=len(names))
            if traced is not None:
                traced.replanned()
            return self._dispatch(handles, names, now, traced, stream=False)
        if enqueued is None:
            return NOTHING
        committed = time.perf_counter()
        instruments.recorded(plan.records)
        held = plan.held
        for name, planned_step in zip(names, steps, strict=True):
            if planned_step is None:
                self._set_due(name, now)
            elif held and name in held:
                self._set_due(name, held[name][0])
            else:
                self._set_due(name, planned_step.next_due)
        self._log_steps(handles, names, steps, armed, held)
        for record in plan.records:
            if record.outcome == "overlap":
                emit(
                    logger,
                    "jobs.scheduler.overlap-skipped",
                    task=record.task,
                    first=record.span.first,
                    last=record.span.last,
                    count=record.span.count,
                    detail=record.detail,
                )
        instruments.dispatched(_counted(plan.fired, enqueued), self.clock())
        if self.checkins is not None:
            self.checkins.opened(plan.fired, enqueued)  # Sent from its thread: the round goes on.
        # One line per occurrence, written after the commit so it never delays the jobs.
        (lines or self._dispatched_lines(plan.fired, ahead=False)).write()
        if missing:
            # A row went missing under us: sync and rebuild next round.
            self._due = self._synced_for = None
        created = sum(new for _, new in enqueued.values())
        if traced is not None:
            traced.committed(
                plan.fired, jobs=len(enqueued), created=created, records=len(plan.records)
            )
        emit(
            logger,
            "jobs.scheduler.round",
            due=len(names),
            fired=len(plan.fired),
            jobs=len(enqueued),
            created=created,
            records=len(plan.records),
            plan_ms=round((planned - started) * 1000, 1),
            commit_ms=round((committed - planned) * 1000, 1),
            log_ms=round((time.perf_counter() - committed) * 1000, 1),
        )
        return Report(plan.fired, enqueued)

    def _streams(self, handles: dict[str, TaskHandle], names: list[str]) -> bool:
        """Whether this round is written while its task functions run (``commit_streamed``).

        Only a big one, on a state that can (PostgreSQL, outside a caller's transaction), and
        without ``overlap="skip"`` tasks, which are decided against the jobs the round reads.
        """
        return (
            len(names) >= STREAM_FROM
            and self.state.can_stream()
            and not any(handles[name].overlap == "skip" for name in names)
        )

    def _stream(
        self, plan: RoundPlan, deferred: list[Deferred], traced: tracing.RoundTrace | None
    ) -> tuple[Streamed, Lines]:
        """Start firing ``deferred`` in a thread: the round to write as it comes, and its
        lines, which that thread makes once every task has fired."""
        lines = self._dispatched_lines(plan.fired, ahead=False)
        plan.streaming = True  # The thread holds tasks without touching their watermarks.
        using = self.state.using
        assert using is not None  # A state that streams writes to a database.
        waits = OwnLockWaits(using)
        planner: Ahead[Any] = Ahead(
            self._fire(deferred, plan, traced, waits),
            lines.tails or (),
            closes_connections=True,
            on_wait=functools.partial(self._check_waits, waits),
        )
        lines.made_by(planner, 1)
        occurrences = sum(len(task.decision.fire) for task in deferred)
        return Streamed(planner.rows(0), occurrences), lines

    def _fire(
        self,
        deferred: list[Deferred],
        plan: RoundPlan,
        traced: tracing.RoundTrace | None,
        waits: OwnLockWaits,
    ) -> Iterator[PlannedOccurrence]:
        """The occurrences of the tasks ``deferred``, as each task's entries are made.

        Runs in a thread of its own (``db.Ahead``) while the round is written, so the task
        functions use a database connection of that thread, closed when it ends; one whose
        statement waited on the round's own locks and was cancelled (``waits``) fails with
        ``RoundLockWaitError``. A stop between two tasks keeps the occurrences not reached for
        the next round, as a failure does.
        """
        waits.started()
        for index, task in enumerate(deferred):
            if not self._dispatching():
                for rest in deferred[index:]:
                    plan.hold(rest.handle.name, rest.decision.fire[0][0])
                return
            name = task.handle.name
            waits.firing(name)
            fired = fire_task(
                task.handle, task.decision, plan, as_text=True, stopped=self._undispatching
            )
            held = plan.held.get(name)
            if held is not None and waits.cancelled(name):
                plan.held[name] = (held[0], _waited_on_round(name, held[1]))
            if traced is not None:
                for occurrence in fired:
                    traced.fire(occurrence, zone=task.handle.tz, cron=task.handle.cron)
            yield from fired

    def _check_waits(self, waits: OwnLockWaits) -> None:
        """While the round waits for its rows: a task function waiting on the round's own
        locks has its statement cancelled, and says so."""
        task = waits.check()
        if task is not None:
            fields = _waited_on_round(task, None).as_fields()
            emit(logger, "jobs.scheduler.lock-wait-cancelled", logging.WARNING, task=task, **fields)

    def _commit(self, plan: RoundPlan, streamed: Streamed | None) -> Enqueued | None:
        """The round's writes; None when another node leads or moved a watermark meanwhile."""
        try:
            if streamed is not None:
                return self.state.commit_streamed(plan, self.leader.fence, streamed)
            return self.state.commit(plan, self.leader.fence) if plan.watermarks else {}
        except FencingLost:
            self._concede()
        except WatermarkMoved as moved:
            emit(
                logger,
                "jobs.scheduler.watermark-moved",
                logging.WARNING,
                task=str(moved),
                fix="once (a resume, a backfill): nothing to do. Round after round: another "
                "scheduler leads too; give every node the same LEADER and ADVISORY_LOCK_KEY",
            )
            self._due = None
        return None

    def _dispatched_lines(self, fired: list[PlannedOccurrence], *, ahead: bool) -> Lines:
        """The line of each occurrence fired. An instant is written as the formatters write
        it, once per instant rather than per line."""
        iso = instant_texts()
        rows = (
            {
                "task": f.task,
                "occurrence": iso(f.occurrence),
                "jobs": [planned.job.name for planned in f.jobs],
                "catch_up": f.catch_up,
            }
            for f in fired
        )
        return Lines(per_task, "jobs.scheduler.dispatched", rows, ahead=ahead)

    def _armed_lines(self, names: list[str], steps: list[TaskStep | None]) -> Lines:
        """The line of each task armed on first sight, made in a thread while the round
        commits when there are many of them."""
        iso = instant_texts()
        rows = (
            {"task": name, "next": iso(step.next_due)}
            for name, step in zip(names, steps, strict=True)
            if step is not None and step.armed
        )
        count = sum(1 for step in steps if step is not None and step.armed)
        return Lines(per_task, "jobs.scheduler.armed", rows, ahead=count >= LINES_AHEAD_FROM)

    def _log_steps(
        self,
        handles: dict[str, TaskHandle],
        names: list[str],
        steps: list[TaskStep | None],
        armed: Lines,
        held: dict[str, tuple[datetime, Exception | None]],
    ) -> None:
        armed.write()
        for name, step in zip(names, steps, strict=True):
            if step is None:
                continue
            found = held.get(name) if held else None
            # A run-once drop after an occurrence held for the next round is not made yet.
            if step.dropped is not None and (found is None or step.dropped.first < found[0]):
                emit(
                    logger,
                    "jobs.scheduler.dropped",
                    task=name,
                    first=step.dropped.first,
                    last=step.dropped.last,
                    count=step.dropped.count,
                    catch_up=handles[name].catch_up,
                )
            if step.failed is not None:
                self._task_failed(name, None, step.failed)
            if found is not None and found[1] is not None:
                self._task_failed(name, found[0], found[1])

    def _task_failed(self, name: str, occurrence: datetime | None, error: Exception) -> None:
        fields = failure_fields(error)
        self.last_error = f"{name}: {fields['error']}"
        emit(
            logger,
            "jobs.scheduler.task-failed",
            logging.ERROR,
            task=name,
            occurrence=occurrence,
            **fields,
        )

    def tick(self) -> Report:
        """One dispatch round; a call landing on a round in flight JOINS it."""
        with self._lock:
            current = self._round
            owner = current is None
            if current is None:
                current = self._round = Future()
        if not owner:
            return current.result()
        started = self.round_began = time.monotonic()
        try:
            result = self._run_round()
        except BaseException as error:
            current.set_exception(error)
            raise
        else:
            current.set_result(result)
            return result
        finally:
            with self._lock:
                self._round = None
            node = self.state.node_id
            failed = self.round_failed = current.exception() is not None
            self.round_ended = time.monotonic()
            instruments.observe_round(
                time.monotonic() - started, leader=self.is_leader, node=node, failed=failed
            )

    # -- the loop and the drain -----------------------------------------------------------------

    def start(self) -> None:
        """Start the loop in a thread; only from a standstill."""
        if not self.life.begin():
            return
        self._watch()  # Before the hook: a signal kept from the start stops what it started.
        self.life.hook(self.stop)
        emit(logger, "jobs.scheduler.started", tasks=len(self.tasks()), leader=self.leader.name)
        self._thread = threading.Thread(target=self._loop, name="ultimat3-scheduler", daemon=True)
        self._thread.start()

    def run_once(self) -> Report:
        """One round as a whole life: start, tick, stop. For ``run_scheduler --once``.

        SIGTERM/SIGINT drain it as they drain the loop: a round under way is finished and
        committed, one not begun is not.
        """
        self._watch()
        self.life.hook(self.stop)
        emit(logger, "jobs.scheduler.started", tasks=len(self.tasks()), leader=self.leader.name)
        try:
            self.refused = False
            report = self.tick()
            if self.refused:
                # Exit 0 all the same: another node leads and dispatches, as it should.
                emit(logger, "jobs.scheduler.not-leader", leader=self.leader.name)
            return report
        finally:
            self.stop("once")

    def _loop(self) -> None:
        backoff = Backoff(self.tick_interval)
        while self.life.status == "running":
            began = time.monotonic()
            try:
                self.tick()
                backoff.succeeded()
                self.last_error = ""
            except Exception as error:
                fields = backoff.failed(error)
                self.last_error = str(fields["error"])
                emit(logger, "jobs.scheduler.tick-failed", logging.ERROR, **fields)
                logger.debug(
                    "traceback", exc_info=error, extra={"event": "jobs.scheduler.traceback"}
                )
                self._heard_failing(error)
            try:
                self.state.between_rounds()
            except Exception as error:  # pragma: no cover - closing a broken connection
                emit(logger, "jobs.scheduler.tick-failed", logging.ERROR, **failure_fields(error))
            # The GAP between rounds, never a fixed period; longer while the database is down,
            # shorter when an occurrence falls due before it ends.
            gap = backoff.rest()
            if not backoff.failures:
                # Never less rest than the round took: rounds slower than the occurrences
                # they serve must not run back to back. Never more than a heartbeat interval:
                # under a tick longer than that (--tick-interval 30), a round with nothing due
                # keeps the node heard from and its lease renewed.
                rest = time.monotonic() - began
                gap = min(gap, max(min(self._until_next_due(), self.state.until_heartbeat()), rest))
            self.life.rest(gap)

    def _heard_failing(self, error: Exception) -> None:
        """The node's row says the error of a round that failed, as a round's heartbeat says
        a task's: a node failing every round is then seen alive and failing, with why, rather
        than silent. Not while the database cannot be reached (``database_away``)."""
        if database_away(error):
            return
        try:
            self.state.heartbeat(is_leader=self.is_leader, round_at=None, error=self.last_error)
        except Exception as failed:  # The round's own failure is the one logged.
            logger.debug("heartbeat", exc_info=failed, extra={"event": "jobs.scheduler.traceback"})

    def _watch(self) -> None:
        """Watch the rounds of this run for a task function that holds one (``_watch_rounds``)."""
        self._unwatched = threading.Event()
        threading.Thread(
            target=self._watch_rounds,
            args=(self._unwatched, max(get_settings().stale_round_warning.total_seconds(), 1.0)),
            name="ultimat3-round-watch",
            daemon=True,
        ).start()

    def _watch_rounds(self, unwatched: threading.Event, slow_after: float) -> None:
        """Name a task whose function has run ``slow_after`` seconds or more, once a call. A
        task's function runs inside the round, which nothing can interrupt: while it hangs, no
        task fires and a drain waits. Read from the threads' stacks while a round runs, once
        a second, so the round itself pays nothing for it."""
        first_seen: dict[int, float] = {}  # id of a call's frame -> when it was first seen
        told: set[int] = set()
        while not unwatched.wait(WATCH_EVERY):
            if self._round is None:
                first_seen.clear()
                continue
            now = time.monotonic()
            calls = _task_calls()
            first_seen = {key: first_seen.get(key, now) for key in calls}
            told &= first_seen.keys()
            for key, name in calls.items():
                held = now - first_seen[key]
                if held < slow_after or key in told:
                    continue
                told.add(key)
                emit(
                    logger,
                    "jobs.scheduler.task-slow",
                    logging.WARNING,
                    task=name,
                    running_s=round(held, 1),
                    draining=self.life.status == "draining",
                    fix=f'make the function of task "{name}" return promptly (return the slow '
                    "work as a job's entry): it runs inside the round, which holds the "
                    "leadership, so no other task fires and a drain waits until it returns; "
                    "py-spy dump --pid <this process> shows where it waits",
                )

    def _until_next_due(self) -> float:
        """Seconds until the earliest occurrence this leader owes; a follower has none.

        Waking for it, rather than at the end of the gap, starts a 09:00:00 job at 09:00:00 and
        not up to a tick later. The margin makes the round's clock read past the instant.
        """
        if not self.is_leader or self._due is None or not self._heap:
            return float("inf")
        at = self._heap[0]
        if self._round_at is not None and at <= self._round_at:
            return float("inf")  # Due again at once: a retry, which waits out the gap.
        return max((at - self._now()).total_seconds(), 0.0) + WAKE_MARGIN

    def _measure_clock(self) -> None:
        """Compare this node's clock with the database's before a round plans. Occurrences are
        computed from this node's clock, but never from one ahead of the database's by more
        than ``misfire_grace``: a clock stepped a day forward (a VM restored, an NTP step)
        would drop a day of occurrences as missed and carry every watermark a day ahead,
        where no node fires anything until the day has passed. Such a clock is logged
        (``jobs.scheduler.clock-skew``) and the round plans from the database's clock plus
        ``misfire_grace``; one behind fires late and loses nothing."""
        self._ahead = max(self.state.clock_skew() - self.misfire_grace, timedelta(0))

    def _now(self) -> datetime:
        """The instant a round plans from: this node's clock, less how far it runs ahead of the
        database's past ``misfire_grace`` (``_measure_clock``)."""
        now = self.clock()
        return now - self._ahead if self._ahead else now

    def stop(self, reason: str = "stop") -> None:
        """Stop dispatching, wait out the round in flight, then hand leadership back."""
        with self._lock:
            if self.life.status == "stopped":
                return
            stopping = self._stopping
            owner = stopping is None
            if stopping is None:
                stopping = self._stopping = Future()
        if not owner:
            stopping.result()  # One teardown, joined rather than repeated.
            return
        try:
            self._teardown(reason)
        finally:
            with self._lock:
                self._stopping = None
            stopping.set_result(None)

    def _teardown(self, reason: str) -> None:
        # Draining first: a round that starts from here dispatches nothing, and one already
        # in flight is the one read below.
        self.life.drain(reason)
        with self._lock:
            in_flight = self._round
        emit(logger, "jobs.scheduler.draining", reason=reason, dispatching=in_flight is not None)
        try:
            # The round this stop races runs to the end first: releasing the lock under a live
            # dispatch would hand the next node an occurrence this one is still enqueueing.
            # Settled, not awaited: a round that failed is its own caller's to see.
            if in_flight is not None:
                in_flight.exception()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()
            if self.is_leader:
                self.leader.release()
        finally:
            self.is_leader = False
            instruments.stepped_down(self.state.node_id)
            self._due = None
            self._thread = None
            try:
                self.state.stopped()
            except Exception as error:
                emit(logger, "jobs.scheduler.tick-failed", logging.ERROR, **failure_fields(error))
            if self.checkins is not None:
                self.checkins.close()
            emit(logger, "jobs.scheduler.stopped", reason=reason)
            self._unwatched.set()
            self.life.end()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped; True if it is."""
        return self.life.wait(timeout)


#: Seconds between two looks at a round in flight for a task function that holds it.
WATCH_EVERY = 1.0


def _task_calls() -> dict[int, str]:
    """The calls of task functions some thread is in now (the round's, or its planning's):
    the id of each call's frame, which lives as long as the call, and its task's name."""
    calls = {}
    for frame in sys._current_frames().values():
        at: FrameType | None = frame
        while at is not None:
            if at.f_code is _ENTRIES:
                handle = at.f_locals.get("self")
                if isinstance(handle, TaskHandle):
                    calls[id(at)] = handle.name
                break
            at = at.f_back
    return calls


_ENTRIES = TaskHandle.entries.__code__


def _waited_on_round(task: str, cause: Exception | None) -> RoundLockWaitError:
    return RoundLockWaitError(
        f'task "{task}" waited on a lock its own round holds (a due task\'s row, the lease '
        "row) and would have waited forever: its statement was cancelled, and the occurrence "
        "fires next round",
        fix="in a task function, do not update or lock the app's Task or Lease rows; return "
        "the work as entries, or do it in a job the task returns",
        cause=cause,
    )


def _cached_next_occurrence() -> Callable[[TaskHandle, datetime], datetime]:
    """``TaskHandle.next_after``, remembered per (schedule, zone, DST options, instant).

    Tasks that share a cron, a zone and DST options ask the same questions in a round (and
    again at the next), so many such tasks cost a handful of walks rather than three each.
    """
    cache: dict[tuple[object, ...], datetime] = {}

    def resolve(handle: TaskHandle, after: datetime) -> datetime:
        key = (handle.schedule, handle.zone, handle.dst_gap, handle.dst_repeat, after)
        found = cache.get(key)
        if found is None:
            if len(cache) >= RESOLVE_CACHE_SIZE:
                cache.clear()
            found = cache[key] = handle.next_after(after)
        return found

    return resolve


__all__ = ["Dispatched", "Report", "Scheduler"]
