"""``ultimat3_jobs.cron``: parsing, validation errors and the zone-free basics (UTC).

DST behaviour lives in ``test_cron_dst.py``; random expressions in ``test_cron_properties.py``.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta, timezone
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterError

from ultimat3_jobs.cron import (
    CronSchedule,
    between,
    next_occurrence,
    occurrences,
    parse,
)
from ultimat3_jobs.errors import InvalidCronError, UltimateError


def utc(text: str) -> datetime:
    """A literal instant: ``"2026-03-08T07:00:00"`` read as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def iso(values: list[datetime]) -> list[str]:
    return [value.strftime("%Y-%m-%dT%H:%M:%SZ") for value in values]


def first(expr: str, after: str, count: int, tz: str = "UTC") -> list[str]:
    found = []
    for occurrence in occurrences(expr, tz, utc(after)):
        found.append(occurrence)
        if len(found) == count:
            break
    return iso(found)


# --- parsing ---------------------------------------------------------------------------------


def test_parse__five_fields() -> None:
    schedule = parse("0 3 * * *")
    assert schedule == CronSchedule("0 3 * * *")
    assert (schedule.expr, schedule.has_seconds, schedule.wall_clock) == ("0 3 * * *", False, True)


def test_parse__six_fields_take_a_leading_seconds_field() -> None:
    schedule = parse("30 0 3 * * *")
    assert schedule.has_seconds is True
    assert first("30 0 3 * * *", "2026-05-01T00:00:00", 2) == [
        "2026-05-01T03:00:30Z",
        "2026-05-02T03:00:30Z",
    ]


@pytest.mark.parametrize(
    ("expr", "wall_clock"),
    [
        pytest.param("0 * * * *", False, id="star"),
        pytest.param("0 */2 * * *", False, id="star_step"),
        pytest.param("0 3 * * *", True, id="number"),
        pytest.param("0 1,2 * * *", True, id="list"),
        pytest.param("0 0-23 * * *", True, id="range_of_every_hour"),
        pytest.param("0 1-23/2 * * *", True, id="range_step"),
        pytest.param("* * * * * *", False, id="seconds_star"),
        pytest.param("0 0 3 * * *", True, id="seconds_number"),
        pytest.param("* 3 * * * *", False, id="seconds_star_is_not_the_hour"),
    ],
)
def test_parse__hour_field_decides_the_dst_class(expr: str, wall_clock: bool) -> None:
    assert parse(expr).wall_clock is wall_clock


def test_parse__is_cached() -> None:
    assert parse("17 4 * * *") is parse("17 4 * * *")


def test_parse__accepts_names_and_question_mark() -> None:
    assert first("0 9 * jan mon", "2026-01-01T00:00:00", 5) == [
        "2026-01-05T09:00:00Z",
        "2026-01-12T09:00:00Z",
        "2026-01-19T09:00:00Z",
        "2026-01-26T09:00:00Z",
        "2027-01-04T09:00:00Z",
    ]
    assert first("0 9 ? * SAT-SUN", "2026-02-01T12:00:00", 3) == [
        "2026-02-07T09:00:00Z",
        "2026-02-08T09:00:00Z",
        "2026-02-14T09:00:00Z",
    ]


def test_parse__seven_means_sunday() -> None:
    assert first("0 9 * * 7", "2026-02-02T00:00:00", 2) == [
        "2026-02-08T09:00:00Z",
        "2026-02-15T09:00:00Z",
    ]


