"""Where the scheduler keeps its watermarks and writes a round: the database.

A round's writes (jobs, occurrence records, watermarks) are one ``commit()``: one transaction,
a constant number of statements whatever the number of tasks, with leadership and every
watermark re-checked inside it, so a crash can neither lose nor repeat an occurrence. The
order of a round's writes is decided here; each write is the job store's (``store``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import close_old_connections, transaction

from . import clock as default_clock
from . import nodes
from .conf import Settings, get_settings
from .handles import TaskHandle
from .planner import (
    PlannedOccurrence,
    RoundPlan,
    Streamed,
    keep_present_jobs,
    skip_overlaps,
)
from .store import Enqueued, JobStore, Synced, TaskState, store_for
from .store.columns import scheduled_fields


class FencingLost(Exception):
    """Leadership was gone by the time the dispatch transaction checked it."""


class WatermarkMoved(Exception):
    """Another node advanced a watermark since this round read it; the round wrote nothing."""


class KeyExisted(Exception):
    """A streamed round met a job key written already (a watermark moved back by hand): the
    inputs it let go as their rows were made cannot be written again, so the round wrote
    nothing, for the scheduler to plan it again and write it unstreamed (``commit``)."""


Fence = Callable[[str], bool]


class SchedulerState(Protocol):
    """What the scheduler keeps between rounds and writes each round (``DatabaseState``;
    ``testing.MemoryState`` for tests)."""

    @property
    def using(self) -> str | None:
        """The database the rounds are written to (a Django Task entry's backend must use it);
        None when there is none."""

    @property
    def node_id(self) -> str:
        """This node, as its heartbeat, records and metrics name it."""

    def sync(self, tasks: Sequence[TaskHandle]) -> Synced | None:
        """Mirror the declarations; mark stored tasks no longer declared.

        May return the tasks whose declaration could not be stored (they are not dispatched),
        and every stored task's state as read meanwhile, which ``load`` would read again.
        """

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        """Watermarks of ``names`` (None: every stored task), in one read."""

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        """Write the round atomically; raise FencingLost / WatermarkMoved and write nothing.

        Inside the transaction, before any job is written, the occurrences of
        ``plan.skip_overlap`` tasks that overlap an earlier one are moved from ``plan.fired``
        to ``plan.records`` (``planner.skip_overlaps``): the caller reads the plan afterwards.
        """

    def can_stream(self) -> bool:
        """Whether ``commit_streamed`` may run now."""

    def commit_streamed(self, plan: RoundPlan, fence: Fence, streamed: Streamed) -> Enqueued:
        """``commit`` for a round whose occurrences are still being planned, in another
        thread; only when ``can_stream()``."""

    def clock_skew(self) -> timedelta:
        """This node's clock minus the database's, measured now; the round's heartbeat then
        records that measure rather than take another."""

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        """After every round: compare clocks, and record this node's liveness (throttled)."""

    def between_rounds(self) -> None:
        """Housekeeping between two rounds of the loop."""

    def until_heartbeat(self) -> float:
        """Seconds until this node's heartbeat falls due: the longest rest between two rounds,
        whose heartbeat keeps the node alive to health checks and its lease renewed."""

    def stopped(self) -> None:
        """This node has stopped."""


class DatabaseState:
    """The watermarks in the ``Task`` table; a round's jobs in the job table.

    ``store``: the job store that writes them (default: ``store_for(using)``). ``once``: for
    a process that runs one round and stops (``run_scheduler --once``), whose node row is
    written once, at the stop, with what its round's heartbeat would have written.
    """

    def __init__(
        self,
        *,
        node_id: str,
        leader: str,
        using: str = "default",
        heartbeat_interval: timedelta = timedelta(seconds=5),
        clock_skew_warning: timedelta = timedelta(seconds=1),
        clock: Callable[[], datetime] | None = None,
        store: JobStore | None = None,
        once: bool = False,
    ) -> None:
        self.node_id = node_id
        self.leader = leader
        self.using = using
        self.store = store or store_for(using)
        self.clock = clock or default_clock.now
        self.node = nodes.Heartbeat(
            using=using,
            node_id=node_id,
            role="scheduler",
            every=heartbeat_interval,
            clock=self.clock,
            skew_warning=clock_skew_warning,
        )
        self._last_leader: bool | None = None
        self._once = once
        #: With ``once``: the round's heartbeat, kept for the stop to write.
        self._kept: dict[str, Any] = {}
        #: The skew a round measured before it planned (``clock_skew``), for its heartbeat.
        self._skew_ms: int | None = None

    def sync(self, tasks: Sequence[TaskHandle]) -> Synced:
        """Mirror the declarations; mark stored tasks no longer declared.

        Returns the tasks whose declaration the database refused, and the states it read
        (``JobStore.sync_tasks``).
        """
        return self.store.sync_tasks(tasks)

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        return self.store.task_states(names)

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        config = get_settings()
        with transaction.atomic(using=self.using):
            if not fence(self.using):
                raise FencingLost()
            backfilled = self._compare_and_set(plan.watermarks)
            if backfilled:
                self._keep_backfilled(plan, backfilled)
            if plan.skip_overlap:
                # One statement for every overlap="skip" task of the round, under the locks
                # the compare-and-set took, so no other round decides these tasks meanwhile.
                skip_overlaps(plan, self.store.busy_occurrences(plan.skip_overlap))
            # Made after skip_overlaps: the rows are those of the occurrences still fired.
            jobs = _RoundJobs(plan, config)
            enqueued = self.store.insert_round(jobs)
            self._write_records(plan, enqueued)
        self._announce(plan, jobs, enqueued)
        return enqueued

    def can_stream(self) -> bool:
        """Whether ``commit_streamed`` may run now (``JobStore.can_stream``)."""
        return self.store.can_stream()

    def commit_streamed(self, plan: RoundPlan, fence: Fence, streamed: Streamed) -> Enqueued:
        """``commit`` for a round whose occurrences are still being planned, in another thread.

        The watermarks are swapped first, as if every occurrence fires; the jobs are written
        as their occurrences come, each letting go of its inputs once its rows are made; once
        they all have, the watermarks of the tasks held (a failure, a stop) are set to the
        instant before their held occurrence. One transaction, fence first, as ``commit``.
        Raises ``KeyExisted`` when a key exists, having written nothing.
        """
        config = get_settings()
        with transaction.atomic(using=self.using):
            if not fence(self.using):
                raise FencingLost()
            backfilled = self._compare_and_set(plan.watermarks)
            if backfilled:
                for _ in streamed.fired:
                    pass  # The rest of the round planned here, before it is written.
                self._keep_backfilled(plan, backfilled)
                jobs = _RoundJobs(plan, config)
                # Written as ``commit`` writes a round, once its occurrences are all planned.
                enqueued = self.store.insert_round(jobs)
            else:
                # Ids for one job per occurrence; a round whose tasks return more takes more.
                found = self.store.insert_streamed(
                    _letting_go(streamed.fired), streamed.occurrences, now=plan.now
                )
                if found is None:
                    raise KeyExisted()
                enqueued, jobs = found, _RoundJobs(plan, config)
            moved = plan.held_watermarks()
            if moved:
                self.store.set_watermarks(moved)
            self._write_records(plan, enqueued)
        self._announce(plan, jobs, enqueued)
        return enqueued

    def _write_records(self, plan: RoundPlan, enqueued: Enqueued) -> None:
        self.store.write_records(plan.fired, plan.records, enqueued, at=plan.now, node=self.node_id)

    def _announce(self, plan: RoundPlan, jobs: _RoundJobs, enqueued: Enqueued) -> None:
        if any(planned.job.backend for fired in plan.fired for planned in fired.jobs):
            from .backends import announce_round

            # Django Tasks: after commit, as enqueue() does. Only their rows are made again.
            announce_round(list(jobs.of_backends()), enqueued)

    def _compare_and_set(
        self, watermarks: dict[str, tuple[datetime | None, datetime]]
    ) -> Mapping[str, datetime]:
        """Check every watermark of the round and write the new ones, locking their rows; the
        tasks a backfill enqueued occurrences of ahead of the round, and up to when."""
        swapped = self.store.swap_watermarks(watermarks)
        if swapped.moved is not None:
            # The transaction rolls back: no watermark moves, no job is written.
            raise WatermarkMoved(swapped.moved)
        return swapped.backfilled

    def _keep_backfilled(self, plan: RoundPlan, backfilled: Mapping[str, datetime]) -> None:
        """Occurrences a backfill already fired, before the round reached them, fire nothing
        new: their jobs are reported, whatever the payload is now. Read under the task rows'
        locks, which a backfill takes too, so none can add jobs meanwhile."""
        wanted: dict[str, list[datetime]] = {}
        for fired in plan.fired:
            through = backfilled.get(fired.task)
            if through is not None and fired.occurrence <= through:
                wanted.setdefault(fired.task, []).append(fired.occurrence)
        if not wanted:
            return
        already = self.store.fired_occurrences(wanted)
        keys = [
            p.key for f in plan.fired if f.occurrence in already.get(f.task, ()) for p in f.jobs
        ]
        keep_present_jobs(plan, already, self.store.ids_of(keys))

    def clock_skew(self) -> timedelta:
        self._skew_ms = self.node.compare_clocks()
        return timedelta(milliseconds=self._skew_ms)

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        # Every round: occurrences are computed from this node's clock, so a skewed one fires
        # early or late. The row itself is written when due, or at once when it has news.
        skew_ms, self._skew_ms = self._skew_ms, None
        if skew_ms is None:
            skew_ms = self.node.compare_clocks()
        if not (self.node.due() or is_leader != self._last_leader or error):
            return
        fields: dict[str, Any] = {
            "leader": self.leader,
            "is_leader": is_leader,
            "last_error": error,
            "clock_skew_ms": skew_ms,
        }
        if round_at is not None:
            fields["last_round_at"] = round_at
        if self._once:
            self._kept = fields  # One statement at the stop rather than two.
        else:
            self.node.beat(**fields)
        self._last_leader = is_leader

    def between_rounds(self) -> None:
        close_old_connections()

    def until_heartbeat(self) -> float:
        return self.node.until_due()

    def stopped(self) -> None:
        if self._once and not self._kept:
            return  # A --once run whose round failed or never came: no row, as before it.
        self.node.stopped(**{"leader": self.leader, **self._kept, "is_leader": False})


def _letting_go(fired: Iterator[PlannedOccurrence]) -> Iterator[PlannedOccurrence]:
    """``fired``, each occurrence letting go of its inputs once the store asks for the next
    one: its rows are made by then."""
    for occurrence in fired:
        yield occurrence
        occurrence.let_go()


class _RoundJobs:
    """The job rows of a round, made as they are written: a round's thousands of rows need not
    be held at once."""

    def __init__(self, plan: RoundPlan, config: Settings) -> None:
        self.plan, self.config = plan, config
        self.count = sum(len(fired.jobs) for fired in plan.fired)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._rows(backends_only=False)

    def of_backends(self) -> Iterator[dict[str, Any]]:
        """The rows of Django Tasks' jobs alone (those whose inputs a round never lets go)."""
        return self._rows(backends_only=True)

    def _rows(self, *, backends_only: bool) -> Iterator[dict[str, Any]]:
        for fired in self.plan.fired:
            for planned in fired.jobs:
                if backends_only and not planned.job.backend:
                    continue
                yield scheduled_fields(
                    fired, planned, planned.row_input(), now=self.plan.now, config=self.config
                )
