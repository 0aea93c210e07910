"""The overlap policy: pure adjustment of a round plan, then whole rounds on MemoryState."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ultimat3_jobs import Entry, job, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.handles import TaskHandle
from ultimat3_jobs.planner import PlannedOccurrence, RoundPlan, plan_jobs, skip_overlaps
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.testing import MemoryState

pytestmark = pytest.mark.usefixtures("fresh_registry")

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
ONE = datetime(2026, 6, 1, 1, tzinfo=UTC)


@job(name="unit.overlap.work")
def work(label: str) -> None: ...


def hourly(name: str, *, overlap: str, catch_up: str = "skip") -> TaskHandle:
    def entries(occurrence: datetime) -> list[Entry]:
        return [(work, {"label": occurrence.isoformat()})]

    entries.__qualname__ = f"hourly_{name}"
    return task(cron="0 * * * *", tz="UTC", name=name, catch_up=catch_up, overlap=overlap)(  # type: ignore[arg-type]
        entries
    )


def fired(name: str, at: datetime, *, jobs: bool = True) -> PlannedOccurrence:
    entries = [(work, {"label": at.isoformat()})] if jobs else []
    return PlannedOccurrence(name, at, False, plan_jobs(name, at, entries))


def plan_of(*occurrences: PlannedOccurrence, skip: set[str]) -> RoundPlan:
    plan = RoundPlan(now=ONE + 3 * HOUR)
    plan.fired.extend(occurrences)
    plan.skip_overlap = skip
    return plan


def test_skip_overlaps__an_earlier_busy_occurrence_skips_this_one() -> None:
    plan = plan_of(fired("a", ONE + HOUR), skip={"a"})
    [record] = skip_overlaps(plan, {"a": ONE})
    assert plan.fired == []
    assert (record.task, record.outcome) == ("a", "overlap")
    assert (record.span.first, record.span.last, record.span.count) == (ONE + HOUR, ONE + HOUR, 1)
    assert record.detail == "overlap=skip: 2026-06-01T01:00:00Z not done yet"
    assert plan.records == [record]


def test_skip_overlaps__a_busy_job_of_the_same_or_a_later_occurrence_does_not_count() -> None:
    # A backfill may have enqueued this very occurrence, or a later one, ahead of time.
    plan = plan_of(fired("a", ONE), fired("b", ONE), skip={"a", "b"})
    assert skip_overlaps(plan, {"a": ONE, "b": ONE + HOUR}) == []
    assert [f.task for f in plan.fired] == ["a", "b"]


def test_skip_overlaps__tasks_that_allow_overlap_are_left_alone() -> None:
    plan = plan_of(fired("allow", ONE + HOUR), fired("skip", ONE + HOUR), skip={"skip"})
    [record] = skip_overlaps(plan, {"allow": ONE, "skip": ONE})
    assert [f.task for f in plan.fired] == ["allow"]
    assert record.task == "skip"


def test_skip_overlaps__later_occurrences_of_one_round_wait_for_the_first() -> None:
    plan = plan_of(*(fired("a", ONE + i * HOUR) for i in range(3)), skip={"a"})
    [record] = skip_overlaps(plan, {})
    assert [f.occurrence for f in plan.fired] == [ONE]
    assert (record.span.first, record.span.last, record.span.count) == (
        ONE + HOUR,
        ONE + 2 * HOUR,
        2,
    )
    assert record.detail == "overlap=skip: 2026-06-01T01:00:00Z fired this round"


def test_skip_overlaps__an_occurrence_without_jobs_leaves_nothing_to_overlap() -> None:
    plan = plan_of(fired("a", ONE, jobs=False), fired("a", ONE + HOUR), skip={"a"})
    assert skip_overlaps(plan, {}) == []
    assert [f.occurrence for f in plan.fired] == [ONE, ONE + HOUR]


def build(*tasks: TaskHandle) -> tuple[Scheduler, MemoryState, FrozenClock]:
    state = MemoryState()
    clock = FrozenClock(T0)
    scheduler = Scheduler(state=state, clock=clock, tasks=list(tasks), drain_on_shutdown=False)
    state.sync(list(tasks))
    scheduler.tick()  # arms
    return scheduler, state, clock


def test_round__skip_records_the_overlap_and_moves_the_watermark_on() -> None:
    handle = hourly("t.exclusive", overlap="skip")
    scheduler, state, clock = build(handle)
    clock.set(ONE)
    [first] = scheduler.tick()
    assert first.occurrence == ONE
    clock.set(ONE + HOUR)
    assert scheduler.tick() == []  # the 01:00 job is still queued
    assert state.records[-1] == {
        "task": "t.exclusive",
        "outcome": "overlap",
        "span": state.records[-1]["span"],
    }
    assert state.records[-1]["span"].first == ONE + HOUR
    assert state.tasks["t.exclusive"].watermark == ONE + HOUR
    assert len(state.jobs) == 1
    # Once the 01:00 job is done, the next occurrence fires again; 02:00 never does.
    [only] = state.jobs.values()
    only["status"] = "succeeded"
    clock.set(ONE + 2 * HOUR)
    [third] = scheduler.tick()
    assert third.occurrence == ONE + 2 * HOUR
    assert sorted(row["occurrence"] for row in state.jobs.values()) == [ONE, ONE + 2 * HOUR]


def test_round__allow_fires_while_an_earlier_occurrence_is_queued() -> None:
    handle = hourly("t.shared", overlap="allow")
    scheduler, state, clock = build(handle)
    clock.set(ONE)
    scheduler.tick()
    clock.set(ONE + HOUR)
    [second] = scheduler.tick()
    assert second.occurrence == ONE + HOUR
    assert [r["outcome"] for r in state.records] == ["fired", "fired"]


@pytest.mark.parametrize("status", ["outbox", "relayed"])
def test_round__skip_waits_while_an_earlier_relayed_job_is_not_reported_done(status: str) -> None:
    handle = hourly(f"t.relayed-{status}", overlap="skip")
    scheduler, state, clock = build(handle)
    clock.set(ONE)
    scheduler.tick()
    [only] = state.jobs.values()
    only["status"] = status  # As an outbox row waits for the relay, then for its engine.
    clock.set(ONE + HOUR)
    assert scheduler.tick() == []
    only["status"] = "succeeded"
    clock.set(ONE + 2 * HOUR)
    [fired] = scheduler.tick()
    assert fired.occurrence == ONE + 2 * HOUR