# --- validation errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message", "fix_start"),
    [
        pytest.param(
            "61 * * * *",
            'cron "61 * * * *": minute field "61" is out of range 0-59',
            "use a minute between 0 and 59",
            id="minute_61",
        ),
        pytest.param(
            "0 24 * * *",
            'cron "0 24 * * *": hour field "24" is out of range 0-23',
            "use an hour between 0 and 23",
            id="hour_24",
        ),
        pytest.param(
            "0 0 0 * *",
            'cron "0 0 0 * *": day-of-month field "0" is out of range 1-31',
            "use a day of month between 1 and 31",
            id="dom_0",
        ),
        pytest.param(
            "0 0 32 * *",
            'cron "0 0 32 * *": day-of-month field "32" is out of range 1-31',
            "use a day of month between 1 and 31",
            id="dom_32",
        ),
        pytest.param(
            "0 0 * 13 *",
            'cron "0 0 * 13 *": month field "13" is out of range 1-12',
            "use a month between 1 and 12",
            id="month_13",
        ),
        pytest.param(
            "0 0 * * 8",
            'cron "0 0 * * 8": day-of-week field "8" is out of range 0-7',
            "use a day of week between 0 and 7",
            id="dow_8",
        ),
        pytest.param(
            "60 0 3 * * *",
            'cron "60 0 3 * * *": second field "60" is out of range 0-59',
            "use a second between 0 and 59",
            id="second_60",
        ),
        pytest.param(
            "0 60 3 * * *",
            'cron "0 60 3 * * *": minute field "60" is out of range 0-59',
            "use a minute between 0 and 59",
            id="six_field_minute_60",
        ),
        pytest.param(
            "1,61 * * * *",
            'cron "1,61 * * * *": minute field "1,61" has 61, out of range 0-59',
            "use a minute between 0 and 59",
            id="minute_list",
        ),
        pytest.param(
            "0 20-25 * * *",
            'cron "0 20-25 * * *": hour field "20-25" has 25, out of range 0-23',
            "use an hour between 0 and 23",
            id="hour_range",
        ),
        pytest.param(
            "*/0 * * * *",
            'cron "*/0 * * * *": minute field "*/0" has step "0"; a step must be a whole '
            "number of at least 1",
            "use a minute between 0 and 59",
            id="step_0",
        ),
        pytest.param(
            "abc * * * *",
            'cron "abc * * * *": minute field "abc" is not valid (allowed: 0-59, *, lists like '
            "1,5, ranges like 1-5, steps like */15)",
            "use a minute between 0 and 59",
            id="minute_word",
        ),
        pytest.param(
            "0 0 * foo *",
            'cron "0 0 * foo *": month field "foo" is not valid (allowed: 1-12 or jan-dec, *, '
            "lists like 1,5, ranges like 1-5, steps like */15)",
            "use a month between 1 and 12 or jan-dec",
            id="month_word",
        ),
        pytest.param(
            "0 0 * * funday",
            'cron "0 0 * * funday": day-of-week field "funday" is not valid (allowed: 0-7 or '
            "sun-sat, 0 and 7 both Sunday, *, lists like 1,5, ranges like 1-5, steps like */15)",
            "use a day of week between 0 and 7",
            id="dow_word",
        ),
    ],
)
def test_parse__field_errors_name_field_value_and_range(
    expr: str, message: str, fix_start: str
) -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse(expr)
    error = caught.value
    assert error.message == message
    assert error.code == "jobs.task.cron-invalid"
    assert error.fix.startswith(fix_start)
    assert '"0 3 * * *"' in error.fix or '"30 0 3 * * *"' in error.fix or "e.g." in error.fix
    assert isinstance(error.cause, CroniterError)


def test_parse__error_fix_gives_a_working_example() -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse("61 * * * *")
    assert caught.value.fix == (
        'use a minute between 0 and 59, e.g. "0 3 * * *" runs at 03:00 every day'
    )


@pytest.mark.parametrize(
    ("expr", "count"),
    [
        pytest.param("* * * *", "4 fields", id="four"),
        pytest.param("* * * * * * *", "7 fields", id="seven_with_year"),
        pytest.param("daily", "1 field", id="one_word"),
    ],
)
def test_parse__wrong_field_count(expr: str, count: str) -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse(expr)
    assert caught.value.message == f'cron "{expr}" has {count}; 5 or 6 fields expected'
    assert "5 fields" in caught.value.fix
    assert "6 with a leading seconds field" in caught.value.fix


@pytest.mark.parametrize(
    "expr",
    [pytest.param("", id="empty"), pytest.param("   ", id="blank")],
)
def test_parse__empty_is_refused(expr: str) -> None:
    with pytest.raises(InvalidCronError, match="cron is empty"):
        parse(expr)


