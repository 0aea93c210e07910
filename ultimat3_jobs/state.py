"""Where the scheduler keeps its watermarks and writes a round: the database.

A round's writes (jobs, occurrence records, watermarks) are one ``commit()``: one transaction,
a constant number of statements whatever the number of tasks, with leadership and every
watermark re-checked inside it, so a crash can neither lose nor repeat an occurrence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import orjson
from django.db import DataError, IntegrityError, close_old_connections, connections, transaction
from psycopg.types.json import Jsonb

from . import clock as default_clock
from . import history, jobstore, nodes, sql
from .conf import Settings, get_settings
from .db import (
    Ahead,
    dumps,
    execute_bound,
    instant_texts,
    instants_from_microseconds,
)
from .errors import TaskSyncError
from .handles import TaskHandle
from .jobstore import Enqueued
from .models import Task
from .planner import PlannedJob, PlannedOccurrence, RoundPlan, Streamed, skip_overlaps

#: New task rows written per statement at start.
SYNC_SLICE = 1000


@dataclass(slots=True)
class TaskState:
    watermark: datetime | None
    paused: bool = False


class FencingLost(Exception):
    """Leadership was gone by the time the dispatch transaction checked it."""


class WatermarkMoved(Exception):
    """Another node advanced a watermark since this round read it; the round wrote nothing."""


Fence = Callable[[str], bool]


class SchedulerState(Protocol):
    def sync(self, tasks: Sequence[TaskHandle]) -> Mapping[str, Exception] | None:
        """Mirror the declarations; mark stored tasks no longer declared.

        May return the tasks whose declaration could not be stored: they are not dispatched.
        """

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        """Watermarks of ``names`` (None: every stored task), in one read."""

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        """Write the round atomically; raise FencingLost / WatermarkMoved and write nothing.

        Inside the transaction, before any job is written, the occurrences of
        ``plan.skip_overlap`` tasks that overlap an earlier one are moved from ``plan.fired``
        to ``plan.records`` (``planner.skip_overlaps``): the caller reads the plan afterwards.
        """

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        """After every round: compare clocks, and record this node's liveness (throttled)."""

    def between_rounds(self) -> None:
        """Housekeeping between two rounds of the loop."""

    def stopped(self) -> None:
        """This node has stopped."""


