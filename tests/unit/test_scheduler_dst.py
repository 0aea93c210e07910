"""The scheduler walked through real DST nights with a frozen clock, one tick a minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from ultimat3_jobs import Entry, job, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.testing import MemoryState

pytestmark = pytest.mark.usefixtures("fresh_registry")


@job(name="dst.noop")
def noop() -> None: ...


def walk(cron: str, tz: str, start: datetime, hours: int, **options: Any) -> list[str]:
    def entries(occurrence: datetime) -> list[Entry]:
        return [(noop, {})]

    name = f"dst.{abs(hash((cron, tz, start, tuple(sorted(options.items())))))}"
    handle = task(cron=cron, tz=tz, name=name, **options)(entries)
    clock = FrozenClock(start)
    scheduler = Scheduler(state=MemoryState(), clock=clock, tasks=[handle], drain_on_shutdown=False)
    fired: list[str] = []
    for _ in range(hours * 60 + 1):
        fired += [d.occurrence.isoformat() for d in scheduler.tick()]
        clock.advance(timedelta(minutes=1))
    return fired


@pytest.mark.parametrize(
    ("cron", "tz", "start", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            datetime(2026, 3, 8, 4, 0, 30, tzinfo=UTC),
            ["2026-03-08T07:00:00+00:00"],
            id="ny_spring_gap_slot_fires_at_gap_end",
        ),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            datetime(2026, 11, 1, 4, 0, 30, tzinfo=UTC),
            ["2026-11-01T05:30:00+00:00"],
            id="ny_autumn_repeated_slot_fires_once",
        ),
        pytest.param(
            "0 * * * *",
            "America/New_York",
            datetime(2026, 11, 1, 4, 30, 30, tzinfo=UTC),
            [
                "2026-11-01T05:00:00+00:00",
                "2026-11-01T06:00:00+00:00",
                "2026-11-01T07:00:00+00:00",
                "2026-11-01T08:00:00+00:00",
            ],
            id="ny_autumn_hourly_fires_each_real_hour",
        ),
        pytest.param(
            "0 1 * * *",
            "Europe/London",
            datetime(2026, 3, 29, 0, 0, 30, tzinfo=UTC),
            ["2026-03-29T01:00:00+00:00"],
            id="london_spring_gap_slot_fires_at_gap_end",
        ),
    ],
)
def test_scheduler__through_a_dst_night_fires_what_the_rule_says(
    cron: str, tz: str, start: datetime, expected: list[str]
) -> None:
    assert walk(cron, tz, start, hours=4) == expected


@pytest.mark.parametrize(
    ("cron", "tz", "start", "options", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            datetime(2026, 3, 8, 4, 0, 30, tzinfo=UTC),
            {"dst_gap": "skip"},
            [],
            id="ny_spring_gap_slot_skipped",
        ),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            datetime(2026, 11, 1, 4, 0, 30, tzinfo=UTC),
            {"dst_repeat": "both"},
            ["2026-11-01T05:30:00+00:00", "2026-11-01T06:30:00+00:00"],
            id="ny_autumn_repeated_slot_fires_at_both_passes",
        ),
        pytest.param(
            "30 1 * * *",
            "Europe/London",
            datetime(2026, 10, 25, 0, 0, 30, tzinfo=UTC),
            {"dst_repeat": "both"},
            ["2026-10-25T00:30:00+00:00", "2026-10-25T01:30:00+00:00"],
            id="london_autumn_repeated_slot_fires_at_both_passes",
        ),
    ],
)
def test_scheduler__dst_options_through_a_dst_night(
    cron: str, tz: str, start: datetime, options: dict[str, str], expected: list[str]
) -> None:
    assert walk(cron, tz, start, hours=4, **options) == expected


def test_scheduler__every_quarter_hour_keeps_its_pace_through_the_repeated_hour() -> None:
    fired = walk(
        "*/15 * * * *", "America/New_York", datetime(2026, 11, 1, 4, 50, 30, tzinfo=UTC), 3
    )
    instants = [datetime.fromisoformat(f) for f in fired]
    assert len(instants) == 12
    assert all(b - a == timedelta(minutes=15) for a, b in pairwise(instants))