@pytest.mark.parametrize(
    "expr",
    [pytest.param(None, id="none"), pytest.param(5, id="int"), pytest.param(["0"], id="list")],
)
def test_parse__non_string_is_refused(expr: object) -> None:
    with pytest.raises(InvalidCronError, match="cron must be a string"):
        parse(expr)  # type: ignore[arg-type]
    with pytest.raises(InvalidCronError, match="cron must be a string"):
        next_occurrence(expr, "UTC", utc("2026-01-01T00:00:00"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "expr",
    [
        pytest.param("0 0 30 2 *", id="feb_30"),
        pytest.param("0 0 31 4,6,9,11 *", id="31st_of_short_months"),
        pytest.param("0 0 0 31 2 *", id="six_field_feb_31"),
        pytest.param("0 0 30-30 2 *", id="feb_30_as_a_range"),
    ],
)
def test_parse__expression_that_never_matches_is_refused(expr: str) -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse(expr)
    assert "can never match" in caught.value.message
    assert "e.g." in caught.value.fix
    assert caught.value.cause is not None


def test_parse__rare_but_possible_dates_are_accepted() -> None:
    assert first("0 0 29 2 *", "2026-01-01T00:00:00", 2) == [
        "2028-02-29T00:00:00Z",
        "2032-02-29T00:00:00Z",
    ]


@pytest.mark.parametrize(
    ("expr", "instead"),
    [
        pytest.param("@daily", "0 0 * * *", id="daily"),
        pytest.param("@hourly", "0 * * * *", id="hourly"),
        pytest.param("@weekly", "0 0 * * 0", id="weekly"),
    ],
)
def test_parse__nicknames_are_refused_with_their_fields(expr: str, instead: str) -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse(expr)
    assert caught.value.fix == f'write the fields out: "{instead}" instead of "{expr}"'


@pytest.mark.parametrize(
    "expr",
    [
        pytest.param("H * * * *", id="hashed"),
        pytest.param("0 H(0-5) * * *", id="hashed_range"),
        pytest.param("R 3 * * *", id="random"),
    ],
)
def test_parse__hashed_and_random_values_are_refused(expr: str) -> None:
    # A random minute would differ per node, and the leader can change between rounds.
    with pytest.raises(InvalidCronError, match=r"hashed \(H\) or random \(R\)"):
        parse(expr)


def test_cron_schedule__constructor_validates() -> None:
    with pytest.raises(InvalidCronError):
        CronSchedule("61 * * * *")


# --- day-of-month / day-of-week (Vixie cron) -------------------------------------------------
# crontab(5): a day field is restricted when its text does not start with "*". When both are
# restricted a day matching either is enough; otherwise both must match.


def test_next_occurrence__dom_and_dow_both_restricted_match_either() -> None:
    # April 13 2026 is a Monday: it matches by day of month alone.
    assert first("0 9 13 * 5", "2026-03-21T00:00:00", 5) == [
        "2026-03-27T09:00:00Z",
        "2026-04-03T09:00:00Z",
        "2026-04-10T09:00:00Z",
        "2026-04-13T09:00:00Z",
        "2026-04-17T09:00:00Z",
    ]


def test_next_occurrence__only_dow_restricted() -> None:
    assert first("0 9 * * 5", "2026-04-08T00:00:00", 2) == [
        "2026-04-10T09:00:00Z",
        "2026-04-17T09:00:00Z",
    ]


def test_next_occurrence__only_dom_restricted() -> None:
    assert first("0 9 13 * *", "2026-03-21T00:00:00", 2) == [
        "2026-04-13T09:00:00Z",
        "2026-05-13T09:00:00Z",
    ]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # The published case: */7 is Sunday (0 and 7) and starts with "*", so it narrows 1-7
        # to the first Sunday of each month (2020-01-01 is a Wednesday).
        pytest.param(
            "1 1 1-7 * */7",
            "2020-01-01T00:00:00",
            ["2020-01-05T01:01:00Z", "2020-02-02T01:01:00Z", "2020-03-01T01:01:00Z"],
            id="first_sunday_dow_step_starts_with_star",
        ),
        # Odd days that are Mondays (2026-01-05, -19, 02-09, 02-23); not odd days or Mondays.
        pytest.param(
            "0 0 */2 * 1",
            "2026-01-01T00:00:00",
            [
                "2026-01-05T00:00:00Z",
                "2026-01-19T00:00:00Z",
                "2026-02-09T00:00:00Z",
                "2026-02-23T00:00:00Z",
            ],
            id="odd_mondays_dom_step_starts_with_star",
        ),
        # The 1st when it falls on Sun, Tue, Thu or Sat: 2026-01-01 Thu, 02-01 Sun, 03-01 Sun,
        # then April to July start on Wed, Fri, Mon, Wed, and 08-01 is a Saturday.
        pytest.param(
            "0 0 1 * */2",
            "2025-12-31T12:00:00",
            [
                "2026-01-01T00:00:00Z",
                "2026-02-01T00:00:00Z",
                "2026-03-01T00:00:00Z",
                "2026-08-01T00:00:00Z",
            ],
            id="first_of_month_on_even_dow",
        ),
        # Both start with "*": still both must match, days 1, 11, 21, 31 on a weekend.
        pytest.param(
            "0 0 */10 * */6",
            "2026-01-01T00:00:00",
            [
                "2026-01-11T00:00:00Z",
                "2026-01-31T00:00:00Z",
                "2026-02-01T00:00:00Z",
                "2026-02-21T00:00:00Z",
                "2026-03-01T00:00:00Z",
                "2026-03-21T00:00:00Z",
            ],
            id="both_start_with_star_and",
        ),
        # */1 names every day but starts with "*": Mondays only.
        pytest.param(
            "0 0 */1 * 1",
            "2026-01-01T00:00:00",
            ["2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z", "2026-01-19T00:00:00Z"],
            id="dom_star_step_1_is_unrestricted",
        ),
        # 1-31 names every day and does not start with "*": every day, not only Mondays.
        pytest.param(
            "0 0 1-31 * 1",
            "2026-01-01T00:00:00",
            ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"],
            id="dom_full_range_is_restricted",
        ),
        pytest.param(
            "0 0 13 * 0-6",
            "2026-01-01T00:00:00",
            ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"],
            id="dow_full_range_is_restricted",
        ),
        # Only the first character counts: "1,*/10" is restricted, so 1, 11, 21, 31 or Monday.
        pytest.param(
            "0 0 1,*/10 * 1",
            "2026-01-01T00:00:00",
            [
                "2026-01-05T00:00:00Z",
                "2026-01-11T00:00:00Z",
                "2026-01-12T00:00:00Z",
                "2026-01-19T00:00:00Z",
                "2026-01-21T00:00:00Z",
            ],
            id="list_starting_with_a_number_is_restricted",
        ),
        # "?" reads as "*": weekends only.
        pytest.param(
            "0 9 ? * SAT-SUN",
            "2026-02-01T12:00:00",
            ["2026-02-07T09:00:00Z", "2026-02-08T09:00:00Z", "2026-02-14T09:00:00Z"],
            id="question_mark_is_unrestricted",
        ),
        # Under OR a side that never matches adds nothing: Mondays of February.
        pytest.param(
            "0 0 30 2 1",
            "2026-01-01T00:00:00",
            ["2026-02-02T00:00:00Z", "2026-02-09T00:00:00Z", "2026-02-16T00:00:00Z"],
            id="or_with_an_impossible_day_of_month",
        ),
    ],
)
def test_next_occurrence__vixie_day_rule_reads_the_raw_text(
    expr: str, after: str, expected: list[str]
) -> None:
    assert first(expr, after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # The 1st, and the 4th Monday (2026-01-26, 02-23, 03-23).
        pytest.param(
            "0 0 1 * MON#4",
            "2025-12-31T12:00:00",
            [
                "2026-01-01T00:00:00Z",
                "2026-01-26T00:00:00Z",
                "2026-02-01T00:00:00Z",
                "2026-02-23T00:00:00Z",
                "2026-03-01T00:00:00Z",
                "2026-03-23T00:00:00Z",
            ],
            id="first_or_fourth_monday",
        ),
        # The 15th, and the last Friday (2026-01-30, 02-27, 03-27).
        pytest.param(
            "0 0 15 * L5",
            "2026-01-01T00:00:00",
            [
                "2026-01-15T00:00:00Z",
                "2026-01-30T00:00:00Z",
                "2026-02-15T00:00:00Z",
                "2026-02-27T00:00:00Z",
                "2026-03-15T00:00:00Z",
                "2026-03-27T00:00:00Z",
            ],
            id="fifteenth_or_last_friday",
        ),
        # The 8th is never a second Monday's only chance: both fire (2026-01-12, 02-09).
        pytest.param(
            "0 0 8 * MON#2",
            "2026-01-01T00:00:00",
            [
                "2026-01-08T00:00:00Z",
                "2026-01-12T00:00:00Z",
                "2026-02-08T00:00:00Z",
                "2026-02-09T00:00:00Z",
            ],
            id="eighth_or_second_monday",
        ),
        # The weekday nearest the 15th (Thu 2026-01-15, Mon 02-16), or any Monday.
        pytest.param(
            "0 0 15W * 1",
            "2026-01-01T00:00:00",
            [
                "2026-01-05T00:00:00Z",
                "2026-01-12T00:00:00Z",
                "2026-01-15T00:00:00Z",
                "2026-01-19T00:00:00Z",
                "2026-01-26T00:00:00Z",
                "2026-02-02T00:00:00Z",
                "2026-02-09T00:00:00Z",
                "2026-02-16T00:00:00Z",
            ],
            id="nearest_weekday_or_monday",
        ),
        # The last day (Sat 2026-01-31, Sat 02-28) or a Friday.
        pytest.param(
            "0 0 L * 5",
            "2026-01-20T00:00:00",
            [
                "2026-01-23T00:00:00Z",
                "2026-01-30T00:00:00Z",
                "2026-01-31T00:00:00Z",
                "2026-02-06T00:00:00Z",
            ],
            id="last_day_or_friday",
        ),
        # February never has a 31st: the 4th Monday of February alone.
        pytest.param(
            "0 0 31 2 MON#4",
            "2026-01-01T00:00:00",
            ["2026-02-23T00:00:00Z", "2027-02-22T00:00:00Z"],
            id="impossible_day_or_fourth_monday",
        ),
        # */2 starts with "*": odd days that are a 4th Monday (2020-02-24 is even).
        pytest.param(
            "0 0 */2 * MON#4",
            "2020-01-01T00:00:00",
            [
                "2020-01-27T00:00:00Z",
                "2020-03-23T00:00:00Z",
                "2020-04-27T00:00:00Z",
                "2020-05-25T00:00:00Z",
            ],
            id="odd_day_and_fourth_monday",
        ),
        pytest.param(
            "30 0 0 1 * MON#4",
            "2025-12-31T12:00:00",
            ["2026-01-01T00:00:30Z", "2026-01-26T00:00:30Z", "2026-02-01T00:00:30Z"],
            id="with_seconds_first_or_fourth_monday",
        ),
    ],
)
def test_next_occurrence__month_shaped_day_with_a_restricted_other_day(
    expr: str, after: str, expected: list[str]
) -> None:
    assert first(expr, after, len(expected)) == expected