class DatabaseState:
    """The watermarks in the ``Task`` table; a round's jobs in the job table."""

    def __init__(
        self,
        *,
        node_id: str,
        leader: str,
        using: str = "default",
        heartbeat_interval: timedelta = timedelta(seconds=5),
        clock_skew_warning: timedelta = timedelta(seconds=1),
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.node_id = node_id
        self.leader = leader
        self.using = using
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

    def sync(self, tasks: Sequence[TaskHandle]) -> dict[str, TaskSyncError]:
        """Mirror the declarations; mark stored tasks no longer declared.

        Returns the tasks whose declaration the database refused (a value past a column's
        limit that slipped past ``@task``): each is tried alone so the others still sync.
        """
        try:
            with transaction.atomic(using=self.using):
                stored = self._sync(tasks, every=True)
                declared = {handle.name for handle in tasks}
                gone = [name for name, found in stored.items() if name not in declared and found[1]]
                if gone:
                    Task.objects.using(self.using).filter(name__in=gone).update(declared=False)
            return {}
        except (DataError, IntegrityError):
            pass
        refused: dict[str, TaskSyncError] = {}
        with transaction.atomic(using=self.using):
            for handle in tasks:
                try:
                    with transaction.atomic(using=self.using):
                        self._sync([handle], every=False)
                except (DataError, IntegrityError) as error:
                    refused[handle.name] = TaskSyncError(
                        f'the database refused the declaration of task "{handle.name[:80]}": '
                        f"{error}".strip(),
                        fix="keep the task's name to 200 characters and max_catch_up below "
                        "2**31 (the task table's limits); the other tasks run meanwhile",
                        cause=error,
                    )
            self._mark_gone(tasks)
        return refused

    def _sync(
        self, tasks: Sequence[TaskHandle], *, every: bool
    ) -> dict[str, tuple[tuple[Any, ...], bool, bool]]:
        """Create or update the rows of ``tasks``, reading ``every`` row or only theirs.

        Returns the rows read: name -> (declaration, declared, has jobs). Declarations are
        compared as plain tuples: at 100,000 tasks, model instances for every row cost seconds
        at each start.
        """
        rows = Task.objects.using(self.using).order_by()
        mirrored: Iterable[tuple[Any, ...]]
        if every and connections[self.using].vendor == "postgresql":
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql.TASK_DECLARATIONS)
                mirrored = cursor.fetchall()
        else:
            read = rows if every else rows.filter(name__in=[handle.name for handle in tasks])
            mirrored = read.values_list("name", *DECLARED, "declared", "jobs")
        stored = {
            name: (tuple(declaration), declared, bool(jobs))
            for name, *declaration, declared, jobs in mirrored
        }
        new, changed = [], []
        for handle in tasks:
            found = stored.get(handle.name)
            if found is None:
                new.append(handle)
            elif not (found[2] and found[1] and found[0] == _declared(handle)):
                changed.append(handle)
            # Unchanged: a restart does not call every task's function.
        self._insert_tasks(new)
        if changed:
            current = list(rows.filter(name__in=[handle.name for handle in changed]))
            by_name = {handle.name: handle for handle in changed}
            for task in current:
                handle = by_name[task.name]
                for key, value in zip(DECLARED, _declared(handle), strict=True):
                    setattr(task, key, value)
                task.declared = True
                task.jobs = _job_names(handle)
            rows.bulk_update(current, [*DECLARED, "jobs", "declared"])
        return stored

    def _mark_gone(self, tasks: Sequence[TaskHandle]) -> None:
        rows = Task.objects.using(self.using)
        declared = {handle.name for handle in tasks}
        stored = rows.filter(declared=True).values_list("name", flat=True)
        rows.filter(name__in=[name for name in stored if name not in declared]).update(
            declared=False
        )

    def _insert_tasks(self, handles: Sequence[TaskHandle]) -> None:
        """Rows for tasks seen for the first time; one another node just wrote is left alone."""
        if not handles:
            return
        if connections[self.using].vendor != "postgresql":
            Task.objects.using(self.using).bulk_create(
                [
                    Task(name=handle.name, jobs=_job_names(handle), **_declaration(handle))
                    for handle in handles
                ],
                ignore_conflicts=True,
            )
            return
        # In slices: one statement for 100,000 new tasks held their rows and their JSON text at
        # once, the scheduler's peak of memory for the life of the process. With more than one
        # slice, each is made in a thread (calling every task's function for its job names)
        # while PostgreSQL inserts the one before: 100,000 new tasks took 4.0 s one slice after
        # the other, 2.6 s so.
        texts: Iterable[str] = _new_task_slices(handles)
        ahead = None
        if len(handles) > SYNC_SLICE:
            ahead = Ahead(texts, chunk=1, buffered=2, closes_connections=True)
            texts = ahead.rows(0)
        try:
            with connections[self.using].cursor() as cursor:
                for text in texts:
                    cursor.execute(sql.INSERT_TASKS, [text])
        finally:
            if ahead is not None:
                ahead.close()

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        # A long IN list costs more to build and plan than reading every row does.
        every = names is None or len(names) > 500
        found: Iterable[tuple[str, datetime | None, bool]]
        if every and connections[self.using].vendor == "postgresql":
            # By a plain cursor: at 100,000 rows the ORM's per-row work is most of the cost.
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql.TASK_STATES)
                instant = instants_from_microseconds()
                found = [(name, instant(us), paused) for name, us, paused in cursor.fetchall()]
        else:
            # Unordered: sorting every row by name is work nobody reads.
            rows = Task.objects.using(self.using).order_by()
            if not every:
                rows = rows.filter(name__in=list(names or ()))
            found = rows.values_list("name", "last_fired_at", "paused")
        wanted = None if names is None else set(names)
        return {
            name: TaskState(watermark, paused)
            for name, watermark, paused in found
            if wanted is None or name in wanted
        }

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        config = get_settings()
        with transaction.atomic(using=self.using):
            if not fence(self.using):
                raise FencingLost()
            self._compare_and_set(plan.watermarks)
            if plan.skip_overlap:
                # One statement for every overlap="skip" task of the round, under the locks
                # the compare-and-set took, so no other round decides these tasks meanwhile.
                skip_overlaps(plan, jobstore.busy_occurrences(plan.skip_overlap, self.using))
            # Made after skip_overlaps: the rows are those of the occurrences still fired.
            jobs = _RoundJobs(plan, config)
            enqueued = jobstore.insert_round(jobs, using=self.using)
            self._write_records(plan, enqueued)
        self._announce(plan, jobs, enqueued)
        return enqueued

    def can_stream(self) -> bool:
        """Whether ``commit_streamed`` may run now: on PostgreSQL, outside the caller's
        transaction (task functions then run in a thread, on a connection of their own, and
        would neither see that transaction nor be able to wait on its locks)."""
        connection = connections[self.using]
        return connection.vendor == "postgresql" and not connection.in_atomic_block

    def commit_streamed(self, plan: RoundPlan, fence: Fence, streamed: Streamed) -> Enqueued:
        """``commit`` for a round whose occurrences are still being planned, in another thread.

        The watermarks are swapped first, as if every occurrence fires; the jobs are written
        as their occurrences come; once they all have, the watermarks of the tasks that failed
        are set to what ``plan`` says. One transaction, fence first, as ``commit``.
        """
        config = get_settings()
        with transaction.atomic(using=self.using):
            if not fence(self.using):
                raise FencingLost()
            self._compare_and_set(streamed.watermarks)
            at, now = instant_texts(), plan.now
            rows = (
                jobstore.scheduled_row(
                    p.job, p.data, key=p.key, task=f.task, occurrence=f.occurrence,
                    catch_up=f.catch_up, now=now, config=config, at=at,
                )
                for f in streamed.fired
                for p in f.jobs
            )  # fmt: skip
            # Ids for one job per occurrence; a round whose tasks return more takes more.
            enqueued = jobstore.insert_new(rows, streamed.occurrences, using=self.using)
            for _ in streamed.fired:
                # Read to its end already, unless a key existed: then the rest of the round is
                # planned here, before the whole round is written again.
                pass
            jobs = _RoundJobs(plan, config)
            if enqueued is None:
                # The COPY was rolled back: the whole round goes in again, reporting that key.
                enqueued = jobstore.insert_reporting(list(jobs), using=self.using)
            moved = [
                {"name": name, "watermark": new}
                for name, (_, new) in plan.watermarks.items()
                if streamed.watermarks[name][1] != new
            ]
            if moved:
                with connections[self.using].cursor() as cursor:
                    cursor.execute(sql.SET_WATERMARKS, [dumps(moved)])
            self._write_records(plan, enqueued)
        self._announce(plan, jobs, enqueued)
        return enqueued

    def _write_records(self, plan: RoundPlan, enqueued: Enqueued) -> None:
        if connections[self.using].vendor == "postgresql":
            history.copy(self._record_rows(plan, enqueued), using=self.using)
        else:
            history.write(self._records(plan, enqueued), using=self.using)

    def _record_rows(self, plan: RoundPlan, enqueued: Enqueued) -> Iterator[tuple[Any, ...]]:
        """``_records`` as COPY rows, a fired occurrence's made without its dict."""
        text, at, node = instant_texts(), plan.now, self.node_id
        for f in plan.fired:
            jobs = [
                {"job": p.job.name, "key": p.key, "created": enqueued[p.key][1]} for p in f.jobs
            ]
            yield history.fired_copy_row(
                f.task, f.occurrence, f.catch_up, jobs, at=at, node=node, text=text
            )
        for r in plan.records:
            decided = history.decided(r.task, r.outcome, r.span, detail=r.detail, at=at, node=node)
            yield history.copy_row(decided, text)

    def _announce(self, plan: RoundPlan, jobs: _RoundJobs, enqueued: Enqueued) -> None:
        if any(planned.job.backend for fired in plan.fired for planned in fired.jobs):
            from .backends import announce_round

            # Django Tasks: after commit, as enqueue() does. Only their rows are made again.
            announce_round([row for row in jobs if row["backend"]], enqueued)

    def _compare_and_set(self, watermarks: dict[str, tuple[datetime | None, datetime]]) -> None:
        """Check every watermark of the round and write the new ones, locking their rows."""
        if connections[self.using].vendor == "postgresql":
            text = instant_texts()
            rows = [(name, text(old), text(new)) for name, (old, new) in watermarks.items()]
            param = Jsonb(rows, orjson.dumps)
            [(swapped,)] = execute_bound(self.using, sql.SWAP_WATERMARKS, [param])
            if swapped != len(rows):
                # The transaction rolls back: no watermark moves, no job is written.
                found = execute_bound(self.using, sql.UNSWAPPED_WATERMARK, [param])
                raise WatermarkMoved(found[0][0] if found else next(iter(watermarks)))
            return
        names = list(watermarks)
        tasks = Task.objects.using(self.using)
        locked = list(
            tasks.select_for_update().filter(name__in=names).only("pk", "name", "last_fired_at")
        )
        _compare(watermarks, {row.name: row.last_fired_at for row in locked})
        for row in locked:
            row.last_fired_at = watermarks[row.name][1]
        tasks.bulk_update(locked, ["last_fired_at"])

    def _records(self, plan: RoundPlan, enqueued: Enqueued) -> Iterator[dict[str, Any]]:
        """The round's records, made one at a time as they are written."""
        at, node = plan.now, self.node_id
        for f in plan.fired:
            yield history.fired(
                f.task,
                f.occurrence,
                catch_up=f.catch_up,
                jobs=[history.RecordedJob(p.job.name, p.key, enqueued[p.key][1]) for p in f.jobs],
                at=at,
                node=node,
            )
        for r in plan.records:
            yield history.decided(r.task, r.outcome, r.span, detail=r.detail, at=at, node=node)

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        # Every round: occurrences are computed from this node's clock, so a skewed one fires
        # early or late. The row itself is written when due, or at once when it has news.
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
        self.node.beat(**fields)
        self._last_leader = is_leader

    def between_rounds(self) -> None:
        close_old_connections()

    def stopped(self) -> None:
        self.node.stopped(is_leader=False)


