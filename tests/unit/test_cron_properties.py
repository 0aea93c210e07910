"""Properties of ``ultimat3_jobs.cron`` over random expressions and instants near real transitions.

The checks do not trust the module: they match wall times with a small matcher of their own
(built from ``croniter.expand`` sets) and derive the expected firings from SPEC §3, and from the
``dst_gap``/``dst_repeat`` options, by brute force.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypedDict
from zoneinfo import ZoneInfo

from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ultimat3_jobs.cron import (
    DstGap,
    DstRepeat,
    between,
    describe_occurrence,
    next_occurrence,
    occurrences,
    parse,
)

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)

# UTC instants of real offset changes: gaps and repeats of 30, 60 and 120 minutes, changes at
# midnight (Santiago, Havana), a whole missing day (Apia), a permanent change (Moscow, Caracas)
# and an offset that drops for Ramadan (Casablanca).
TRANSITIONS = [
    ("America/New_York", "2026-03-08T07:00:00"),
    ("America/New_York", "2026-11-01T06:00:00"),
    ("Europe/London", "2026-03-29T01:00:00"),
    ("Europe/London", "2026-10-25T01:00:00"),
    ("Australia/Lord_Howe", "2026-04-04T15:00:00"),
    ("Australia/Lord_Howe", "2026-10-03T15:30:00"),
    ("America/Santiago", "2026-04-05T03:00:00"),
    ("America/Santiago", "2026-09-06T04:00:00"),
    ("Pacific/Apia", "2011-09-24T14:00:00"),
    ("Pacific/Apia", "2011-12-30T10:00:00"),
    ("Antarctica/Troll", "2026-03-29T01:00:00"),
    ("Antarctica/Troll", "2026-10-25T01:00:00"),
    ("Europe/Moscow", "2014-10-25T22:00:00"),
    ("America/Caracas", "2016-05-01T07:00:00"),
    ("America/Havana", "2026-03-08T05:00:00"),
    ("America/Havana", "2026-11-01T05:00:00"),
    ("Australia/Adelaide", "2026-04-04T16:30:00"),
    ("Australia/Adelaide", "2026-10-03T16:30:00"),
    ("Africa/Casablanca", "2026-02-15T02:00:00"),
    ("America/St_Johns", "2026-03-08T05:30:00"),
]

PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- an independent matcher ----------------------------------------------------------------


@dataclass(frozen=True)
class Matcher:
    """Set membership on each field; the day fields OR-ed when neither text starts with "*"."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    day_or: bool

    @classmethod
    def of(cls, expr: str) -> Matcher:
        fields = expr.split()
        six = len(fields) == 6
        expanded, _ = croniter.expand(expr, second_at_beginning=six)

        def values(index: int, low: int, high: int) -> frozenset[int]:
            if expanded[index] == ["*"]:
                return frozenset(range(low, high + 1))
            return frozenset(int(v) for v in expanded[index])

        return cls(
            seconds=values(5, 0, 59) if six else frozenset({0}),
            minutes=values(0, 0, 59),
            hours=values(1, 0, 23),
            doms=values(2, 1, 31),
            months=values(3, 1, 12),
            dows=values(4, 0, 6),
            day_or=not fields[-3].startswith(("*", "?")) and not fields[-1].startswith(("*", "?")),
        )

    def matches_minute(self, wall: datetime) -> bool:
        """Whether some second of this wall-clock minute matches."""
        dom = wall.day in self.doms
        dow = wall.isoweekday() % 7 in self.dows
        day = (dom or dow) if self.day_or else (dom and dow)
        return (
            day
            and wall.month in self.months
            and wall.hour in self.hours
            and wall.minute in self.minutes
        )

    def matches(self, wall: datetime) -> bool:
        return wall.microsecond == 0 and wall.second in self.seconds and self.matches_minute(wall)