def test_parse__and_by_a_leading_star_that_never_matches_says_why() -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse("0 0 31 2 */7")
    assert caught.value.message == (
        'cron "0 0 31 2 */7" can never match: no date has day-of-month "31" in month "2" on '
        'day-of-week "*/7"'
    )
    assert 'a day field starting with "*" (here "*/7") must match as well' in caught.value.fix


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        pytest.param(
            "0 0 L * *",
            ["2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z"],
            id="last_day",
        ),
        pytest.param(
            "0 0 * * 5#2",
            ["2026-01-09T00:00:00Z", "2026-02-13T00:00:00Z", "2026-03-13T00:00:00Z"],
            id="second_friday",
        ),
        pytest.param(
            "0 0 * * L5",
            ["2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z", "2026-03-27T00:00:00Z"],
            id="last_friday",
        ),
        pytest.param(
            "0 0 15W * *",
            ["2026-01-15T00:00:00Z", "2026-02-16T00:00:00Z", "2026-03-16T00:00:00Z"],
            id="nearest_weekday",
        ),
        pytest.param(
            "30 0 0 L * *",
            ["2026-01-31T00:00:30Z", "2026-02-28T00:00:30Z", "2026-03-31T00:00:30Z"],
            id="last_day_with_seconds",
        ),
    ],
)
def test_next_occurrence__month_shaped_syntax(expr: str, expected: list[str]) -> None:
    assert first(expr, "2026-01-01T00:00:00", 3) == expected


