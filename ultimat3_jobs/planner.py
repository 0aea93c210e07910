"""A round's pure planning: what one task owes now, as jobs with their keys and records.

Nothing here reads a clock, a leader or the database: the schedule comes in as ``next_after``
and the watermark, pause and ``now`` are passed in, so a round's decisions are tested as plain
functions. The scheduler collects every task's plan into one ``RoundPlan`` and writes it in one
transaction (``state.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from .catchup import Decision, NextAfter, Span, decide, span_between
from .clock import ONE_MS
from .db import dumps
from .handles import JobHandle, TaskHandle
from .inputs import KEY_LIMIT, check_columns, occurrence_prefix


# Not frozen: a frozen dataclass's __init__ costs about four times a plain one's, and a round
# makes several of these per task.
@dataclass(slots=True)
class PlannedJob:
    job: JobHandle
    #: The input, or its JSON text (``input_texts``); "" once a streamed round wrote its row
    #: (``PlannedOccurrence.let_go``).
    data: dict[str, Any] | str
    key: str

    def row_input(self) -> dict[str, Any] | orjson.Fragment:
        """The input as a job row's fields take it: kept as text, it goes in as that JSON."""
        return orjson.Fragment(self.data) if isinstance(self.data, str) else self.data


@dataclass(slots=True)
class PlannedOccurrence:
    task: str
    occurrence: datetime
    catch_up: bool
    #: A tuple: a list's spare array, times a round's occurrences, is memory the round holds.
    jobs: tuple[PlannedJob, ...]
    #: The ``traceparent`` of the occurrence's span, which its jobs' runs continue; "" while
    #: tracing is off (``tracing.RoundTrace.fire`` sets it).
    trace_context: str = ""

    def let_go(self) -> None:
        """Let go of the inputs kept as text once their rows are made: a big round holds
        every occurrence until its report, and need not hold what it wrote already. A Django
        Task's keeps its dict, which its backend is handed after commit."""
        for planned in self.jobs:
            if isinstance(planned.data, str):
                planned.data = ""