def wall_of(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def offset_of(instant: datetime, zone: ZoneInfo) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def gap_slot_exists(matcher: Matcher, gap_start: datetime, gap_end: datetime) -> bool:
    """Whether a slot in the wall-clock gap [gap_start, gap_end) belongs to a date that exists.

    Every transition used here falls on a whole minute, so whole minutes cover the gap.
    """
    wall = gap_start
    while wall < gap_end:
        day = datetime(wall.year, wall.month, wall.day)
        date_never_existed = gap_start <= day and day + timedelta(days=1) <= gap_end
        if matcher.matches_minute(wall) and not date_never_existed:
            return True
        wall += MINUTE
    return False


def take(iterator: Iterator[datetime], count: int) -> list[datetime]:
    found = []
    for value in iterator:
        found.append(value)
        if len(found) == count:
            break
    return found


# --- random expressions --------------------------------------------------------------------


@st.composite
def minute_field(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["star", "step", "value", "list", "range", "range_step"]))
    if kind == "star":
        return "*"
    if kind == "step":
        return f"*/{draw(st.integers(1, 30))}"
    if kind == "value":
        return str(draw(st.integers(0, 59)))
    if kind == "list":
        values = draw(st.lists(st.integers(0, 59), min_size=2, max_size=4, unique=True))
        return ",".join(str(v) for v in values)
    low = draw(st.integers(0, 58))
    high = draw(st.integers(low + 1, 59))
    if kind == "range":
        return f"{low}-{high}"
    return f"{low}-{high}/{draw(st.integers(2, 20))}"


@st.composite
def wall_clock_hour_field(draw: st.DrawFn, near: tuple[int, ...]) -> str:
    # Mostly hours at the transition, so that slots land in its gap or repeated hour.
    hour = st.sampled_from(near) | st.sampled_from(near) | st.integers(0, 23)
    kind = draw(st.sampled_from(["value", "value", "list", "range", "range_step"]))
    if kind == "value":
        return str(draw(hour))
    if kind == "list":
        values = draw(st.lists(hour, min_size=2, max_size=4, unique=True))
        return ",".join(str(v) for v in values)
    low = draw(st.integers(0, 22))
    high = draw(st.integers(low + 1, 23))
    if kind == "range":
        return f"{low}-{high}"
    return f"{low}-{high}/{draw(st.integers(2, 6))}"


@st.composite
def real_time_hour_field(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(["*", "*", "*", "*/2", "*/3", "*/5", "*/6", "*/12"]))


@st.composite
def day_fields(draw: st.DrawFn) -> tuple[str, str]:
    kind = draw(
        st.sampled_from(
            ["any"] * 6 + ["dom", "dow", "both", "dom_step", "dow_step", "both_step", "full"]
        )
    )
    dom = dow = "*"
    if kind in ("dom", "both", "dow_step", "full"):
        values = draw(st.lists(st.integers(1, 31), min_size=1, max_size=10, unique=True))
        dom = ",".join(str(v) for v in values)
    if kind in ("dow", "both", "dom_step"):
        values = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True))
        dow = ",".join(str(v) for v in values)
    # A step starting with "*" narrows the other day field instead of adding to it (Vixie).
    if kind in ("dom_step", "both_step"):
        dom = f"*/{draw(st.integers(1, 15))}"
    if kind in ("dow_step", "both_step"):
        dow = f"*/{draw(st.integers(1, 7))}"
    if kind == "full":
        # Names every day without starting with "*": restricted, so every day matches.
        dow = draw(st.sampled_from(["0-6", "0-7", "1-7"]))
    return dom, dow


@st.composite
def second_field(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["zero", "value", "list", "step"]))
    if kind == "zero":
        return "0"
    if kind == "value":
        return str(draw(st.integers(0, 59)))
    if kind == "list":
        values = draw(st.lists(st.integers(0, 59), min_size=2, max_size=3, unique=True))
        return ",".join(str(v) for v in values)
    return f"*/{draw(st.integers(10, 30))}"