# --- next_occurrence basics ------------------------------------------------------------------


def test_next_occurrence__is_strictly_after() -> None:
    assert iso([next_occurrence("*/5 * * * *", "UTC", utc("2026-05-03T10:02:03"))]) == [
        "2026-05-03T10:05:00Z"
    ]
    assert iso([next_occurrence("*/5 * * * *", "UTC", utc("2026-05-03T10:05:00"))]) == [
        "2026-05-03T10:10:00Z"
    ]
    just_before = utc("2026-05-03T10:04:59.999999")
    assert iso([next_occurrence("*/5 * * * *", "UTC", just_before)]) == ["2026-05-03T10:05:00Z"]


def test_next_occurrence__seconds_are_strictly_after_too() -> None:
    after = utc("2026-05-03T10:00:15")
    assert iso([next_occurrence("*/15 * * * * *", "UTC", after)]) == ["2026-05-03T10:00:30Z"]
    after = utc("2026-05-03T10:00:14.5")
    assert iso([next_occurrence("*/15 * * * * *", "UTC", after)]) == ["2026-05-03T10:00:15Z"]


def test_next_occurrence__returns_aware_utc_at_whole_seconds() -> None:
    result = next_occurrence("0 3 * * *", "Europe/Paris", utc("2026-05-03T10:02:03.123456"))
    assert result.tzinfo is UTC
    assert result.microsecond == 0
    assert iso([result]) == ["2026-05-04T01:00:00Z"]