def _compare(
    watermarks: dict[str, tuple[datetime | None, datetime]], stored: dict[str, datetime | None]
) -> None:
    """Compare-and-set: every watermark must still be the one the round planned from."""
    for name, (expected, _) in watermarks.items():
        if name not in stored or stored[name] != expected:
            raise WatermarkMoved(name)


class _RoundJobs:
    """The job rows of a round, made as they are written: at 10,000 jobs, megabytes unheld."""

    def __init__(self, plan: RoundPlan, config: Settings) -> None:
        self.plan, self.config = plan, config
        self.count = sum(len(fired.jobs) for fired in plan.fired)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for fired in self.plan.fired:
            for planned in fired.jobs:
                yield _job_row(fired, planned, self.plan.now, self.config)


def _job_row(
    fired: PlannedOccurrence, planned: PlannedJob, now: datetime, config: Settings
) -> dict[str, Any]:
    return jobstore.job_fields(
        planned.job,
        planned.row_input(),
        key=planned.key,
        run_at=None,
        queue=None,
        enqueued_by="scheduler",
        now=now,
        task=fired.task,
        occurrence=fired.occurrence,
        catch_up=fired.catch_up,
        config=config,
    )


#: The task row's columns a declaration sets, in the order ``_declared`` gives them.
DECLARED = ("cron", "tz", "catch_up", "max_catch_up", "overlap")


def _declared(handle: TaskHandle) -> tuple[str, str, str, int, str]:
    return (handle.cron, handle.tz, handle.catch_up, handle.max_catch_up, handle.overlap)


def _declaration(handle: TaskHandle) -> dict[str, Any]:
    return dict(zip(DECLARED, _declared(handle), strict=True))


def _new_task_slices(handles: Sequence[TaskHandle]) -> Iterator[str]:
    """``INSERT_TASKS``' rows for ``handles``, ``SYNC_SLICE`` to a statement, as JSON text."""
    for start in range(0, len(handles), SYNC_SLICE):
        rows = [
            {"name": handle.name, **_declaration(handle), "jobs": _job_names(handle)}
            for handle in handles[start : start + SYNC_SLICE]
        ]
        yield dumps(rows)


def _job_names(handle: TaskHandle) -> list[str]:
    """The jobs a task enqueues, for the admin; a task whose function fails shows none."""
    try:
        # Only the names: at 100,000 new tasks, checking every input here cost a second.
        return [job.name for job, _ in handle.entries(check_inputs=False)]
    except Exception:
        return []
