"""Test doubles: a scheduler state kept in process memory, and a job store that fails on cue.

Not fallbacks: a ``Scheduler`` must be given its state, and production code passes a
``DatabaseState``. ``MemoryState`` keeps the same contract (compare-and-set watermarks, fencing,
one commit per round) so a round's logic can be tested, or reasoned about, without a database.
``faulty_store`` wraps a real store so a worker meets a refused or lost write where a test says.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from .handles import TaskHandle
from .planner import RoundPlan, Streamed, skip_overlaps
from .state import Fence, FencingLost, WatermarkMoved
from .store import BUSY, Enqueued, JobStore, TaskState


class MemoryState:
    """A ``SchedulerState`` in process memory: tasks, jobs by key, records and heartbeats."""

    #: No database: a round's Django Task entries are not checked against one.
    using: str | None = None
    node_id = "local"

    def __init__(self) -> None:
        self.tasks: dict[str, TaskState] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []
        self.heartbeats: list[dict[str, Any]] = []
        self.commits = 0
        self._lock = threading.Lock()

    def sync(self, tasks: Sequence[TaskHandle]) -> None:
        with self._lock:
            for handle in tasks:
                self.tasks.setdefault(handle.name, TaskState(None))

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        with self._lock:
            wanted = self.tasks if names is None else names
            return {name: self.tasks[name] for name in wanted if name in self.tasks}

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        with self._lock:
            if not fence("memory"):
                raise FencingLost()
            for name, (expected, _) in plan.watermarks.items():
                current = self.tasks.get(name, TaskState(None)).watermark
                if current != expected:
                    raise WatermarkMoved(name)
            if plan.skip_overlap:
                skip_overlaps(plan, self._busy(plan.skip_overlap))
            enqueued: dict[str, tuple[int, bool]] = {}
            for fired in plan.fired:
                for planned in fired.jobs:
                    created = planned.key not in self.jobs
                    if created:
                        self.jobs[planned.key] = {
                            "id": len(self.jobs) + 1,
                            "job": planned.job.name,
                            "input": planned.data,
                            "task": fired.task,
                            "occurrence": fired.occurrence,
                            "catch_up": fired.catch_up,
                            "status": "queued",
                        }
                    enqueued[planned.key] = (self.jobs[planned.key]["id"], created)
                self.records.append(
                    {"task": fired.task, "outcome": "fired", "at": fired.occurrence}
                )
            for record in plan.records:
                self.records.append(
                    {"task": record.task, "outcome": record.outcome, "span": record.span}
                )
            for name, (_, new) in plan.watermarks.items():
                paused = self.tasks.get(name, TaskState(None)).paused
                self.tasks[name] = TaskState(new, paused)
            self.commits += 1
            return enqueued

    def can_stream(self) -> bool:
        return False

    def commit_streamed(self, plan: RoundPlan, fence: Fence, streamed: Streamed) -> Enqueued:
        """Not streamed (``can_stream`` says so), but the same writes: the plan once complete."""
        for _ in streamed.fired:
            pass
        plan.held_watermarks()
        return self.commit(plan, fence)

    def _busy(self, tasks: set[str]) -> dict[str, datetime]:
        """As ``JobStore.busy_occurrences``: set a job's ``status`` to finish it."""
        busy: dict[str, datetime] = {}
        for row in self.jobs.values():
            task, at = row["task"], row["occurrence"]
            if task in tasks and at is not None and row["status"] in BUSY:
                busy[task] = min(busy.get(task, at), at)
        return busy

    def pause(self, name: str, paused: bool = True) -> None:
        with self._lock:
            self.tasks[name] = TaskState(self.tasks[name].watermark, paused)

    def clock_skew(self) -> timedelta:
        return timedelta(0)  # No database to differ from.

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        self.heartbeats.append({"is_leader": is_leader, "round_at": round_at, "error": error})

    def between_rounds(self) -> None:
        return None

    def until_heartbeat(self) -> float:
        return math.inf

    def stopped(self) -> None:
        return None


#: Called before each call of a ``FaultyStore``'s method, with its name and keyword arguments:
#: an error it returns is raised instead of the call.
Fault = Callable[[str, dict[str, Any]], BaseException | None]


class FaultyStore:
    """A job store that raises what ``fault`` returns, and otherwise is ``inner``: every row it
    writes, it writes for real. ``calls`` counts the calls by method name, failed ones too."""

    def __init__(self, inner: JobStore, fault: Fault) -> None:
        self.inner = inner
        self.fault = fault
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] = self.calls.get(name, 0) + 1
                error = self.fault(name, kwargs)
            if error is not None:
                raise error
            return found(*args, **kwargs)

        return call

    def as_store(self) -> JobStore:
        """This double where a ``JobStore`` is expected: it is one, method for method."""
        return cast(JobStore, self)


def fail(
    method: str, *errors: BaseException, when: Callable[[dict[str, Any]], bool] | None = None
) -> Fault:
    """A ``Fault``: the next calls of ``method`` (those whose keyword arguments ``when``
    accepts) raise ``errors``, one call each, then every call goes through."""
    left = list(errors)

    def fault(name: str, kwargs: dict[str, Any]) -> BaseException | None:
        if name != method or not left or (when is not None and not when(kwargs)):
            return None
        return left.pop(0)

    return fault


def faults(*each: Fault) -> Fault:
    """The first error any of ``each`` returns for a call."""

    def fault(name: str, kwargs: dict[str, Any]) -> BaseException | None:
        for one in each:
            error = one(name, kwargs)
            if error is not None:
                return error
        return None

    return fault