def test_next_occurrence__reads_fields_in_the_zone() -> None:
    assert iso([next_occurrence("0 3 * * *", "Asia/Kolkata", utc("2026-05-03T00:00:00"))]) == [
        "2026-05-03T21:30:00Z"
    ]


def test_next_occurrence__accepts_after_in_any_zone() -> None:
    paris_noon = datetime(2026, 5, 3, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))
    assert next_occurrence("0 * * * *", "UTC", paris_noon) == utc("2026-05-03T11:00:00")
    fixed = datetime(2026, 5, 3, 12, 0, tzinfo=timezone(timedelta(hours=-3)))
    assert next_occurrence("0 * * * *", "UTC", fixed) == utc("2026-05-03T16:00:00")


def test_next_occurrence__accepts_zoneinfo_and_parsed_schedule() -> None:
    schedule = parse("0 3 * * *")
    after = utc("2026-05-03T00:00:00")
    expected = next_occurrence("0 3 * * *", "Europe/Paris", after)
    assert next_occurrence(schedule, ZoneInfo("Europe/Paris"), after) == expected


def test_next_occurrence__naive_after_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        next_occurrence("0 3 * * *", "UTC", datetime(2026, 5, 3))


def test_next_occurrence__non_datetime_after_is_refused() -> None:
    with pytest.raises(TypeError, match="datetime"):
        next_occurrence("0 3 * * *", "UTC", date(2026, 5, 3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="datetime"):
        next_occurrence("0 3 * * *", "UTC", "2026-05-03")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expr", "plain"),
    [
        pytest.param("5-5 3-3 * * *", "5 3 * * *", id="minute_and_hour"),
        pytest.param("0 0 1-1 * *", "0 0 1 * *", id="day_of_month"),
        pytest.param("0 9 * * MON-MON", "0 9 * * MON", id="day_name"),
        pytest.param("0 9 * * 1-01", "0 9 * * 1", id="day_number_padded"),
        pytest.param("0 0 1 FEB-feb *", "0 0 1 2 *", id="month_names"),
        pytest.param("0 0 1-1/3 * *", "0 0 1 * *", id="with_a_step"),
        pytest.param("0 0 * 2-2 5#5", "0 0 * 2 5#5", id="with_nth_weekday"),
        pytest.param("5-5,10 * * * * *", "5,10 * * * * *", id="in_a_list_with_seconds"),
        pytest.param("0 9 * * 7-0", "0 9 * * 0", id="sunday_as_7_and_0"),
        pytest.param("0 9 * * 7-SUN/2", "0 9 * * 0", id="sunday_as_7_and_a_name_with_a_step"),
    ],
)
def test_next_occurrence__a_range_with_equal_ends_is_that_one_value(expr: str, plain: str) -> None:
    # croniter reads "5-5" as the whole field; Vixie cron, and the README, as 5.
    after = utc("2026-01-01T00:00:00")
    assert list(islice(occurrences(expr, "UTC", after), 5)) == list(
        islice(occurrences(plain, "UTC", after), 5)
    )
    assert parse(expr).wall_clock == parse(plain).wall_clock