@dataclass(frozen=True)
class Scenario:
    """An expression, a real offset change of a zone, an instant near it, and DST options."""

    expr: str
    zone: ZoneInfo
    change: datetime
    after: datetime
    dst_gap: DstGap = "end-of-gap"
    dst_repeat: DstRepeat = "first"

    @property
    def options(self) -> DstOptions:
        return {"dst_gap": self.dst_gap, "dst_repeat": self.dst_repeat}


class DstOptions(TypedDict):
    """The keyword options of the cron functions, to pass as ``**options``."""

    dst_gap: DstGap
    dst_repeat: DstRepeat


@st.composite
def scenarios(draw: st.DrawFn, *, with_seconds: bool = True) -> Scenario:
    name, instant = draw(st.sampled_from(TRANSITIONS))
    zone = ZoneInfo(name)
    change = datetime.fromisoformat(instant).replace(tzinfo=UTC)
    # The local hours the change skips or repeats, and the hours on either side of it.
    before, after = wall_of(change - SECOND, zone), wall_of(change, zone)
    low, high = min(before, after), max(before, after)
    hours = {(low + h * HOUR).hour for h in range(int((high - low) / HOUR) + 1)}
    near = tuple(sorted(hours | {before.hour, after.hour}))
    hour = draw(st.one_of(wall_clock_hour_field(near), real_time_hour_field()))
    dom, dow = draw(day_fields())
    fields = [draw(minute_field()), hour, dom, "*", dow]
    if with_seconds and draw(st.booleans()):
        fields.insert(0, draw(second_field()))
    # Mostly from up to 3 hours before the change, so the walk crosses it.
    lead = draw(
        st.one_of(
            st.integers(0, 4 * 3600).map(lambda s: s - 3 * 3600),
            st.integers(-36 * 3600, 36 * 3600),
        )
    )
    shift = timedelta(
        seconds=lead,
        microseconds=draw(st.sampled_from([0, 0, 0, 1, 500_000, 999_999])),
    )
    gap: DstGap = draw(st.sampled_from(["end-of-gap", "skip"]))
    repeat: DstRepeat = draw(st.sampled_from(["first", "both"]))
    return Scenario(" ".join(fields), zone, change, change + shift, gap, repeat)


# --- properties ----------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(scenario=scenarios())
def test_occurrences__increase_match_and_follow_the_dst_rule(scenario: Scenario) -> None:
    expr, zone = scenario.expr, scenario.zone
    options = scenario.options
    schedule = parse(expr)
    matcher = Matcher.of(expr)
    # Past the change and a few hours on, or 300 occurrences for the densest expressions.
    horizon = max(scenario.after, scenario.change) + timedelta(hours=3)
    found: list[datetime] = []
    for occurrence in occurrences(schedule, zone, scenario.after, **options):
        found.append(occurrence)
        if occurrence > horizon or len(found) == 300:
            break
    previous = scenario.after
    fired_walls: set[tuple[datetime, int]] = set()
    for occurrence in found:
        assert occurrence.tzinfo is UTC
        assert occurrence.microsecond == 0
        assert occurrence > previous
        previous = occurrence
        local = occurrence.astimezone(zone)
        wall = local.replace(tzinfo=None)
        kind = describe_occurrence(schedule, zone, occurrence, **options)
        if matcher.matches(wall):
            if schedule.wall_clock:
                # A wall-clock slot fires at the first of two instants, and only once, unless
                # dst_repeat="both" fires it at its second instant too.
                assert local.fold == 0 or scenario.dst_repeat == "both"
                assert (wall, local.fold) not in fired_walls
                fired_walls.add((wall, local.fold))
            if local.fold:
                assert kind == "repeated"
            elif local.replace(fold=1).utcoffset() != local.utcoffset():
                assert kind == "repeated-first"
            else:
                assert kind == "normal"
            continue
        # Not a matching wall time: only a wall-clock slot swallowed by a gap ending here, and
        # never under dst_gap="skip".
        assert schedule.wall_clock, f"real-time {expr!r} fired at {wall} local"
        assert scenario.dst_gap == "end-of-gap", f"{expr!r} skip fired at {wall} local"
        before = occurrence - SECOND
        assert offset_of(before, zone) < offset_of(occurrence, zone), "not the end of a gap"
        assert gap_slot_exists(matcher, wall_of(before, zone) + SECOND, wall)
        assert kind == "gap-shifted"


