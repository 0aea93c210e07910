"""A round's pure planning: what one task owes now, as jobs with their keys and records.

Nothing here reads a clock, a leader or the database: the schedule comes in as ``next_after``
and the watermark, pause and ``now`` are passed in, so a round's decisions are tested as plain
functions. The scheduler collects every task's plan into one ``RoundPlan`` and writes it in one
transaction (``state.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .catchup import Decision, NextAfter, Span, decide, span_between
from .clock import ONE_MS
from .registry import JobHandle, TaskHandle

#: The longest job key the table holds; a longer occurrence key hashes its job part.
KEY_LIMIT = 255


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job: JobHandle
    data: dict[str, Any]
    key: str


@dataclass(frozen=True, slots=True)
class PlannedOccurrence:
    task: str
    occurrence: datetime
    catch_up: bool
    jobs: list[PlannedJob]


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class TaskStep:
    """What planning one task did, for the scheduler to log and reschedule.

    ``next_due`` is when the task is next due; ``armed`` is set on first sight; ``dropped`` is
    the span the catch-up policy dropped; ``failed`` is the occurrence whose entries raised,
    with the error (it is retried next round).
    """

    next_due: datetime
    armed: bool = False
    dropped: Span | None = None
    failed: tuple[datetime, Exception] | None = None


def occurrence_key(task: str, occurrence: datetime, part: str) -> str:
    """``<task>:<occurrence_ms>:<job key>``: equal from every node for the same entry."""
    ms = int(occurrence.timestamp() * 1000)
    key = f"{task}:{ms}:{part}"
    if len(key) > KEY_LIMIT:
        key = f"{task}:{ms}:{hashlib.sha256(part.encode()).hexdigest()[:32]}"
    return key


def plan_jobs(
    task: str, occurrence: datetime, entries: Sequence[tuple[JobHandle, dict[str, Any]]]
) -> list[PlannedJob]:
    """Keys for one occurrence's entries. Two entries never share one: repeats get ``#n``."""
    seen: dict[str, int] = {}
    planned = []
    for job, data in entries:
        key = occurrence_key(task, occurrence, job.occurrence_part(data))
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            key = f"{key}#{seen[key]}"
        planned.append(PlannedJob(job=job, data=data, key=key))
    return planned


def plan_task(
    handle: TaskHandle,
    *,
    watermark: datetime | None,
    paused: bool,
    now: datetime,
    misfire_grace: timedelta,
    next_after: NextAfter,
    plan: RoundPlan,
    decisions: dict[tuple[object, ...], Decision] | None = None,
) -> TaskStep:
    """Add one task's share of the round to ``plan``; say when it is next due.

    ``decisions``: one round's catch-up decisions, shared by tasks of the same schedule, zone,
    policy and watermark; only for a ``next_after`` that depends on nothing else.
    """
    name = handle.name
    if watermark is None:
        # First sight: arm at the next occurrence, never fire retroactively.
        first = next_after(now)
        plan.watermarks[name] = (None, first - ONE_MS)
        return TaskStep(first, armed=True)
    if paused:
        # Nothing fires while paused; every occurrence that came due is recorded as skipped.
        span, next_due = span_between(next_after, watermark, now)
        if span is not None:
            plan.records.append(PlannedRecord(name, "paused", span, "task paused"))
            plan.watermarks[name] = (watermark, now)
        return TaskStep(next_due)
    key = (handle.schedule, handle.zone, handle.catch_up, handle.max_catch_up, watermark)
    decision = decisions.get(key) if decisions is not None else None
    if decision is None:
        decision = decide(
            next_after,
            policy=handle.catch_up,
            max_catch_up=handle.max_catch_up,
            watermark=watermark,
            now=now,
            misfire_grace=misfire_grace,
        )
        if decisions is not None:
            decisions[key] = decision
    if not decision.due or decision.watermark is None:
        return TaskStep(decision.next_due)
    if decision.dropped is not None:
        plan.records.append(
            PlannedRecord(name, "dropped", decision.dropped, f"catch_up={handle.catch_up}")
        )
    for occurrence, catch_up in decision.fire:
        try:
            entries = handle.entries(occurrence)
        except Exception as error:
            # One failing task must not stop the others; its occurrence is retried next round,
            # everything before it stays decided.
            plan.watermarks[name] = (watermark, occurrence - ONE_MS)
            return TaskStep(occurrence, dropped=decision.dropped, failed=(occurrence, error))
        plan.fired.append(
            PlannedOccurrence(name, occurrence, catch_up, plan_jobs(name, occurrence, entries))
        )
    plan.watermarks[name] = (watermark, decision.watermark)
    return TaskStep(decision.next_due, dropped=decision.dropped)
