"""The DST rule of SPEC §3 on real zones. Every expected instant is worked out by hand.

Transitions used (checked against the tz database):

- America/New_York 2026: 03-08 07:00Z, 02:00 EST -> 03:00 EDT (gap 02:00-03:00 local);
  11-01 06:00Z, 02:00 EDT -> 01:00 EST (01:00-02:00 local twice).
- Europe/London 2026: 03-29 01:00Z, gap 01:00-02:00 local; 10-25 01:00Z, 01:00-02:00 twice.
- Europe/Paris 2026: 03-29 01:00Z, gap 02:00-03:00 local.
- Australia/Lord_Howe 2026 (half-hour DST): 04-04 15:00Z, +11 -> +10:30, 01:30-02:00 local
  twice on 04-05; 10-03 15:30Z, +10:30 -> +11, gap 02:00-02:30 local on 10-04.
- America/Santiago 2026: 04-05 03:00Z, -03 -> -04, 23:00-00:00 local twice on 04-04;
  09-06 04:00Z, -04 -> -03, gap 00:00-01:00 local: midnight of 09-06 does not exist.
- America/Havana 2026: 11-01 05:00Z, 01:00 CDT -> 00:00 CST, 00:00-01:00 local twice.
- Pacific/Apia 2011: 12-30 10:00Z, -10 -> +14: local 2011-12-29 23:59:59 is followed by
  2011-12-31 00:00:00, so the date 2011-12-30 never existed there.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from ultimat3_jobs.cron import (
    OccurrenceKind,
    between,
    check_dst_options,
    describe_occurrence,
    next_occurrence,
    occurrences,
)
from ultimat3_jobs.errors import InvalidDstOptionError

NEW_YORK = ZoneInfo("America/New_York")


def utc(text: str) -> datetime:
    """``"2026-03-08T07:00:00Z"`` as an aware UTC datetime."""
    return datetime.fromisoformat(text.removesuffix("Z")).replace(tzinfo=UTC)


def iso(values: list[datetime]) -> list[str]:
    return [value.strftime("%Y-%m-%dT%H:%M:%SZ") for value in values]


def first(expr: str, tz: str, after: datetime, count: int) -> list[str]:
    found = []
    for occurrence in occurrences(expr, tz, after):
        found.append(occurrence)
        if len(found) == count:
            break
    return iso(found)


CASES = [
    # --- SPEC's New York examples --------------------------------------------------------------
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00:00Z",
        ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
        id="ny_spring_gap_0230",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T00:00:00Z",
        ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
        id="ny_fall_repeat_0130_once",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T03:30:00Z",
        [
            "2026-11-01T04:00:00Z",
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z",
            "2026-11-01T08:00:00Z",
        ],
        id="ny_fall_hourly_real_time",
    ),
    # --- more New York ---------------------------------------------------------------------------
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-03-08T05:30:00Z",
        ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"],
        id="ny_spring_hourly_skips_0200",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-03-08T06:40:00Z",
        ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"],
        id="ny_spring_every_15",
    ),
    pytest.param(
        "0,15,30,45 2 * * *",
        "America/New_York",
        "2026-03-07T00:00:00Z",
        [
            "2026-03-07T07:00:00Z",
            "2026-03-07T07:15:00Z",
            "2026-03-07T07:30:00Z",
            "2026-03-07T07:45:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-09T06:00:00Z",
            "2026-03-09T06:15:00Z",
        ],
        id="ny_spring_four_slots_in_gap_fire_once",
    ),
    pytest.param(
        "0 1-3 * * *",
        "America/New_York",
        "2026-03-08T00:00:00Z",
        ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-09T05:00:00Z"],
        id="ny_spring_gap_slot_and_0300_share_an_instant",
    ),
    pytest.param(
        "0 1-2 * * *",
        "America/New_York",
        "2026-11-01T00:00:00Z",
        ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-02T06:00:00Z"],
        id="ny_fall_wall_range_first_pass_only",
    ),
    pytest.param(
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T00:00:00Z",
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:20:00Z",
            "2026-11-01T05:40:00Z",
            "2026-11-02T06:00:00Z",
        ],
        id="ny_fall_wall_every_20_in_hour_1",
    ),
    # --- after inside the second pass of a repeated hour ---------------------------------------
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        ["2026-11-02T06:30:00Z"],
        id="ny_after_in_second_pass_wall_same_slot",
    ),
    pytest.param(
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        ["2026-11-02T06:00:00Z"],
        id="ny_after_in_second_pass_wall_later_slots",
    ),
    pytest.param(
        "0 1,2 * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        ["2026-11-01T07:00:00Z"],
        id="ny_after_in_second_pass_wall_next_hour",
    ),
    pytest.param(
        "*/10 * 1 * * *",
        "America/New_York",
        "2026-11-01T06:00:05Z",
        ["2026-11-02T06:00:00Z", "2026-11-02T06:00:10Z"],
        id="ny_after_in_second_pass_wall_per_10_seconds",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        ["2026-11-01T06:15:00Z", "2026-11-01T06:30:00Z"],
        id="ny_after_in_second_pass_real_time",
    ),
    pytest.param(
        "30 * * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        ["2026-11-01T06:30:00Z", "2026-11-01T07:30:00Z"],
        id="ny_after_in_second_pass_real_time_hourly",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T05:10:00Z",
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
        id="ny_after_in_first_pass_wall",
    ),
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-08T06:59:59Z",
        ["2026-03-08T07:00:00Z"],
        id="ny_after_just_before_gap_end",
    ),
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-08T07:00:00Z",
        ["2026-03-09T06:30:00Z"],
        id="ny_after_at_gap_end",
    ),
    # --- seconds across a gap ------------------------------------------------------------------
    pytest.param(
        "30 59 1,2 * * *",
        "America/New_York",
        "2026-03-08T00:00:00Z",
        ["2026-03-08T06:59:30Z", "2026-03-08T07:00:00Z", "2026-03-09T05:59:30Z"],
        id="ny_spring_seconds_wall",
    ),
    pytest.param(
        "*/15 30 2 * * *",
        "America/New_York",
        "2026-03-08T00:00:00Z",
        [
            "2026-03-08T07:00:00Z",
            "2026-03-09T06:30:00Z",
            "2026-03-09T06:30:15Z",
            "2026-03-09T06:30:30Z",
        ],
        id="ny_spring_seconds_four_slots_in_gap_fire_once",
    ),
    pytest.param(
        "*/20 59,0 * * * *",
        "America/New_York",
        "2026-03-08T06:59:30Z",
        [
            "2026-03-08T06:59:40Z",
            "2026-03-08T07:00:00Z",
            "2026-03-08T07:00:20Z",
            "2026-03-08T07:00:40Z",
            "2026-03-08T07:59:00Z",
        ],
        id="ny_spring_seconds_real_time",
    ),
    # --- Vixie day-of-month OR day-of-week across DST ------------------------------------------
    pytest.param(
        "30 2 8 * 0",
        "America/New_York",
        "2026-03-02T00:00:00Z",
        [
            "2026-03-08T07:00:00Z",
            "2026-03-15T06:30:00Z",
            "2026-03-22T06:30:00Z",
            "2026-03-29T06:30:00Z",
            "2026-04-05T06:30:00Z",
            "2026-04-08T06:30:00Z",
        ],
        id="ny_vixie_or_spring",
    ),
    pytest.param(
        "30 1 1 * 0",
        "America/New_York",
        "2026-10-26T00:00:00Z",
        ["2026-11-01T05:30:00Z", "2026-11-08T06:30:00Z"],
        id="ny_vixie_or_fall",
    ),
    # --- Europe ----------------------------------------------------------------------------------
    pytest.param(
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T00:00:00Z",
        ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        id="london_spring_gap_0130",
    ),
    pytest.param(
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T00:00:00Z",
        ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        id="london_fall_repeat_0130",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/London",
        "2026-03-29T00:30:00Z",
        ["2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"],
        id="london_spring_hourly",
    ),
    pytest.param(
        "*/30 * * * *",
        "Europe/London",
        "2026-10-25T00:00:00Z",
        [
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z",
        ],
        id="london_fall_every_30_both_passes",
    ),
    pytest.param(
        "0 2 * * *",
        "Europe/Paris",
        "2026-03-27T12:00:00Z",
        ["2026-03-28T01:00:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"],
        id="paris_spring_gap_0200",
    ),
    # --- Lord Howe: 30-minute DST ----------------------------------------------------------------
    pytest.param(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T00:00:00Z",
        ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
        id="lord_howe_april_repeat_wall",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T14:20:00Z",
        [
            "2026-04-04T14:30:00Z",
            "2026-04-04T14:45:00Z",
            "2026-04-04T15:00:00Z",
            "2026-04-04T15:15:00Z",
            "2026-04-04T15:30:00Z",
        ],
        id="lord_howe_april_repeat_real_time",
    ),
    pytest.param(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T00:00:00Z",
        ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
        id="lord_howe_october_gap_wall",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T15:00:00Z",
        ["2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"],
        id="lord_howe_october_gap_real_time",
    ),
    # --- Santiago: DST changes at midnight -------------------------------------------------------
    pytest.param(
        "0 0 * * *",
        "America/Santiago",
        "2026-09-04T12:00:00Z",
        ["2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"],
        id="santiago_spring_midnight_moves_to_0100",
    ),
    pytest.param(
        "0 * * * *",
        "America/Santiago",
        "2026-09-06T02:30:00Z",
        ["2026-09-06T03:00:00Z", "2026-09-06T04:00:00Z", "2026-09-06T05:00:00Z"],
        id="santiago_spring_hourly_real_time",
    ),
    pytest.param(
        "30 23 * * *",
        "America/Santiago",
        "2026-04-03T12:00:00Z",
        ["2026-04-04T02:30:00Z", "2026-04-05T02:30:00Z", "2026-04-06T03:30:00Z"],
        id="santiago_autumn_repeat_2330",
    ),
    pytest.param(
        "0 0 * * *",
        "America/Santiago",
        "2026-04-03T12:00:00Z",
        ["2026-04-04T03:00:00Z", "2026-04-05T04:00:00Z", "2026-04-06T04:00:00Z"],
        id="santiago_autumn_midnight_once",
    ),
    pytest.param(
        "0 * * * *",
        "America/Santiago",
        "2026-04-05T01:30:00Z",
        ["2026-04-05T02:00:00Z", "2026-04-05T03:00:00Z", "2026-04-05T04:00:00Z"],
        id="santiago_autumn_hourly_both_passes",
    ),
    # --- Havana: DST ends at 01:00 CDT -> 00:00 CST on 2026-11-01 (05:00Z) -----------------------
    pytest.param(
        # From January the next wall match is 00:30 on 1 November, read with the winter offset
        # it is the second pass: the summer in between must be noticed to fire the first pass.
        "30 * 1 11 *",
        "America/Havana",
        "2026-01-15T00:00:00Z",
        ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"],
        id="havana_real_time_far_candidate_across_a_summer",
    ),
    # --- New York 1883-11-18 17:00Z: 12:03:58 local mean time (-4:56:02) -> 12:00:00 EST ----
    # Whole local minutes of mean time fall 2 seconds past the UTC minute.
    pytest.param(
        "* * * * *",
        "America/New_York",
        "1883-11-18T16:57:30Z",
        [
            "1883-11-18T16:58:02Z",
            "1883-11-18T16:59:02Z",
            "1883-11-18T17:00:00Z",
            "1883-11-18T17:01:00Z",
        ],
        id="ny_1883_mean_time_real_time",
    ),
    pytest.param(
        "* 12 18 11 *",
        "America/New_York",
        "1883-11-18T16:55:00Z",
        [
            "1883-11-18T16:56:02Z",
            "1883-11-18T16:57:02Z",
            "1883-11-18T16:58:02Z",
            "1883-11-18T16:59:02Z",
            "1883-11-18T17:04:00Z",
            "1883-11-18T17:05:00Z",
        ],
        id="ny_1883_mean_time_wall_clock",
    ),
    pytest.param(
        "* 12 18 11 *",
        "America/New_York",
        "1883-11-18T17:01:30Z",
        ["1883-11-18T17:04:00Z"],
        id="ny_1883_after_in_second_pass_of_a_4_minute_repeat",
    ),
    # --- Apia: a whole local date that never existed -------------------------------------------
    pytest.param(
        "0 3 * * *",
        "Pacific/Apia",
        "2011-12-28T00:00:00Z",
        [
            "2011-12-28T13:00:00Z",
            "2011-12-29T13:00:00Z",
            "2011-12-30T13:00:00Z",
            "2011-12-31T13:00:00Z",
        ],
        id="apia_missing_day_0300_dropped",
    ),
    pytest.param(
        "0 0 * * *",
        "Pacific/Apia",
        "2011-12-29T00:00:00Z",
        ["2011-12-29T10:00:00Z", "2011-12-30T10:00:00Z", "2011-12-31T10:00:00Z"],
        id="apia_missing_day_midnight",
    ),
    pytest.param(
        "0 12 30 12 *",
        "Pacific/Apia",
        "2011-06-01T00:00:00Z",
        ["2012-12-29T22:00:00Z"],
        id="apia_yearly_slot_on_the_missing_day",
    ),
    pytest.param(
        "0 * * * *",
        "Pacific/Apia",
        "2011-12-30T08:30:00Z",
        ["2011-12-30T09:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T11:00:00Z"],
        id="apia_real_time_hourly",
    ),
    pytest.param(
        "0 */6 * * *",
        "Pacific/Apia",
        "2011-12-29T00:00:00Z",
        # 18:00 and 00:00 local on 12-28/12-29 (-10), then 00:00 on 12-31 (+14) at the change.
        [
            "2011-12-29T04:00:00Z",
            "2011-12-29T10:00:00Z",
            "2011-12-29T16:00:00Z",
            "2011-12-29T22:00:00Z",
            "2011-12-30T04:00:00Z",
            "2011-12-30T10:00:00Z",
            "2011-12-30T16:00:00Z",
        ],
        id="apia_real_time_every_6h",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), CASES)
def test_occurrences__dst(expr: str, tz: str, after: str, expected: list[str]) -> None:
    assert first(expr, tz, utc(after), len(expected)) == expected


def test_between__every_15_minutes_through_ny_fall_back() -> None:
    found = between(
        "*/15 * * * *",
        "America/New_York",
        utc("2026-11-01T04:59:59Z"),
        utc("2026-11-01T06:59:59Z"),
    )
    assert iso(found) == [
        "2026-11-01T05:00:00Z",
        "2026-11-01T05:15:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T05:45:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T06:15:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-01T06:45:00Z",
    ]


def test_between__latest_across_a_repeated_hour() -> None:
    found = between(
        "*/30 * * * *",
        "America/New_York",
        utc("2026-10-31T00:00:00Z"),
        utc("2026-11-01T06:40:00Z"),
        limit=3,
        keep="latest",
    )
    assert iso(found) == ["2026-11-01T05:30:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:30:00Z"]


# --- `after` given as a wall time inside a gap -------------------------------------------------
# Python reads a non-existent wall time with the offset before the gap when fold=0 and the one
# after it when fold=1 (PEP 495); `after` is that instant.


@pytest.mark.parametrize(
    ("expr", "fold", "expected"),
    [
        # fold=0: 02:15 EST = 07:15Z, already past the gap end where 02:30 fired.
        pytest.param("30 2 * * *", 0, "2026-03-09T06:30:00Z", id="wall_fold0"),
        # fold=1: 02:15 EDT = 06:15Z, before the gap end.
        pytest.param("30 2 * * *", 1, "2026-03-08T07:00:00Z", id="wall_fold1"),
        pytest.param("*/15 * * * *", 0, "2026-03-08T07:30:00Z", id="real_time_fold0"),
        pytest.param("*/15 * * * *", 1, "2026-03-08T06:30:00Z", id="real_time_fold1"),
    ],
)
def test_next_occurrence__after_is_a_wall_time_inside_a_gap(
    expr: str, fold: int, expected: str
) -> None:
    after = datetime(2026, 3, 8, 2, 15, tzinfo=NEW_YORK, fold=fold)
    assert iso([next_occurrence(expr, NEW_YORK, after)]) == [expected]


def test_next_occurrence__after_in_second_pass_given_in_the_zone() -> None:
    second_pass = datetime(2026, 11, 1, 1, 10, tzinfo=NEW_YORK, fold=1)
    assert iso([next_occurrence("30 1 * * *", NEW_YORK, second_pass)]) == ["2026-11-02T06:30:00Z"]
    assert iso([next_occurrence("*/15 * * * *", NEW_YORK, second_pass)]) == ["2026-11-01T06:15:00Z"]


# --- describe_occurrence ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "occurrence", "kind"),
    [
        pytest.param(
            "30 2 * * *", "America/New_York", "2026-03-08T07:00:00Z", "gap-shifted", id="gap"
        ),
        pytest.param("30 2 * * *", "America/New_York", "2026-03-09T06:30:00Z", "normal", id="ok"),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            "2026-11-01T05:30:00Z",
            "repeated-first",
            id="wall_first_pass",
        ),
        pytest.param(
            "*/15 * * * *",
            "America/New_York",
            "2026-11-01T05:15:00Z",
            "repeated-first",
            id="real_time_first_pass",
        ),
        pytest.param(
            "*/15 * * * *",
            "America/New_York",
            "2026-11-01T06:15:00Z",
            "repeated",
            id="real_time_second_pass",
        ),
        # 03:00 EDT is a slot of its own as well as the gap end for 02:00: not a shifted firing.
        pytest.param(
            "0 2,3 * * *", "America/New_York", "2026-03-08T07:00:00Z", "normal", id="gap_end_slot"
        ),
        pytest.param(
            "0 0 * * *",
            "America/Santiago",
            "2026-09-06T04:00:00Z",
            "gap-shifted",
            id="santiago_midnight",
        ),
        pytest.param(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T14:45:00Z",
            "repeated-first",
            id="lord_howe_first_pass",
        ),
    ],
)
def test_describe_occurrence(expr: str, tz: str, occurrence: str, kind: OccurrenceKind) -> None:
    assert describe_occurrence(expr, tz, utc(occurrence)) == kind


@pytest.mark.parametrize(
    ("expr", "occurrence"),
    [
        pytest.param("30 2 * * *", "2026-03-08T07:30:00Z", id="not_a_slot"),
        pytest.param("30 1 * * *", "2026-11-01T06:30:00Z", id="wall_second_pass"),
        pytest.param("30 2 * * *", "2026-03-09T06:30:00.5Z", id="fraction_of_a_second"),
    ],
)
def test_describe_occurrence__refuses_a_non_occurrence(expr: str, occurrence: str) -> None:
    with pytest.raises(ValueError, match="not an occurrence"):
        describe_occurrence(expr, "America/New_York", utc(occurrence))


# --- per-task DST options for wall-clock schedules -------------------------------------------
# dst_gap="skip": a slot inside a gap does not fire that day. dst_repeat="both": a repeated slot
# fires at both of its instants. Real-time schedules ignore both.

OPTION_CASES = [
    # --- New York ------------------------------------------------------------------------------
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00:00Z",
        {"dst_gap": "skip"},
        ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"],
        id="ny_spring_gap_0230_skip",
    ),
    pytest.param(
        "0,15,30,45 2 * * *",
        "America/New_York",
        "2026-03-07T00:00:00Z",
        {"dst_gap": "skip"},
        [
            "2026-03-07T07:00:00Z",
            "2026-03-07T07:15:00Z",
            "2026-03-07T07:30:00Z",
            "2026-03-07T07:45:00Z",
            "2026-03-09T06:00:00Z",
        ],
        id="ny_spring_four_slots_in_gap_skip",
    ),
    pytest.param(
        # 03:00 EDT is a slot of its own: skipping 02:00 does not drop it.
        "0 1-3 * * *",
        "America/New_York",
        "2026-03-08T00:00:00Z",
        {"dst_gap": "skip"},
        ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-09T05:00:00Z"],
        id="ny_spring_gap_end_slot_kept_under_skip",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T00:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-10-31T05:30:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:30:00Z",
        ],
        id="ny_fall_repeat_0130_both",
    ),
    pytest.param(
        # Every first pass comes before every second pass: 01:00, 01:20, 01:40 EDT, then EST.
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T00:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:20:00Z",
            "2026-11-01T05:40:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T06:20:00Z",
            "2026-11-01T06:40:00Z",
            "2026-11-02T06:00:00Z",
        ],
        id="ny_fall_every_20_in_hour_1_both",
    ),
    pytest.param(
        # 02:00 is not repeated (the window is 01:00-02:00): it fires once, at 02:00 EST.
        "0 1-2 * * *",
        "America/New_York",
        "2026-11-01T00:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z",
            "2026-11-02T06:00:00Z",
        ],
        id="ny_fall_wall_range_both",
    ),
    pytest.param(
        # After the last first-pass slot, the second pass of the same slot is next.
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T05:31:00Z",
        {"dst_repeat": "both"},
        ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"],
        id="ny_after_in_first_pass_past_the_last_slot_both",
    ),
    pytest.param(
        # 01:45 EDT: no first-pass slot left, so 01:00 EST is next.
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T05:45:00Z",
        {"dst_repeat": "both"},
        ["2026-11-01T06:00:00Z", "2026-11-01T06:20:00Z"],
        id="ny_after_in_first_pass_both",
    ),
    pytest.param(
        "*/20 1 * * *",
        "America/New_York",
        "2026-11-01T06:10:00Z",
        {"dst_repeat": "both"},
        ["2026-11-01T06:20:00Z", "2026-11-01T06:40:00Z", "2026-11-02T06:00:00Z"],
        id="ny_after_in_second_pass_both",
    ),
    pytest.param(
        "*/30 59 1 * * *",
        "America/New_York",
        "2026-11-01T05:59:00Z",
        {"dst_repeat": "both"},
        [
            "2026-11-01T05:59:30Z",
            "2026-11-01T06:59:00Z",
            "2026-11-01T06:59:30Z",
            "2026-11-02T06:59:00Z",
        ],
        id="ny_fall_seconds_both",
    ),
    pytest.param(
        "30 1,2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        {"dst_gap": "skip", "dst_repeat": "both"},
        ["2026-03-08T06:30:00Z", "2026-03-09T05:30:00Z", "2026-03-09T06:30:00Z"],
        id="ny_spring_skip_with_both",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T03:30:00Z",
        {"dst_repeat": "first"},
        [
            "2026-11-01T04:00:00Z",
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z",
        ],
        id="ny_fall_real_time_ignores_first",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-03-08T06:40:00Z",
        {"dst_gap": "skip"},
        ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"],
        id="ny_spring_real_time_ignores_skip",
    ),
    pytest.param(
        # 1883-11-18: 12:03:58 mean time -> 12:00:00 EST, so 12:00-12:03 pass twice.
        "* 12 18 11 *",
        "America/New_York",
        "1883-11-18T16:55:00Z",
        {"dst_repeat": "both"},
        [
            "1883-11-18T16:56:02Z",
            "1883-11-18T16:57:02Z",
            "1883-11-18T16:58:02Z",
            "1883-11-18T16:59:02Z",
            "1883-11-18T17:00:00Z",
            "1883-11-18T17:01:00Z",
            "1883-11-18T17:02:00Z",
            "1883-11-18T17:03:00Z",
            "1883-11-18T17:04:00Z",
        ],
        id="ny_1883_four_minute_repeat_both",
    ),
    # --- Europe/London -------------------------------------------------------------------------
    pytest.param(
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T00:00:00Z",
        {"dst_gap": "skip"},
        ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"],
        id="london_spring_gap_0130_skip",
    ),
    pytest.param(
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T00:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-10-24T00:30:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-26T01:30:00Z",
        ],
        id="london_fall_repeat_0130_both",
    ),
    pytest.param(
        "*/30 * * * *",
        "Europe/London",
        "2026-10-25T00:00:00Z",
        {"dst_repeat": "first"},
        [
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z",
        ],
        id="london_fall_real_time_ignores_first",
    ),
    # --- Australia/Lord_Howe: 30-minute DST ----------------------------------------------------
    pytest.param(
        # 01:45 on 04-05 is 14:45Z at +11 and 15:15Z at +10:30.
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T00:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-04-03T14:45:00Z",
            "2026-04-04T14:45:00Z",
            "2026-04-04T15:15:00Z",
            "2026-04-05T15:15:00Z",
        ],
        id="lord_howe_april_repeat_both",
    ),
    pytest.param(
        # 02:15 on 10-04 does not exist (02:00-02:30 is skipped).
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T00:00:00Z",
        {"dst_gap": "skip"},
        ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"],
        id="lord_howe_october_gap_skip",
    ),
    pytest.param(
        # 02:00 and 02:15 are skipped; 02:30, the gap end, is a slot of its own.
        "0,15,30 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00:00Z",
        {"dst_gap": "skip"},
        ["2026-10-03T15:30:00Z", "2026-10-04T15:00:00Z", "2026-10-04T15:15:00Z"],
        id="lord_howe_october_gap_end_slot_kept_under_skip",
    ),
    # --- America/Santiago: DST changes at midnight ---------------------------------------------
    pytest.param(
        "0 0 * * *",
        "America/Santiago",
        "2026-09-04T12:00:00Z",
        {"dst_gap": "skip"},
        ["2026-09-05T04:00:00Z", "2026-09-07T03:00:00Z"],
        id="santiago_spring_midnight_skip",
    ),
    pytest.param(
        "30 23 * * *",
        "America/Santiago",
        "2026-04-03T12:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-04-04T02:30:00Z",
            "2026-04-05T02:30:00Z",
            "2026-04-05T03:30:00Z",
            "2026-04-06T03:30:00Z",
        ],
        id="santiago_autumn_repeat_2330_both",
    ),
    pytest.param(
        "0,30 23 * * *",
        "America/Santiago",
        "2026-04-05T01:00:00Z",
        {"dst_repeat": "both"},
        [
            "2026-04-05T02:00:00Z",
            "2026-04-05T02:30:00Z",
            "2026-04-05T03:00:00Z",
            "2026-04-05T03:30:00Z",
            "2026-04-06T03:00:00Z",
        ],
        id="santiago_autumn_two_slots_both",
    ),
    pytest.param(
        # The repeated window is 23:00-00:00: midnight itself passes once.
        "0 0 * * *",
        "America/Santiago",
        "2026-04-03T12:00:00Z",
        {"dst_repeat": "both"},
        ["2026-04-04T03:00:00Z", "2026-04-05T04:00:00Z", "2026-04-06T04:00:00Z"],
        id="santiago_autumn_midnight_once_under_both",
    ),
    # --- America/Havana: 00:00-01:00 passes twice on 2026-11-01 --------------------------------
    pytest.param(
        "30 0 * * *",
        "America/Havana",
        "2026-10-31T12:00:00Z",
        {"dst_repeat": "both"},
        ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T05:30:00Z"],
        id="havana_fall_repeat_0030_both",
    ),
    # --- Pacific/Apia: a date that never existed has no slots to skip or shift -----------------
    pytest.param(
        "0 3 * * *",
        "Pacific/Apia",
        "2011-12-28T00:00:00Z",
        {"dst_gap": "skip"},
        [
            "2011-12-28T13:00:00Z",
            "2011-12-29T13:00:00Z",
            "2011-12-30T13:00:00Z",
            "2011-12-31T13:00:00Z",
        ],
        id="apia_missing_day_skip",
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "options", "expected"), OPTION_CASES)
def test_occurrences__dst_options(
    expr: str, tz: str, after: str, options: dict[str, Any], expected: list[str]
) -> None:
    found = []
    for occurrence in occurrences(expr, tz, utc(after), **options):
        found.append(occurrence)
        if len(found) == len(expected):
            break
    assert iso(found) == expected
    assert iso([next_occurrence(expr, tz, utc(after), **options)]) == expected[:1]


def test_between__latest_across_a_repeated_hour_under_both() -> None:
    found = between(
        "30 1 * * *",
        "America/New_York",
        utc("2026-10-30T00:00:00Z"),
        utc("2026-11-01T07:00:00Z"),
        limit=2,
        keep="latest",
        dst_repeat="both",
    )
    assert iso(found) == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]


@pytest.mark.parametrize(
    ("expr", "tz", "occurrence", "options", "kind"),
    [
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            "2026-11-01T05:30:00Z",
            {"dst_repeat": "both"},
            "repeated-first",
            id="ny_first_pass_both",
        ),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            "2026-11-01T06:30:00Z",
            {"dst_repeat": "both"},
            "repeated",
            id="ny_second_pass_both",
        ),
        pytest.param(
            "0 2,3 * * *",
            "America/New_York",
            "2026-03-08T07:00:00Z",
            {"dst_gap": "skip"},
            "normal",
            id="ny_gap_end_slot_skip",
        ),
        pytest.param(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T15:15:00Z",
            {"dst_repeat": "both"},
            "repeated",
            id="lord_howe_second_pass_both",
        ),
        pytest.param(
            "30 23 * * *",
            "America/Santiago",
            "2026-04-05T03:30:00Z",
            {"dst_repeat": "both"},
            "repeated",
            id="santiago_second_pass_both",
        ),
        pytest.param(
            "30 1 * * *",
            "Europe/London",
            "2026-03-29T01:00:00Z",
            {"dst_gap": "end-of-gap"},
            "gap-shifted",
            id="london_gap_end_of_gap",
        ),
    ],
)
def test_describe_occurrence__under_dst_options(
    expr: str, tz: str, occurrence: str, options: dict[str, Any], kind: OccurrenceKind
) -> None:
    assert describe_occurrence(expr, tz, utc(occurrence), **options) == kind


@pytest.mark.parametrize(
    ("expr", "tz", "occurrence", "options"),
    [
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            "2026-03-08T07:00:00Z",
            {"dst_gap": "skip"},
            id="ny_gap_end_skip",
        ),
        pytest.param(
            "0 0 * * *",
            "America/Santiago",
            "2026-09-06T04:00:00Z",
            {"dst_gap": "skip"},
            id="santiago_midnight_skip",
        ),
        pytest.param(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-04T15:15:00Z",
            {"dst_repeat": "first"},
            id="lord_howe_second_pass_first",
        ),
    ],
)
def test_describe_occurrence__refuses_what_the_options_do_not_fire(
    expr: str, tz: str, occurrence: str, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match="not an occurrence"):
        describe_occurrence(expr, tz, utc(occurrence), **options)


# --- refusing bad DST options ----------------------------------------------------------------


def test_check_dst_options__returns_valid_values() -> None:
    assert check_dst_options("skip", "both", 'task "nightly"') == ("skip", "both")
    assert check_dst_options("end-of-gap", "first", 'task "nightly"') == ("end-of-gap", "first")


@pytest.mark.parametrize(
    ("dst_gap", "dst_repeat", "message", "fix_start"),
    [
        pytest.param(
            "end_of_gap",
            "first",
            'task "nightly": dst_gap must be "end-of-gap" or "skip", got \'end_of_gap\'',
            'use dst_gap="end-of-gap"',
            id="gap_underscore",
        ),
        pytest.param(
            "Skip",
            "first",
            'task "nightly": dst_gap must be "end-of-gap" or "skip", got \'Skip\'',
            'use dst_gap="end-of-gap"',
            id="gap_capitalised",
        ),
        pytest.param(
            None,
            "first",
            'task "nightly": dst_gap must be "end-of-gap" or "skip", got None',
            'use dst_gap="end-of-gap"',
            id="gap_none",
        ),
        pytest.param(
            "skip",
            "twice",
            'task "nightly": dst_repeat must be "first" or "both", got \'twice\'',
            'use dst_repeat="first"',
            id="repeat_twice",
        ),
        pytest.param(
            "skip",
            True,
            'task "nightly": dst_repeat must be "first" or "both", got True',
            'use dst_repeat="first"',
            id="repeat_bool",
        ),
    ],
)
def test_check_dst_options__refuses_bad_values(
    dst_gap: object, dst_repeat: object, message: str, fix_start: str
) -> None:
    with pytest.raises(InvalidDstOptionError) as caught:
        check_dst_options(dst_gap, dst_repeat, 'task "nightly"')
    error = caught.value
    assert error.message == message
    assert error.code == "jobs.task.dst-option-invalid"
    assert error.fix.startswith(fix_start)
    assert error.cause in (dst_gap, dst_repeat)


AFTER = utc("2026-03-07T00:00:00Z")
UNTIL = utc("2026-03-09T00:00:00Z")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda **o: next_occurrence("30 2 * * *", NEW_YORK, AFTER, **o), id="next_occurrence"
        ),
        pytest.param(lambda **o: occurrences("30 2 * * *", NEW_YORK, AFTER, **o), id="occurrences"),
        pytest.param(lambda **o: between("30 2 * * *", NEW_YORK, AFTER, UNTIL, **o), id="between"),
        pytest.param(
            lambda **o: describe_occurrence("30 2 * * *", NEW_YORK, UNTIL, **o),
            id="describe_occurrence",
        ),
        # Refused for a real-time schedule too, where the options would have no effect.
        pytest.param(
            lambda **o: next_occurrence("0 * * * *", NEW_YORK, AFTER, **o), id="real_time"
        ),
    ],
)
@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"dst_gap": "later"}, id="gap"),
        pytest.param({"dst_repeat": "twice"}, id="repeat"),
    ],
)
def test_next_occurrence__refuses_bad_dst_options(
    call: Callable[..., object], options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidDstOptionError) as caught:
        call(**options)
    assert caught.value.code == "jobs.task.dst-option-invalid"