@dataclass(slots=True)
class PlannedRecord:
    """Occurrences decided without firing: dropped, skipped while paused or for overlap."""

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
    #: Tasks declared ``overlap="skip"`` that fire this round: the commit asks which of them
    #: still have jobs of earlier occurrences, then ``skip_overlaps`` adjusts the plan.
    skip_overlap: set[str] = field(default_factory=set)
    #: The database the round is written to, which a Django Task entry's backend must use.
    database: str | None = None
    #: Tasks whose occurrences from one on are kept for the next round (``hold``): that
    #: occurrence, and the error its entries raised (None: the round stopped before it).
    held: dict[str, tuple[datetime, Exception | None]] = field(default_factory=dict)
    #: Set while the plan's occurrences are fired by another thread as the round is written
    #: (``Streamed``): ``watermarks`` are then being swapped, and ``hold`` leaves them as they
    #: are, for the commit to write the held tasks' once they have all fired.
    streaming: bool = False
    #: Each distinct (read, to write) pair of ``watermarks``, once (``set_watermark``).
    _pairs: dict[tuple[datetime | None, datetime], tuple[datetime | None, datetime]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def set_watermark(self, task: str, read: datetime | None, new: datetime) -> None:
        """``watermarks[task] = (read, new)``, the pair shared with the tasks that have the
        same: tasks decided alike (at a start, every task of a schedule) hold one tuple, not
        one each."""
        pair = (read, new)
        self.watermarks[task] = self._pairs.setdefault(pair, pair)

    def hold(self, task: str, occurrence: datetime, error: Exception | None = None) -> None:
        """Keep ``task``'s occurrences from ``occurrence`` on for the next round, everything
        before it decided: its entries raised ``error``, or the round stopped before it. Its
        watermark becomes the instant before (``held_watermarks``), and it is next due then."""
        self.held[task] = (occurrence, error)
        if not self.streaming:
            self.watermarks[task] = (self.watermarks[task][0], occurrence - ONE_MS)

    def held_watermarks(self) -> dict[str, datetime]:
        """The watermark each held task is to have, for a streamed round's commit to write once
        every occurrence has fired; ``watermarks`` then says the same."""
        moved = {task: at - ONE_MS for task, (at, _) in self.held.items()}
        for task, new in moved.items():
            self.watermarks[task] = (self.watermarks[task][0], new)
        return moved


@dataclass(slots=True)
class TaskStep:
    """What planning one task did, for the scheduler to log and reschedule: one step for every
    task decided alike, never changed once made (a task whose occurrence is held is in
    ``RoundPlan.held`` instead).

    ``next_due`` is when the task is next due; ``armed`` is set on first sight; ``dropped`` is
    the span the catch-up policy dropped; ``failed``: the schedule itself raised, before any
    occurrence was known (the task is retried next round).
    """

    next_due: datetime
    armed: bool = False
    dropped: Span | None = None
    failed: Exception | None = None


@dataclass(slots=True)
class Streamed:
    """A round whose occurrences are planned while it is written (``commit_streamed``).

    The plan's watermarks are those of every task decided, as if every occurrence fires.
    ``fired`` yields the occurrences as they are planned (each already in the plan) and ends
    once the plan is complete: its held tasks known (``RoundPlan.held_watermarks``).
    ``occurrences`` is how many were decided to fire.
    """

    fired: Iterator[PlannedOccurrence]
    occurrences: int


@dataclass(slots=True)
class Deferred:
    """A task decided to fire whose entries are still to be made (``fire_task``)."""

    handle: TaskHandle
    decision: Decision


def occurrence_key(task: str, occurrence: datetime, part: str) -> str:
    """``<task>:<occurrence_ms>:<job key>``: equal from every node for the same entry."""
    prefix = occurrence_prefix(task, occurrence)
    key = prefix + part
    if len(key) > KEY_LIMIT:
        key = prefix + hashlib.sha256(part.encode()).hexdigest()[:32]
    return key


def plan_jobs(
    task: str, occurrence: datetime, entries: Sequence[tuple[JobHandle, dict[str, Any]]]
) -> tuple[PlannedJob, ...]:
    """Keys for one occurrence's entries. Two entries never share one: a repeat gets ``#n``,
    the first ``n`` from 2 that no earlier entry's key took (a declared key may itself end in
    ``#2``).

    A key that cannot be built raises (``InvalidJobKeyError``); the caller fails that task
    alone. Every key fits the table: an over-long one hashes its job part, ``#n`` included.
    """
    used: set[str] = set()
    # Per plain key, the last n given: every "#k" below it is taken.
    last_n: dict[str, int] = {}
    planned = []
    for job, data in entries:
        check_columns(job)
        part = job.occurrence_part(data)
        plain = key = occurrence_key(task, occurrence, part)
        n = last_n.get(plain, 1)
        while key in used:
            n += 1
            key = occurrence_key(task, occurrence, f"{part}#{n}")
        last_n[plain] = n
        used.add(key)
        planned.append(PlannedJob(job, data, key))
    return tuple(planned)


def plan_task(
    handle: TaskHandle,
    *,
    watermark: datetime | None,
    paused: bool,
    now: datetime,
    misfire_grace: timedelta,
    next_after: NextAfter,
    plan: RoundPlan,
    decisions: dict[tuple[object, ...], tuple[Decision, TaskStep]] | None = None,
    deferred: list[Deferred] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> TaskStep:
    """Add one task's share of the round to ``plan``; say when it is next due.

    ``decisions``: one round's catch-up decisions and their steps, shared by tasks of the same
    schedule, zone, DST options, policy and watermark; only for a ``next_after`` that depends
    on nothing else. ``deferred``: a task due to fire goes there, its watermark written to
    ``plan`` as if every occurrence fires, for the caller to ``fire_task`` it later; else it
    fires now (``stopped`` as ``fire_task`` takes it). A task whose entries raise is held
    (``RoundPlan.hold``), its step unchanged.
    """
    name = handle.name
    if watermark is None:
        # First sight: arm at the next occurrence, never fire retroactively.
        first = next_after(now)
        plan.set_watermark(name, None, first - ONE_MS)
        return TaskStep(first, armed=True)
    if paused:
        # Nothing fires while paused; every occurrence that came due is recorded as skipped.
        span, next_due = span_between(next_after, watermark, now)
        if span is not None:
            plan.records.append(PlannedRecord(name, "paused", span, "task paused"))
            plan.set_watermark(name, watermark, now)
        return TaskStep(next_due)
    key = (
        handle.schedule,
        handle.zone,
        handle.dst_gap,
        handle.dst_repeat,
        handle.catch_up,
        handle.max_catch_up,
        watermark,
    )
    shared = decisions.get(key) if decisions is not None else None
    if shared is None:
        decision = decide(
            next_after,
            policy=handle.catch_up,
            max_catch_up=handle.max_catch_up,
            watermark=watermark,
            now=now,
            misfire_grace=misfire_grace,
        )
        # One step for every task decided alike: at 100,000 tasks all due, one object rather
        # than 100,000.
        shared = (decision, TaskStep(decision.next_due, dropped=decision.dropped))
        if decisions is not None:
            decisions[key] = shared
    decision, step = shared
    if not decision.due or decision.watermark is None:
        return step
    if decision.dropped is not None and not drops_after_firing(decision):
        plan.records.append(_dropped_record(handle, decision.dropped))
    plan.set_watermark(name, watermark, decision.watermark)
    if deferred is not None:
        deferred.append(Deferred(handle, decision))
        return step
    fire_task(handle, decision, plan, stopped=stopped)
    return step


def drops_after_firing(decision: Decision) -> bool:
    """Whether what ``decision`` drops comes after what it fires (``run-once``): then it is
    dropped only once that occurrence has fired; held (its entries raised), it is decided
    again next round, drops and all."""
    return (
        decision.dropped is not None
        and bool(decision.fire)
        and decision.dropped.first > decision.fire[-1][0]
    )


def _dropped_record(handle: TaskHandle, span: Span) -> PlannedRecord:
    return PlannedRecord(handle.name, "dropped", span, f"catch_up={handle.catch_up}")


def input_texts(planned: Sequence[PlannedJob]) -> None:
    """Each job's input as its JSON text, for a round whose rows COPY writes as they come: the
    dicts are let go as their task fires, not once the COPY has taken them (README,
    "Figures"). A job of a Django Tasks backend keeps its dict, which that backend is handed
    after commit."""
    for p in planned:
        if not p.job.backend:
            p.data = dumps(p.data)


def fire_task(
    handle: TaskHandle,
    decision: Decision,
    plan: RoundPlan,
    *,
    as_text: bool = False,
    stopped: Callable[[], bool] | None = None,
) -> list[PlannedOccurrence]:
    """Make the entries of each occurrence ``decision`` fires, add them to ``plan``, and
    return them. An occurrence whose entries fail is kept for the next round, with the ones
    after it (``RoundPlan.hold``), and so are those not reached once ``stopped()`` says so
    (a drain: the task's function may take seconds an occurrence, a catch-up many of them).
    ``as_text``: the inputs are kept as text (``input_texts``)."""
    name = handle.name
    fired: list[PlannedOccurrence] = []
    for occurrence, catch_up in decision.fire:
        if fired and stopped is not None and stopped():
            plan.hold(name, occurrence)
            break
        try:
            # Entries, input checks, keys: all of it is this task's, so all of it fails here.
            entries = handle.entries(occurrence)
            for job, _ in entries:
                # A Django Task whose backend cannot take the row (an alias not in TASKS, a
                # JobsBackend on another database) holds the occurrence until it is fixed;
                # one on another engine's backend is an outbox row, relayed after commit.
                job.check_backend(plan.database)
            planned = plan_jobs(name, occurrence, entries)
            if as_text:
                input_texts(planned)
        except Exception as error:
            # One failing task must not stop the others; its occurrence is retried next round,
            # everything before it stays decided.
            plan.hold(name, occurrence, error)
            break
        fired.append(PlannedOccurrence(name, occurrence, catch_up, planned))
        if handle.overlap == "skip":
            plan.skip_overlap.add(name)
    else:
        if decision.dropped is not None and drops_after_firing(decision):
            plan.records.append(_dropped_record(handle, decision.dropped))
    plan.fired.extend(fired)
    return fired


def skip_overlaps(plan: RoundPlan, busy: Mapping[str, datetime]) -> list[PlannedRecord]:
    """Take out of ``plan`` the occurrences an ``overlap="skip"`` task may not fire now.

    ``busy`` is, per task, the earliest occurrence that still has a job not done, read
    inside the round's transaction. An occurrence is skipped when an earlier one is busy, or
    when an earlier one with jobs fires in this same round (its jobs are queued from now on).
    The skipped ones become records (consecutive ones of a task in one record), the watermarks
    stay as planned, so a skipped occurrence is never fired later. Returns the new records.
    """
    if not plan.skip_overlap:
        return []
    kept: list[PlannedOccurrence] = []
    skipped: dict[str, list[datetime]] = {}
    reasons: dict[str, str] = {}
    fired_here: dict[str, datetime] = {}
    for fired in plan.fired:
        name = fired.task
        if name not in plan.skip_overlap:
            kept.append(fired)
            continue
        earlier = busy.get(name)
        if earlier is not None and earlier < fired.occurrence:
            reasons.setdefault(name, f"overlap=skip: {_iso(earlier)} not done yet")
        elif name in fired_here:
            reasons.setdefault(name, f"overlap=skip: {_iso(fired_here[name])} fired this round")
        else:
            kept.append(fired)
            if fired.jobs:
                fired_here[name] = fired.occurrence
            continue
        skipped.setdefault(name, []).append(fired.occurrence)
    records = [
        PlannedRecord(name, "overlap", Span(times[0], times[-1], len(times)), reasons[name])
        for name, times in skipped.items()
    ]
    plan.fired = kept
    plan.records.extend(records)
    return records


def keep_present_jobs(
    plan: RoundPlan, fired: Mapping[str, Set[datetime]], present: Container[str]
) -> None:
    """The occurrences of ``plan`` that already fired (``fired``: per task, those a backfill
    enqueued before the round reached them) keep only their jobs whose keys are ``present``:
    the round reports those and creates none, whatever the payload is now."""
    for occurrence in plan.fired:
        if occurrence.occurrence in fired.get(occurrence.task, ()):
            occurrence.jobs = tuple(p for p in occurrence.jobs if p.key in present)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")
