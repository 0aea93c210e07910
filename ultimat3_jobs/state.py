"""Where the scheduler keeps its watermarks and writes a round: in memory, or in the database.

A round's writes (jobs, occurrence records, watermarks) are one ``commit()``: one transaction,
a constant number of statements whatever the number of tasks, with leadership and every
watermark re-checked inside it, so a crash can neither lose nor repeat an occurrence.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import close_old_connections, connections, transaction

from . import clock as default_clock
from . import sql
from .catchup import Span
from .db import database_now
from .logs import emit
from .models import Job, Node, Occurrence, Task
from .queue import insert_many, job_fields, notify
from .registry import JobHandle, TaskHandle

logger = logging.getLogger("ultimat3_jobs.scheduler")

#: A clock that stays skewed is warned about again this often.
SKEW_WARNING_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class TaskState:
    watermark: datetime | None
    paused: bool = False


@dataclass(frozen=True)
class PlannedJob:
    job: JobHandle
    data: dict[str, Any]
    key: str


@dataclass(frozen=True)
class PlannedOccurrence:
    task: str
    occurrence: datetime
    catch_up: bool
    jobs: list[PlannedJob]


@dataclass(frozen=True)
class PlannedRecord:
    """Occurrences decided without firing: dropped by the policy, or skipped while paused."""

    task: str
    outcome: str
    span: Span
    detail: str = ""


@dataclass
class RoundPlan:
    now: datetime
    fired: list[PlannedOccurrence] = field(default_factory=list)
    records: list[PlannedRecord] = field(default_factory=list)
    #: task -> (watermark the round read, watermark to write)
    watermarks: dict[str, tuple[datetime | None, datetime]] = field(default_factory=dict)


class FencingLost(Exception):
    """Leadership was gone by the time the dispatch transaction checked it."""


class WatermarkMoved(Exception):
    """Another node advanced a watermark since this round read it; the round wrote nothing."""


#: key -> (job id, created)
Enqueued = dict[str, tuple[int, bool]]
Fence = Callable[[str], bool]


class SchedulerState(Protocol):
    def sync(self, tasks: Sequence[TaskHandle]) -> None:
        """Mirror the declarations; mark stored tasks no longer declared."""

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        """Watermarks of ``names`` (None: every stored task), in one read."""

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        """Write the round atomically; raise FencingLost / WatermarkMoved and write nothing."""

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        """After every round: compare clocks, and record this node's liveness (throttled)."""

    def between_rounds(self) -> None:
        """Housekeeping between two rounds of the loop."""

    def stopped(self) -> None:
        """This node has stopped."""