@PROPERTY_SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_next_occurrence__from_anywhere_between_two_occurrences(
    scenario: Scenario, data: st.DataObject
) -> None:
    expr, zone = scenario.expr, scenario.zone
    options = scenario.options
    first, second = take(occurrences(expr, zone, scenario.after, **options), 2)
    # Any instant from one occurrence up to just before the next leads to the next.
    span = int((second - first) / timedelta(microseconds=1))
    moment = first + timedelta(microseconds=data.draw(st.integers(0, span - 1)))
    assert next_occurrence(expr, zone, moment, **options) == second


@PROPERTY_SETTINGS
@given(
    scenario=scenarios(with_seconds=False),
    lead=st.integers(0, 6 * 60),
    length=st.integers(60, 30 * 60),
)
def test_between__equals_brute_force_over_every_minute(
    scenario: Scenario, lead: int, length: int
) -> None:
    expr, zone = scenario.expr, scenario.zone
    start = scenario.change - lead * MINUTE
    end = start + length * MINUTE
    matcher = Matcher.of(expr)
    wall_clock = parse(expr).wall_clock
    both, skip = scenario.dst_repeat == "both", scenario.dst_gap == "skip"

    expected: list[datetime] = []
    instant = start + MINUTE
    while instant <= end:
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None)
        fires = matcher.matches(wall) and (not wall_clock or local.fold == 0 or both)
        previous = instant - MINUTE
        gap_end = offset_of(previous, zone) < offset_of(instant, zone)
        if not fires and wall_clock and gap_end and not skip:
            fires = gap_slot_exists(matcher, wall_of(previous, zone) + MINUTE, wall)
        if fires:
            expected.append(instant)
        instant += MINUTE

    found = between(
        expr, zone, start, end, dst_gap=scenario.dst_gap, dst_repeat=scenario.dst_repeat
    )
    assert found == expected


def change_size(name: str, instant: str) -> timedelta:
    """How far the local clock moves at a transition: forward for a gap, back for a repeat."""
    zone, change = ZoneInfo(name), datetime.fromisoformat(instant).replace(tzinfo=UTC)
    return offset_of(change, zone) - offset_of(change - SECOND, zone)


GAPS = [(name, at) for name, at in TRANSITIONS if change_size(name, at) > timedelta(0)]
REPEATS = [(name, at) for name, at in TRANSITIONS if change_size(name, at) < timedelta(0)]


@st.composite
def wall_clock_at_a_change(
    draw: st.DrawFn, transitions: list[tuple[str, str]]
) -> tuple[str, ZoneInfo, datetime]:
    """A wall-clock expression with hours at one of ``transitions``, its zone and the change."""
    name, instant = draw(st.sampled_from(transitions))
    zone = ZoneInfo(name)
    change = datetime.fromisoformat(instant).replace(tzinfo=UTC)
    before, after = wall_of(change - SECOND, zone), wall_of(change, zone)
    low, high = min(before, after), max(before, after)
    hours = tuple(sorted({(low + h * HOUR).hour for h in range(int((high - low) / HOUR) + 1)}))
    dom, dow = draw(day_fields())
    expr = " ".join([draw(minute_field()), draw(wall_clock_hour_field(hours)), dom, "*", dow])
    return expr, zone, change


