"""Test doubles for code that uses the scheduler: a state kept in process memory.

Not a fallback: a ``Scheduler`` must be given its state, and production code passes a
``DatabaseState``. ``MemoryState`` keeps the same contract (compare-and-set watermarks, fencing,
one commit per round) so a round's logic can be tested, or reasoned about, without a database.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .handles import TaskHandle
from .planner import RoundPlan, Streamed, skip_overlaps
from .state import Fence, FencingLost, WatermarkMoved
from .store import BUSY, Enqueued, TaskState


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

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        self.heartbeats.append({"is_leader": is_leader, "round_at": round_at, "error": error})

    def between_rounds(self) -> None:
        return None

    def stopped(self) -> None:
        return None