class MemoryState:
    """Everything in process memory: for tests and for reasoning about the round alone."""

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
            enqueued: Enqueued = {}
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

    def pause(self, name: str, paused: bool = True) -> None:
        with self._lock:
            self.tasks[name] = TaskState(self.tasks[name].watermark, paused)

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        self.heartbeats.append({"is_leader": is_leader, "round_at": round_at, "error": error})

    def between_rounds(self) -> None:
        return None

    def stopped(self) -> None:
        return None


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
        self.heartbeat_interval = heartbeat_interval
        self.clock_skew_warning = clock_skew_warning
        self.clock = clock or default_clock.now
        self._last_heartbeat: datetime | None = None
        self._started_at = self.clock()
        self._last_leader: bool | None = None
        self._skew_warned: datetime | None = None

    def sync(self, tasks: Sequence[TaskHandle]) -> None:
        with transaction.atomic(using=self.using):
            rows = Task.objects.using(self.using)
            stored = {task.name: task for task in rows.all()}
            new, changed = [], []
            for handle in tasks:
                task = stored.get(handle.name)
                fields = _declaration(handle)
                if task is None:
                    new.append(Task(name=handle.name, jobs=_job_names(handle), **fields))
                elif task.jobs and task.declared and _same(task, fields):
                    continue  # Unchanged: a restart does not call every task's function.
                else:
                    for key, value in {**fields, "declared": True}.items():
                        setattr(task, key, value)
                    task.jobs = _job_names(handle)
                    changed.append(task)
            rows.bulk_create(new, ignore_conflicts=True)
            rows.bulk_update(
                changed, ["cron", "tz", "catch_up", "max_catch_up", "jobs", "declared"]
            )
            declared = {handle.name for handle in tasks}
            gone = [name for name, task in stored.items() if name not in declared and task.declared]
            rows.filter(name__in=gone).update(declared=False)

    def load(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        rows = Task.objects.using(self.using).all()
        # A long IN list costs more to build and plan than reading every row does.
        if names is not None and len(names) <= 500:
            rows = rows.filter(name__in=list(names))
        wanted = None if names is None else set(names)
        return {
            name: TaskState(watermark, paused)
            for name, watermark, paused in rows.values_list("name", "last_fired_at", "paused")
            if wanted is None or name in wanted
        }

    def commit(self, plan: RoundPlan, fence: Fence) -> Enqueued:
        jobs = [
            _job_row(fired, planned, plan.now) for fired in plan.fired for planned in fired.jobs
        ]
        postgres = connections[self.using].vendor == "postgresql"
        with transaction.atomic(using=self.using):
            if not fence(self.using):
                raise FencingLost()
            write = self._write_postgres if postgres else self._write_portable
            enqueued = write(plan, jobs)
            notify([job["queue"] for job in jobs], using=self.using)
        return enqueued

    def _records(self, plan: RoundPlan, enqueued: Enqueued) -> list[dict[str, Any]]:
        fired = [
            {
                "task": f.task,
                "outcome": "fired",
                "occurrence": f.occurrence,
                "last_occurrence": f.occurrence,
                "count": 1,
                "catch_up": f.catch_up,
                "jobs": [
                    {"job": p.job.name, "key": p.key, "created": enqueued[p.key][1]} for p in f.jobs
                ],
                "recorded_at": plan.now,
                "node": self.node_id,
                "detail": "",
            }
            for f in plan.fired
        ]
        decided = [
            {
                "task": r.task,
                "outcome": r.outcome,
                "occurrence": r.span.first,
                "last_occurrence": r.span.last,
                "count": r.span.count,
                "catch_up": False,
                "jobs": [],
                "recorded_at": plan.now,
                "node": self.node_id,
                "detail": r.detail + (" (at least)" if r.span.at_least else ""),
            }
            for r in plan.records
        ]
        return fired + decided

    def _write_postgres(self, plan: RoundPlan, jobs: list[dict[str, Any]]) -> Enqueued:
        """A round in five statements, whatever its size (see ``sql.py``)."""
        names = list(plan.watermarks)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.LOCK_WATERMARKS, [names])
            _compare(plan, dict(cursor.fetchall()))
            enqueued: Enqueued = {}
            if jobs:
                cursor.execute(sql.INSERT_JOBS, [json.dumps(jobs, default=_isoformat)])
                enqueued = {key: (pk, True) for key, pk in cursor.fetchall()}
                existing = [job["key"] for job in jobs if job["key"] not in enqueued]
                if existing:
                    cursor.execute(sql.EXISTING_JOBS, [existing])
                    enqueued.update({key: (pk, False) for key, pk in cursor.fetchall()})
            records = self._records(plan, enqueued)
            if records:
                cursor.execute(sql.INSERT_OCCURRENCES, [json.dumps(records, default=_isoformat)])
            cursor.execute(
                sql.SET_WATERMARKS, [names, [new for _, new in plan.watermarks.values()]]
            )
        return enqueued

    def _write_portable(self, plan: RoundPlan, jobs: list[dict[str, Any]]) -> Enqueued:
        """The same round through the ORM, for SQLite and other databases."""
        tasks = Task.objects.using(self.using)
        locked = {
            row.name: row
            for row in tasks.select_for_update()
            .filter(name__in=list(plan.watermarks))
            .only("pk", "name", "last_fired_at")
        }
        _compare(plan, {name: row.last_fired_at for name, row in locked.items()})
        enqueued = insert_many([Job(**job) for job in jobs], using=self.using)
        records = [Occurrence(**record) for record in self._records(plan, enqueued)]
        Occurrence.objects.using(self.using).bulk_create(records)
        for name, (_, new) in plan.watermarks.items():
            locked[name].last_fired_at = new
        tasks.bulk_update(list(locked.values()), ["last_fired_at"])
        return enqueued

    def heartbeat(self, *, is_leader: bool, round_at: datetime | None, error: str) -> None:
        now = self.clock()
        skew_ms = self._compare_clocks(now)
        due = (
            self._last_heartbeat is None
            or now - self._last_heartbeat >= self.heartbeat_interval
            or is_leader != self._last_leader
            or bool(error)
        )
        if not due:
            return
        fields = {
            "role": "scheduler",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "leader": self.leader,
            "is_leader": is_leader,
            "started_at": self._started_at,
            "last_seen_at": now,
            "last_error": error,
            "clock_skew_ms": skew_ms,
            "stopped_at": None,
        }
        if round_at is not None:
            fields["last_round_at"] = round_at
        nodes = Node.objects.using(self.using)
        if not nodes.filter(node_id=self.node_id).update(**fields):
            nodes.create(node_id=self.node_id, **fields)
        self._last_heartbeat = now
        self._last_leader = is_leader

    def _compare_clocks(self, now: datetime) -> int:
        """Every round: this node's clock against the database's, which judges leases.

        Occurrences are computed from this node's clock, so a skewed one fires early or late.
        Warned about when it first goes past the threshold, then at most once a minute.
        """
        skew = now - database_now(self.using)
        if abs(skew) > self.clock_skew_warning:
            if self._skew_warned is None or now - self._skew_warned >= SKEW_WARNING_EVERY:
                emit(
                    logger,
                    "jobs.scheduler.clock-skew",
                    logging.WARNING,
                    node=self.node_id,
                    skew_ms=int(skew.total_seconds() * 1000),
                    fix="run NTP (chrony, systemd-timesyncd) on this host and the database "
                    "host; occurrences are computed from this node's clock",
                )
                self._skew_warned = now
        else:
            self._skew_warned = None
        return int(skew.total_seconds() * 1000)

    def between_rounds(self) -> None:
        close_old_connections()

    def stopped(self) -> None:
        Node.objects.using(self.using).filter(node_id=self.node_id).update(
            is_leader=False, stopped_at=self.clock()
        )


