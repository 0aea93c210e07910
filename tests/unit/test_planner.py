"""One task's share of a round, planned without a clock, a leader or a database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ultimat3_jobs import Entry, job, task
from ultimat3_jobs.clock import ONE_MS
from ultimat3_jobs.cron import next_occurrence
from ultimat3_jobs.handles import JobHandle, TaskHandle
from ultimat3_jobs.planner import RoundPlan, TaskStep, plan_task

pytestmark = pytest.mark.usefixtures("fresh_registry")

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(seconds=60)


@job(name="planner.record")
def record(label: str) -> None: ...


def hourly(name: str, *, fail: bool = False) -> TaskHandle:
    def entries(occurrence: datetime) -> list[Entry]:
        if fail:
            raise RuntimeError("no entries today")
        return [(record, {"label": occurrence.isoformat()})]

    return task(cron="0 * * * *", tz="UTC", name=name)(entries)


def plan(
    handle: TaskHandle,
    watermark: datetime | None,
    *,
    paused: bool = False,
    into: RoundPlan | None = None,
    decisions: dict[tuple[object, ...], Any] | None = None,
) -> tuple[RoundPlan, TaskStep]:
    """``handle``'s share of a round at T0, added to ``into`` (else a plan of its own)."""
    result = into or RoundPlan(now=T0)
    step = plan_task(
        handle,
        watermark=watermark,
        paused=paused,
        now=T0,
        misfire_grace=GRACE,
        next_after=lambda at: next_occurrence(handle.schedule, handle.zone, at),
        plan=result,
        decisions=decisions,
    )
    return result, step


def test_plan_task__first_sight_arms_just_before_the_next_occurrence() -> None:
    result, step = plan(hourly("p.arm"), None)
    assert step.armed
    assert result.watermarks == {"p.arm": (None, T0 + timedelta(hours=1) - ONE_MS)}
    assert result.fired == [] and result.records == []


def test_plan_task__an_on_time_occurrence_fires_with_its_occurrence_key() -> None:
    result, _ = plan(hourly("p.fire"), T0 - timedelta(minutes=30))
    [fired] = result.fired
    assert fired.occurrence == T0
    assert fired.jobs[0].key.startswith(f"p.fire:{int(T0.timestamp() * 1000)}:")
    assert result.watermarks["p.fire"] == (T0 - timedelta(minutes=30), T0)


def test_plan_task__paused_records_the_span_and_fires_nothing() -> None:
    result, _ = plan(hourly("p.paused"), T0 - timedelta(hours=3, minutes=30), paused=True)
    assert result.fired == []
    [record_] = result.records
    assert (record_.outcome, record_.span.count) == ("paused", 4)  # 09:00 to 12:00
    assert result.watermarks["p.paused"][1] == T0


def test_plan_task__failing_entries_keep_the_occurrence_for_the_next_round() -> None:
    watermark = T0 - timedelta(minutes=30)
    result, step = plan(hourly("p.fails", fail=True), watermark)
    held_at, error = result.held["p.fails"]
    assert held_at == T0 and "no entries today" in str(error)
    assert step.failed is None  # The step stays the one every task decided alike shares.
    assert result.fired == []
    assert result.watermarks["p.fails"] == (watermark, T0 - ONE_MS)


def test_plan_task__tasks_decided_alike_share_one_step_and_a_failing_one_is_held_apart() -> None:
    watermark = T0 - timedelta(minutes=30)
    result = RoundPlan(now=T0)
    decisions: dict[tuple[object, ...], Any] = {}
    steps = [
        plan(handle, watermark, into=result, decisions=decisions)[1]
        for handle in (hourly("p.a"), hourly("p.b", fail=True), hourly("p.c"))
    ]
    # One object for every task of that schedule and watermark, the failing one's included:
    # its failure is the plan's, not its step's.
    assert steps[0] is steps[1] is steps[2]
    assert steps[0].next_due == T0 + timedelta(hours=1) and steps[0].failed is None
    assert list(result.held) == ["p.b"]
    assert [f.task for f in result.fired] == ["p.a", "p.c"]
    assert result.watermarks["p.b"] == (watermark, T0 - ONE_MS)
    assert result.watermarks["p.a"] == result.watermarks["p.c"] == (watermark, T0)