@PROPERTY_SETTINGS
@given(case=wall_clock_at_a_change(REPEATS), repeat=st.sampled_from(["first", "both"]))
def test_between__repeated_slot_fires_once_or_twice(
    case: tuple[str, ZoneInfo, datetime], repeat: DstRepeat
) -> None:
    expr, zone, change = case
    matcher = Matcher.of(expr)
    length = offset_of(change - SECOND, zone) - offset_of(change, zone)
    # Local [window_start, window_start + length) passes twice: first during
    # [change - length, change), then during [change, change + length).
    window_start = wall_of(change, zone)
    slots = []
    wall = window_start
    while wall < window_start + length:
        if matcher.matches(wall):
            slots.append(wall)
        wall += MINUTE
    found = between(
        expr, zone, change - length - SECOND, change + length - SECOND, dst_repeat=repeat
    )
    fired = [wall_of(occurrence, zone) for occurrence in found]
    times = 2 if repeat == "both" else 1
    assert sorted(fired) == sorted(slots * times)


@PROPERTY_SETTINGS
@given(case=wall_clock_at_a_change(GAPS), gap=st.sampled_from(["end-of-gap", "skip"]))
def test_between__gap_slot_fires_at_the_gap_end_or_not_at_all(
    case: tuple[str, ZoneInfo, datetime], gap: DstGap
) -> None:
    expr, zone, change = case
    matcher = Matcher.of(expr)
    found = between(expr, zone, change - HOUR, change + HOUR, dst_gap=gap)
    gap_has_slot = gap_slot_exists(
        matcher, wall_of(change - SECOND, zone) + SECOND, wall_of(change, zone)
    )
    gap_end_is_a_slot = matcher.matches(wall_of(change, zone))
    if gap == "skip":
        # Only a slot of its own fires at the gap end; the skipped slots do not.
        assert (change in found) == gap_end_is_a_slot
    else:
        assert (change in found) == (gap_end_is_a_slot or gap_has_slot)
    # Nothing else fires for a skipped slot: every other occurrence is a matching wall time.
    assert all(matcher.matches(wall_of(o, zone)) for o in found if o != change)


@st.composite
def special_day_fields(draw: st.DrawFn) -> tuple[str, str, str]:
    """Month-shaped syntax croniter supports: L, W, #, names."""
    kind = draw(st.sampled_from(["last", "weekday", "nth", "last_dow", "names", "plain"]))
    if kind == "last":
        return "L", draw(st.sampled_from(["*", "2", "feb,apr"])), "*"
    if kind == "weekday":
        return f"{draw(st.integers(1, 28))}W", "*", "*"
    if kind == "nth":
        day = draw(st.sampled_from(["mon", "fri", "0", "6"]))
        return "*", "*", f"{day}#{draw(st.integers(1, 5))}"
    if kind == "last_dow":
        return "*", "*", f"L{draw(st.integers(0, 6))}"
    if kind == "names":
        return (
            "*",
            draw(st.sampled_from(["jan-mar", "dec", "*"])),
            draw(st.sampled_from(["mon-fri", "sat,sun", "tue"])),
        )
    dom, dow = draw(day_fields())
    return dom, "*", dow


@PROPERTY_SETTINGS
@given(
    minute=minute_field(),
    hour=st.one_of(wall_clock_hour_field(near=(0, 1, 2, 3)), real_time_hour_field()),
    days=special_day_fields(),
    seconds=st.one_of(st.none(), second_field()),
    zone=st.sampled_from(["UTC", "Asia/Kolkata", "Asia/Tokyo"]),
    after=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2060, 1, 1)),
)
def test_next_occurrence__agrees_with_croniter_where_there_is_no_dst(
    minute: str,
    hour: str,
    days: tuple[str, str, str],
    seconds: str | None,
    zone: str,
    after: datetime,
) -> None:
    dom, month, dow = days
    fields = [minute, hour, dom, month, dow]
    if seconds is not None:
        fields.insert(0, seconds)
    expr = " ".join(fields)
    start = after.replace(tzinfo=ZoneInfo(zone))
    # Without DST, croniter's own answer is the truth; implement_cron_bug gives Vixie's day rule
    # (a day field starting with "*" narrows the other one).
    expected = croniter(
        expr,
        start,
        ret_type=datetime,
        second_at_beginning=seconds is not None,
        implement_cron_bug=True,
    ).get_next(datetime)
    assert next_occurrence(expr, zone, start) == expected