def _isoformat(value: datetime) -> str:
    """The one non-JSON type in a round's rows; PostgreSQL reads ISO 8601 as timestamptz."""
    return value.isoformat()


def _compare(plan: RoundPlan, stored: dict[str, datetime | None]) -> None:
    """Compare-and-set: every watermark must still be the one the round planned from."""
    for name, (expected, _) in plan.watermarks.items():
        if name not in stored or stored[name] != expected:
            raise WatermarkMoved(name)


def _job_row(fired: PlannedOccurrence, planned: PlannedJob, now: datetime) -> dict[str, Any]:
    return job_fields(
        planned.job,
        planned.data,
        key=planned.key,
        run_at=None,
        queue=None,
        enqueued_by="scheduler",
        now=now,
        task=fired.task,
        occurrence=fired.occurrence,
        catch_up=fired.catch_up,
    )


def _declaration(handle: TaskHandle) -> dict[str, Any]:
    return {
        "cron": handle.cron,
        "tz": handle.tz,
        "catch_up": handle.catch_up,
        "max_catch_up": handle.max_catch_up,
    }


def _same(task: Task, fields: dict[str, Any]) -> bool:
    return all(getattr(task, key) == value for key, value in fields.items())


def _job_names(handle: TaskHandle) -> list[str]:
    """The jobs a task enqueues, for the admin; a task whose function fails shows none."""
    try:
        return [job.name for job, _ in handle.entries()]
    except Exception:
        return []