def test_round_plan__streaming_holds_tasks_without_touching_watermarks_being_swapped() -> None:
    watermark = T0 - timedelta(minutes=30)
    result = RoundPlan(now=T0)
    result.set_watermark("p.a", watermark, T0)
    result.set_watermark("p.b", watermark, T0)
    result.streaming = True
    swapped = result.watermarks["p.b"]
    result.hold("p.b", T0, RuntimeError("boom"))
    assert result.watermarks["p.b"] is swapped  # What the commit is swapping meanwhile.
    # Once every task has fired, the held ones' watermarks are the instant before.
    assert result.held_watermarks() == {"p.b": T0 - ONE_MS}
    assert result.watermarks == {"p.a": (watermark, T0), "p.b": (watermark, T0 - ONE_MS)}


def test_input_texts__inputs_become_their_json_text_but_a_tasks_backends_keep_their_dict() -> None:

    from ultimat3_jobs.db import dumps
    from ultimat3_jobs.planner import PlannedJob, input_texts

    own = PlannedJob(record, {"label": "x", "n": 2**70}, "k1")
    tasks_backend = PlannedJob(record, {"label": "y"}, "k2")
    tasks_backend.job = JobHandle(record.func, name="p.other", key=None, max_attempts=1, queue="q")
    tasks_backend.job.backend = "other"
    input_texts([own, tasks_backend])
    assert isinstance(own.data, str)
    # Past orjson's 64-bit integers too, embedded as JSON rather than as a string, whichever
    # encoder writes the rest.
    for rest in ("text", 2**70):
        written = json.loads(dumps({"input": own.row_input(), "rest": rest}))
        assert written == {"input": {"label": "x", "n": 2**70}, "rest": rest}
    assert tasks_backend.data == {"label": "y"}


def test_fire_task__as_text_keeps_each_input_as_the_text_of_what_the_function_returned() -> None:
    from ultimat3_jobs.catchup import decide
    from ultimat3_jobs.db import dumps
    from ultimat3_jobs.planner import fire_task

    handle = hourly("planner.as-text")
    watermark = T0 - timedelta(minutes=30)
    decision = decide(
        handle.next_after, policy="skip", max_catch_up=10, watermark=watermark, now=T0,
        misfire_grace=GRACE,
    )  # fmt: skip
    result = RoundPlan(now=T0)
    [fired] = fire_task(handle, decision, result, as_text=True)
    [planned] = fired.jobs
    assert planned.data == dumps({"label": T0.isoformat()})
    assert result.fired == [fired]


def test_fire_task__a_drain_between_two_occurrences_keeps_the_rest_for_the_next_round() -> None:
    from ultimat3_jobs.catchup import decide
    from ultimat3_jobs.planner import ONE_MS, fire_task

    calls: list[datetime] = []

    def entries(occurrence: datetime) -> list[Entry]:
        calls.append(occurrence)
        return [(record, {"label": occurrence.isoformat()})]

    # A catch-up of five hours, each call as slow as a drain is impatient.
    handle = task(cron="0 * * * *", tz="UTC", name="planner.drained", catch_up="run-all")(entries)
    decision = decide(
        handle.next_after, policy="run-all", max_catch_up=10, watermark=T0 - timedelta(hours=5),
        now=T0, misfire_grace=GRACE,
    )  # fmt: skip
    assert len(decision.fire) == 5
    result = RoundPlan(now=T0)
    result.set_watermark(handle.name, T0 - timedelta(hours=5), T0)
    fired = fire_task(handle, decision, result, stopped=lambda: len(calls) >= 2)
    assert (
        [f.occurrence for f in fired] == calls == [T0 - timedelta(hours=4), T0 - timedelta(hours=3)]
    )
    third = T0 - timedelta(hours=2)
    assert result.held == {handle.name: (third, None)}
    # The next round (another node's, once this one drained) starts from the third.
    assert result.watermarks[handle.name] == (T0 - timedelta(hours=5), third - ONE_MS)
