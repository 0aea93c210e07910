"""Catch-up decisions on a schedule given as a plain function: every 10 minutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ultimat3_jobs.catchup import COUNT_LIMIT, decide, span_between

T0 = datetime(2026, 6, 1, tzinfo=UTC)
STEP = timedelta(minutes=10)
GRACE = timedelta(seconds=60)


def every_ten_minutes(at: datetime) -> datetime:
    return T0 + (int((at - T0) / STEP) + 1) * STEP


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def run(policy: str, watermark: datetime, now: datetime, keep: int = 10):  # type: ignore[no-untyped-def]
    return decide(
        every_ten_minutes,
        policy=policy,
        max_catch_up=keep,
        watermark=watermark,
        now=now,
        misfire_grace=GRACE,
    )


@pytest.mark.parametrize("policy", ["skip", "run-once", "run-all"])
def test_decide__nothing_due_keeps_the_watermark_and_says_when_next(policy: str) -> None:
    decision = run(policy, at(0), at(9))
    assert not decision.due
    assert decision.watermark is None
    assert decision.next_due == at(10)


def test_skip__an_occurrence_exactly_grace_old_is_on_time() -> None:
    decision = run("skip", at(0), at(10) + GRACE)
    assert decision.fire == [(at(10), False)]
    assert decision.dropped is None


def test_skip__one_ms_past_grace_is_dropped() -> None:
    decision = run("skip", at(0), at(10) + GRACE + timedelta(milliseconds=1))
    assert decision.fire == []
    assert decision.dropped is not None
    assert (decision.dropped.first, decision.dropped.count) == (at(10), 1)
    assert decision.next_due == at(20)


def test_run_once__flags_catch_up_only_when_more_than_one_was_due() -> None:
    alone = run("run-once", at(0), at(10.5))
    assert alone.fire == [(at(10), False)] and alone.dropped is None
    several = run("run-once", at(0), at(45))
    assert several.fire == [(at(10), True)]
    assert several.dropped is not None
    assert (several.dropped.first, several.dropped.last, several.dropped.count) == (
        at(20),
        at(40),
        3,
    )
    assert several.watermark == at(45)


def test_run_all__keeps_the_latest_and_drops_the_rest_as_one_span() -> None:
    decision = run("run-all", at(0), at(1000.5), keep=3)
    assert [o for o, _ in decision.fire] == [at(980), at(990), at(1000)]
    assert [late for _, late in decision.fire] == [True, True, False]
    assert decision.dropped is not None
    assert (decision.dropped.first, decision.dropped.last, decision.dropped.count) == (
        at(10),
        at(970),
        97,
    )


def test_span_between__stops_counting_at_the_limit() -> None:
    span, next_due = span_between(every_ten_minutes, at(0), at(10 * (COUNT_LIMIT + 50)))
    assert span is not None
    assert span.at_least and span.count == COUNT_LIMIT
    assert next_due == at(10 * (COUNT_LIMIT + 51))