@pytest.mark.parametrize(
    ("expr", "plain"),
    [
        pytest.param("0 20-3/3 * * *", "0 20,23,2 * * *", id="hours"),
        pytest.param("0 23-1/2 * * *", "0 23,1 * * *", id="hours_one_past_midnight"),
        pytest.param("0 17-16/5 * * *", "0 17,22,3,8,13 * * *", id="hours_round_the_clock"),
        pytest.param("50-10/7 0 * * *", "50,57,4 0 * * *", id="minutes"),
        pytest.param("0 0 * * SAT-TUE/2", "0 0 * * 6,1", id="day_names"),
        pytest.param("0 0 * * 5-1/2", "0 0 * * 5,0", id="day_numbers"),
        pytest.param("0 0 1 NOV-feb/2 *", "0 0 1 11,1 *", id="month_names"),
        pytest.param("0 0 30-2/2 * *", "0 0 30,1 * *", id="days_of_month"),
        pytest.param("50-5/10,30 * * * * *", "50,0,30 * * * * *", id="seconds_in_a_list"),
        pytest.param("0 22-2/2 * * *", "0 22,0,2 * * *", id="even_steps"),
        pytest.param("0 0 * * 7-2/2", "0 0 * * 0,2", id="sunday_as_7_is_not_reversed"),
        pytest.param("0 0 * * 0-7/2", "0 0 * * 0,2,4,6", id="the_whole_week"),
        pytest.param("0 0 * * 1-7/2", "0 0 * * 1,3,5,0", id="to_sunday_as_7"),
    ],
)
def test_next_occurrence__a_reversed_range_with_a_step_steps_through_the_wrap(
    expr: str, plain: str
) -> None:
    # "23-1" is 23, 0 and 1; "/2" every second of those: 23 and 1 (croniter gave 23 alone).
    after = utc("2026-01-01T00:00:00")
    assert list(islice(occurrences(expr, "UTC", after), 12)) == list(
        islice(occurrences(plain, "UTC", after), 12)
    )
    assert parse(expr).expr == expr  # shown as written


@pytest.mark.parametrize("expr", ["0 ² * * *", "*/² * * * *", "1-² * * * *", "0 0 * * ²"])
def test_parse__digits_that_are_not_ascii_are_refused_with_the_field(expr: str) -> None:
    with pytest.raises(InvalidCronError) as caught:
        parse(expr)
    assert "field" in caught.value.message
    assert caught.value.fix


@pytest.mark.parametrize("tz", ["Bogota", "", "../../etc/passwd", "localtime", "posixrules"])
def test_next_occurrence__a_name_no_declaration_takes_is_refused_as_there(tz: str) -> None:
    with pytest.raises(UltimateError) as caught:
        next_occurrence("0 3 * * *", tz, utc("2026-05-03T00:00:00"))
    assert caught.value.code in ("jobs.task.tz-invalid", "jobs.task.tz-missing")
    assert caught.value.fix
    # The maths function is not a task: the error speaks of what it was given.
    assert caught.value.message.startswith("next_occurrence() was given")
    assert "@task" not in caught.value.fix


def test_next_occurrence__bad_tz_type_is_refused() -> None:
    with pytest.raises(TypeError, match="tz"):
        next_occurrence("0 3 * * *", 5, utc("2026-05-03T00:00:00"))  # type: ignore[arg-type]


def test_next_occurrence__invalid_expression_raises_invalid_cron() -> None:
    with pytest.raises(InvalidCronError):
        next_occurrence("61 * * * *", "UTC", utc("2026-05-03T00:00:00"))


# --- occurrences and between ----------------------------------------------------------------


def test_occurrences__until_is_inclusive() -> None:
    found = occurrences(
        "0 */6 * * *", "UTC", utc("2026-05-03T00:00:00"), until=utc("2026-05-04T00:00:00")
    )
    assert iso(list(found)) == [
        "2026-05-03T06:00:00Z",
        "2026-05-03T12:00:00Z",
        "2026-05-03T18:00:00Z",
        "2026-05-04T00:00:00Z",
    ]


def test_occurrences__checks_arguments_before_iterating() -> None:
    with pytest.raises(ValueError, match="aware"):
        occurrences("0 3 * * *", "UTC", utc("2026-05-03T00:00:00"), until=datetime(2026, 6, 1))


def test_between__start_exclusive_end_inclusive() -> None:
    found = between("0 * * * *", "UTC", utc("2026-05-03T10:00:00"), utc("2026-05-03T13:00:00"))
    assert iso(found) == [
        "2026-05-03T11:00:00Z",
        "2026-05-03T12:00:00Z",
        "2026-05-03T13:00:00Z",
    ]


def test_between__empty_when_the_range_is() -> None:
    now = utc("2026-05-03T10:00:00")
    assert between("* * * * *", "UTC", now, now) == []
    assert between("* * * * *", "UTC", now, now - timedelta(hours=1)) == []


