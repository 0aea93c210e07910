"""What ``manage.py jobs_status`` reports: the scheduler, lateness, the job table, each task.

Read-only, computed at one instant from a handful of queries (nodes, one ``GROUP BY`` over
jobs, the last hour's fired occurrences, the task rows each with its last fired occurrence),
as plain data that prints as text or JSON alike. Its cost grows with the number of tasks, not
with the history kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from . import clock, history
from .cron import next_occurrence
from .db import app_database
from .errors import UltimateError
from .handles import TaskHandle
from .models import Job, JobStatus, Node, Occurrence, Outcome, Task
from .registry import registry
from .status import scheduler_status
from .zones import resolve_zone

#: Fired occurrences this far back make the lateness figures.
LATENESS_WINDOW = timedelta(hours=1)
#: At most this many of them are read.
LATENESS_SAMPLE = 10_000


@dataclass(frozen=True)
class TaskLine:
    name: str
    cron: str
    tz: str
    state: str
    next_run: datetime | None
    last_fired: datetime | None


def _node(node: Node | None) -> dict[str, Any] | None:
    if node is None:
        return None
    return {
        "node": node.node_id,
        "host": node.host,
        "pid": node.pid,
        "leader": node.leader,
        "last_seen_at": node.last_seen_at,
    }


class _NextRuns:
    """Each declared task's next run after ``now``, worked out once for every task of the same
    schedule, zone and DST options: ten thousand tasks of a few schedules cost a few walks."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self._found: dict[tuple[object, ...], datetime | None] = {}

    def of(self, name: str, cron: str, tz: str) -> datetime | None:
        handle = registry.get_task(name)
        key = (
            (cron, tz)
            if handle is None
            else (handle.schedule, handle.zone, handle.dst_gap, handle.dst_repeat)
        )
        if key not in self._found:
            self._found[key] = self._next(handle, cron, tz)
        return self._found[key]

    def _next(self, handle: TaskHandle | None, cron: str, tz: str) -> datetime | None:
        if handle is not None:
            found = handle.next_runs(1, self.now)
            return found[0] if found else None
        try:
            return next_occurrence(cron, resolve_zone(tz, "removed task"), self.now)
        except (UltimateError, ValueError):
            # A stored cron or zone this version no longer accepts.
            return None


def _state(declared: bool, paused: bool) -> str:
    if not declared:
        return "removed from code"
    return "paused" if paused else "active"


def overview(now: datetime | None = None, using: str | None = None) -> dict[str, Any]:
    """Everything ``jobs_status`` prints, as JSON-friendly data (datetimes left as datetimes)."""
    now = now or clock.now()
    using = using or app_database()
    status = scheduler_status(using=using)  # On the database's clock, as its rows are.

    by_status = {value: 0 for value in JobStatus.values}
    by_queue: dict[str, dict[str, int]] = {}
    rows = (
        Job.objects.using(using).order_by().values_list("status", "queue").annotate(n=Count("id"))
    )
    for job_status, queue, count in rows:
        by_status[job_status] = by_status.get(job_status, 0) + count
        by_queue.setdefault(queue, {value: 0 for value in JobStatus.values})[job_status] = count

    fired = list(
        Occurrence.objects.using(using)
        .filter(outcome=Outcome.FIRED, recorded_at__gte=now - LATENESS_WINDOW)
        .exclude(occurrence=None)
        .order_by("-recorded_at", "-id")
        .values_list("task", "occurrence", "recorded_at")[:LATENESS_SAMPLE]
    )
    late = [(recorded - at).total_seconds() for _, at, recorded in fired if at is not None]
    lateness = {
        "window_s": LATENESS_WINDOW.total_seconds(),
        "fired": len(fired),
        "last_s": late[0] if late else None,
        "last_task": fired[0][0] if fired else None,
        "max_s": max(late) if late else None,
        "mean_s": sum(late) / len(late) if late else None,
    }

    task_rows = (
        Task.objects.using(using)
        .order_by("name")
        .annotate(last_fired=history.last_fired(using))
        .values_list("name", "cron", "tz", "declared", "paused", "last_fired")
    )
    next_runs = _NextRuns(now)
    tasks = [
        TaskLine(
            name=name,
            cron=cron,
            tz=tz,
            state=_state(declared, paused),
            next_run=next_runs.of(name, cron, tz) if declared else None,
            last_fired=last,
        )
        for name, cron, tz, declared, paused, last in task_rows
    ]
    return {
        "now": now,
        "healthy": status.healthy,
        "leader": _node(status.leader),
        "schedulers": len(status.schedulers),
        "workers": len(status.workers),
        "last_round_at": status.last_round_at,
        "last_round_age_s": None
        if status.last_round_age is None
        else status.last_round_age.total_seconds(),
        "warnings": [{"message": w.message, "fix": w.fix} for w in status.warnings],
        "lateness": lateness,
        "jobs": {"by_status": by_status, "by_queue": by_queue},
        "tasks": [line.__dict__ for line in tasks],
    }


__all__ = ["TaskLine", "overview"]