def test_between__limit_keeps_the_earliest_by_default() -> None:
    found = between(
        "0 * * * *", "UTC", utc("2026-05-03T10:00:00"), utc("2026-05-04T10:00:00"), limit=2
    )
    assert iso(found) == ["2026-05-03T11:00:00Z", "2026-05-03T12:00:00Z"]


def test_between__limit_can_keep_the_latest() -> None:
    found = between(
        "0 * * * *",
        "UTC",
        utc("2026-05-03T10:00:00"),
        utc("2026-05-04T10:30:00"),
        limit=3,
        keep="latest",
    )
    assert iso(found) == [
        "2026-05-04T08:00:00Z",
        "2026-05-04T09:00:00Z",
        "2026-05-04T10:00:00Z",
    ]


def test_between__latest_over_a_long_outage_of_a_per_second_cron() -> None:
    # A year of a per-second cron is 31 million occurrences: keeping ten must not walk them.
    found = between(
        "* * * * * *",
        "UTC",
        utc("2025-05-03T00:00:00"),
        utc("2026-05-03T00:00:00"),
        limit=3,
        keep="latest",
    )
    assert iso(found) == [
        "2026-05-02T23:59:58Z",
        "2026-05-02T23:59:59Z",
        "2026-05-03T00:00:00Z",
    ]


def test_between__latest_with_fewer_than_limit_returns_them_all() -> None:
    found = between(
        "0 0 1 * *",
        "UTC",
        utc("2026-01-15T00:00:00"),
        utc("2026-04-15T00:00:00"),
        limit=10,
        keep="latest",
    )
    assert iso(found) == [
        "2026-02-01T00:00:00Z",
        "2026-03-01T00:00:00Z",
        "2026-04-01T00:00:00Z",
    ]


def test_between__limit_zero_and_negative() -> None:
    start, end = utc("2026-05-03T10:00:00"), utc("2026-05-03T13:00:00")
    assert between("0 * * * *", "UTC", start, end, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        between("0 * * * *", "UTC", start, end, limit=-1)
    with pytest.raises(ValueError, match="keep"):
        between("0 * * * *", "UTC", start, end, keep="middle")  # type: ignore[arg-type]


def test_next_occurrence__imports_and_answers_without_django_settings() -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from datetime import datetime, timezone\n"
        "from ultimat3_jobs.cron import next_occurrence\n"
        "after = datetime(2026, 3, 7, 12, tzinfo=timezone.utc)\n"
        "print(next_occurrence('30 2 * * *', 'America/New_York', after).isoformat())\n"
        "print('django.conf' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["2026-03-08T07:00:00+00:00", "False"]


def test_the_calendar_end__iterators_stop_and_next_occurrence_says_so() -> None:
    near_end = utc("9999-12-29T12:00:00")
    assert iso(list(occurrences("0 0 * * *", "UTC", near_end))) == [
        "9999-12-30T00:00:00Z",
        "9999-12-31T00:00:00Z",
    ]
    # UTC+14: the local year 9999 ends at 9999-12-31T10:00Z, and its last midnight is a day before.
    assert iso(list(occurrences("0 0 * * *", "Pacific/Kiritimati", near_end))) == [
        "9999-12-30T10:00:00Z",
    ]
    assert list(occurrences("0 0 * * *", "Pacific/Kiritimati", utc("9999-12-31T12:00:00"))) == []
    assert len(between("0 0 * * *", "UTC", near_end, utc("9999-12-31T23:59:00"), limit=5)) == 2
    with pytest.raises(ValueError, match="no occurrence after 9999-12-31T12:00:00"):
        next_occurrence("0 0 * * *", "UTC", utc("9999-12-31T12:00:00"))
    with pytest.raises(ValueError, match="before the end of year 9999"):
        next_occurrence("0 0 * * *", "UTC", utc("9999-12-31T12:00:00"), dst_repeat="both")
    # A yearly day the last year has passed: the same, whether croniter walks it ("L") or not.
    for expr in ("0 0 1 1 *", "0 0 29 2 *", "0 0 L 2 *"):
        assert list(occurrences(expr, "UTC", utc("9999-12-30T00:00:00"))) == []
        with pytest.raises(ValueError, match=re.escape(f'cron "{expr}" has no occurrence after')):
            next_occurrence(expr, "UTC", utc("9999-12-30T00:00:00"))
