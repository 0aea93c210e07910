"""Cron schedules read as wall-clock time in an IANA zone, with one defined answer for DST.

Pure time maths: nothing here reads the clock or touches Django. ``next_occurrence`` is the one
function every schedule computation goes through; the others are built on it.

The DST rule (SPEC §3), keyed on the raw hour field:

- an hour field starting with ``*`` (``*``, ``*/2``) makes a **real-time** schedule: it fires at
  every real instant whose local wall time matches, so wall times inside a gap never fire and
  wall times that occur twice fire twice;
- any other hour field makes a **wall-clock** schedule: it fires once per matching local slot,
  at the first of two instants when the slot repeats, and at the end of the gap when the slot
  does not exist. A local date that never existed at all has no slots. Two keyword options
  change that per task: ``dst_gap="skip"`` drops a slot inside a gap for that day, and
  ``dst_repeat="both"`` fires a repeated slot at both of its instants.

Day-of-month and day-of-week follow Vixie cron, read from the raw text: when neither starts
with ``*`` a day matching either is enough; otherwise both must match.

croniter parses and validates the expression; the wall-clock walk and the zone handling are
done here, because croniter's own DST handling runs fixed-hour jobs twice in a repeated hour.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Final, Literal, cast
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, CroniterError, croniter

from ultimat3_jobs.errors import InvalidCronError, InvalidDstOptionError
from ultimat3_jobs.zones import resolve_zone

__all__ = [
    "CronSchedule",
    "DstGap",
    "DstRepeat",
    "OccurrenceKind",
    "between",
    "check_dst_options",
    "describe_occurrence",
    "next_occurrence",
    "occurrences",
    "parse",
    "wall_instant",
]

OccurrenceKind = Literal["normal", "gap-shifted", "repeated-first", "repeated"]

#: What a wall-clock slot inside a DST gap does: fire at the end of the gap, or not that day.
DstGap = Literal["end-of-gap", "skip"]
#: What a wall-clock slot that occurs twice does: fire at the first instant only, or at both.
DstRepeat = Literal["first", "both"]

_DST_GAPS: Final = ("end-of-gap", "skip")
_DST_REPEATS: Final = ("first", "both")

_SECOND: Final = timedelta(seconds=1)
_MINUTE: Final = timedelta(minutes=1)
_DAY: Final = timedelta(days=1)
_MICROSECOND: Final = timedelta(microseconds=1)

# No two UTC-offset changes in the tz database are closer than ~95 hours (Africa/Freetown,
# 1939), so a probe every 6 hours cannot step over a change and its reversal together.
_PROBE_STEP: Final = timedelta(hours=6)

# Far enough for the rarest date croniter can express (a fifth Friday in February recurs
# every 28 to 40 years), near enough that an impossible expression is refused quickly.
_MATCH_HORIZON_YEARS: Final = 50

# Where the "can this ever match" probe starts; any fixed date gives the same answer.
_PROBE_START: Final = datetime(2024, 1, 1)

_FIELD_TOKEN = re.compile(r"\S+", re.ASCII)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    allowed: str
    fix: str


_SECOND_FIELD: Final = _Field(
    "second",
    0,
    59,
    "0-59",
    'use a second between 0 and 59, e.g. "30 0 3 * * *" runs at 03:00:30 every day',
)
_MINUTE_FIELD: Final = _Field(
    "minute",
    0,
    59,
    "0-59",
    'use a minute between 0 and 59, e.g. "0 3 * * *" runs at 03:00 every day',
)
_HOUR_FIELD: Final = _Field(
    "hour",
    0,
    23,
    "0-23",
    'use an hour between 0 and 23, e.g. "0 3 * * *" runs at 03:00 every day',
)
_DOM_FIELD: Final = _Field(
    "day-of-month",
    1,
    31,
    "1-31",
    'use a day of month between 1 and 31, e.g. "0 3 1 * *" runs at 03:00 on the 1st of every month',
)
_MONTH_FIELD: Final = _Field(
    "month",
    1,
    12,
    "1-12 or jan-dec",
    'use a month between 1 and 12 or jan-dec, e.g. "0 3 1 jan *" runs at 03:00 every 1 January',
)
_DOW_FIELD: Final = _Field(
    "day-of-week",
    0,
    7,
    "0-7 or sun-sat, 0 and 7 both Sunday",
    'use a day of week between 0 and 7 (0 and 7 are Sunday) or sun-sat, e.g. "0 3 * * mon" '
    "runs at 03:00 every Monday",
)
_FIELDS_5: Final = (_MINUTE_FIELD, _HOUR_FIELD, _DOM_FIELD, _MONTH_FIELD, _DOW_FIELD)
_FIELDS_6: Final = (_SECOND_FIELD, *_FIELDS_5)

_FIELD_COUNT_FIX: Final = (
    'write 5 fields "minute hour day-of-month month day-of-week", e.g. "0 3 * * *" for 03:00 '
    'every day, or 6 with a leading seconds field, e.g. "30 0 3 * * *"'
)

# Spelled out rather than accepted, so every schedule reads the same in code, logs and admin.
_NICKNAMES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class _WallMatcher:
    """Finds matching naive wall-clock times: plain calendar arithmetic, no zone involved."""

    __slots__ = (
        "_day_or",
        "_doms",
        "_dows",
        "_has_seconds",
        "_hours",
        "_lock",
        "_minutes",
        "_months",
        "_seconds",
        "_walkers",
        "unit",
    )

    def __init__(
        self,
        fields: list[str],
        expanded: list[list[int | str]],
        walkers: tuple[croniter[datetime], ...],
    ) -> None:
        self._has_seconds = len(fields) == 6
        self.unit = _SECOND if self._has_seconds else _MINUTE
        minutes, hours, doms, months, dows = expanded[:5]
        self._day_or = _days_ored(fields)
        self._minutes = _values(minutes, 0, 59)
        self._hours = _values(hours, 0, 23)
        self._seconds = _values(expanded[5], 0, 59) if self._has_seconds else (0,)
        self._months = _values(months, 1, 12)
        self._doms = frozenset(_values(doms, 1, 31))
        self._dows = frozenset(_values(dows, 0, 6))
        self._lock = threading.Lock()
        # L, W and # depend on the shape of each month; croniter walks those, one caller at a
        # time since an instance keeps its position between calls.
        self._walkers = walkers if _month_shaped(fields) else ()

    def first_after(self, wall: datetime) -> datetime:
        """The first matching wall time strictly after ``wall``."""
        if self._has_seconds:
            return self._first_from(wall.replace(microsecond=0) + _SECOND)
        return self._first_from(wall.replace(second=0, microsecond=0) + _MINUTE)

    def first_at_or_after(self, wall: datetime) -> datetime:
        """The first matching wall time at or after ``wall``."""
        if self._has_seconds:
            start = wall.replace(microsecond=0)
        else:
            start = wall.replace(second=0, microsecond=0)
        if start < wall:
            start += self.unit
        return self._first_from(start)

    def _first_from(self, start: datetime) -> datetime:
        # `start` is on a whole unit: the first matching wall time at or after it.
        if self._walkers:
            # croniter answers "strictly after" and goes through float timestamps: asking from
            # half a unit before keeps the answer exact far from 1970.
            since = start - self.unit / 2
            with self._lock:
                try:
                    found: datetime = min(
                        w.get_next(datetime, start_time=since) for w in self._walkers
                    )
                except ValueError as error:
                    if since.year < date.max.year:
                        raise
                    # Its walk went past the calendar's end: the callers end there.
                    raise OverflowError("no later date in the calendar") from error
            return found
        day = start.date()
        if self._day_matches(day):
            time_of_day = self._time_at_or_after(start.hour, start.minute, start.second)
            if time_of_day is not None:
                return datetime(day.year, day.month, day.day, *time_of_day)
        day = self._next_day(day)
        return datetime(
            day.year, day.month, day.day, self._hours[0], self._minutes[0], self._seconds[0]
        )

    def matches(self, wall: datetime) -> bool:
        """Whether the naive wall time ``wall`` is one the expression names."""
        return self.first_at_or_after(wall) == wall

    def _day_matches(self, day: date) -> bool:
        if day.month not in self._months:
            return False
        dom = day.day in self._doms
        dow = day.isoweekday() % 7 in self._dows
        return (dom or dow) if self._day_or else (dom and dow)

    def _next_day(self, day: date) -> date:
        give_up = day.year + _MATCH_HORIZON_YEARS
        day += _DAY
        while day.year <= give_up:
            if day.month in self._months:
                if self._day_matches(day):
                    return day
                day += _DAY
                continue
            i = bisect_left(self._months, day.month)
            if i < len(self._months):
                day = date(day.year, self._months[i], 1)
            elif day.year == date.max.year:
                # ``day += _DAY`` past the calendar raises this too: the callers end there.
                raise OverflowError("no later date in the calendar")
            else:
                day = date(day.year + 1, self._months[0], 1)
        # parse() refuses expressions that never match, so this is a broken invariant.
        raise RuntimeError(f"no matching day within {_MATCH_HORIZON_YEARS} years of {day}")

    def _time_at_or_after(self, hour: int, minute: int, second: int) -> tuple[int, int, int] | None:
        hours, minutes, seconds = self._hours, self._minutes, self._seconds
        i = bisect_left(hours, hour)
        if i == len(hours):
            return None
        if hours[i] == hour:
            j = bisect_left(minutes, minute)
            if j < len(minutes) and minutes[j] == minute:
                k = bisect_left(seconds, second)
                if k < len(seconds):
                    return hour, minute, seconds[k]
                j += 1
            if j < len(minutes):
                return hour, minutes[j], seconds[0]
            i += 1
            if i == len(hours):
                return None
        return hours[i], minutes[0], seconds[0]


def _unrestricted(day_field: str) -> bool:
    # crontab(5): a day field is restricted when it does not start with "*"; "?" reads as "*".
    return day_field.startswith(("*", "?"))


def _days_ored(fields: list[str]) -> bool:
    """Vixie cron: a day matching either day field is enough when both are restricted.

    Read from the raw text, as cron does: "*/7" is unrestricted (so it narrows the other field)
    while "1-31" is restricted although it names every day.
    """
    return not _unrestricted(fields[-3]) and not _unrestricted(fields[-1])


def _month_shaped(fields: list[str]) -> bool:
    dom, dow = fields[-3].lower(), fields[-1].lower()
    return "l" in dom or "w" in dom or "l" in dow or "#" in dow


def _walk_exprs(fields: list[str]) -> tuple[str, ...]:
    """Expressions whose matches, each an intersection of all fields, together make the schedule.

    Two halves when the day fields are ORed: croniter intersects a ``#``, ``L`` or ``W`` day
    with the other day field instead of adding to it, so each half is walked on its own.
    """
    if not _days_ored(fields):
        return (" ".join(fields),)
    return (
        " ".join([*fields[:-1], "*"]),
        " ".join([*fields[:-3], "*", *fields[-2:]]),
    )


def _values(expanded: list[int | str], low: int, high: int) -> tuple[int, ...]:
    if expanded[0] == "*":
        return tuple(range(low, high + 1))
    return tuple(sorted(v for v in expanded if isinstance(v, int)))


@dataclass(frozen=True)
class CronSchedule:
    """A validated cron expression: 5 fields, or 6 with a leading seconds field.

    ``CronSchedule(expr)`` validates and raises :class:`InvalidCronError`; :func:`parse` does
    the same with a cache. ``wall_clock`` is the DST class: False when the hour field starts
    with ``*``, which makes the schedule real-time.
    """

    expr: str
    has_seconds: bool = field(init=False)
    wall_clock: bool = field(init=False)
    _matcher: _WallMatcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        has_seconds, fields, expanded, walkers = _validate(self.expr)
        hour_text = fields[2] if has_seconds else fields[1]
        object.__setattr__(self, "has_seconds", has_seconds)
        object.__setattr__(self, "wall_clock", not hour_text.startswith("*"))
        object.__setattr__(self, "_matcher", _WallMatcher(fields, expanded, walkers))


def parse(expr: str) -> CronSchedule:
    """Validate ``expr`` and return its schedule; raises :class:`InvalidCronError`.

    Cached: the scheduler asks for the same few expressions on every round.
    """
    if not isinstance(expr, str):
        raise _not_a_string(expr)
    return _parse_cached(expr)


@lru_cache(maxsize=4096)
def _parse_cached(expr: str) -> CronSchedule:
    return CronSchedule(expr)


def _not_a_string(expr: object) -> InvalidCronError:
    return InvalidCronError(
        f"cron must be a string, got {type(expr).__name__} {expr!r}",
        fix='pass the expression as a string, e.g. cron="0 3 * * *"',
        cause=expr,
    )


def _validate(
    expr: object,
) -> tuple[bool, list[str], list[list[int | str]], tuple[croniter[datetime], ...]]:
    if not isinstance(expr, str):
        raise _not_a_string(expr)
    fields: list[str] = _FIELD_TOKEN.findall(expr)
    if not fields:
        raise InvalidCronError("cron is empty", fix=_FIELD_COUNT_FIX, cause=expr)
    nickname = _NICKNAMES.get(expr.strip().lower())
    if nickname is not None:
        raise InvalidCronError(
            f'cron "{expr}": nicknames are not supported',
            fix=f'write the fields out: "{nickname}" instead of "{expr.strip()}"',
            cause=expr,
        )
    if len(fields) not in (5, 6):
        raise InvalidCronError(
            f'cron "{expr}" has {len(fields)} field{"" if len(fields) == 1 else "s"}; '
            "5 or 6 fields expected",
            fix=_FIELD_COUNT_FIX,
            cause=expr,
        )
    has_seconds = len(fields) == 6
    specs = _FIELDS_6 if has_seconds else _FIELDS_5
    for spec, token in zip(specs, fields, strict=True):
        if token.lower().startswith(("h", "r")):
            raise InvalidCronError(
                f'cron "{expr}": {spec.name} field "{token}" is a hashed (H) or random (R) '
                "value, which is not supported",
                fix=f"write the {spec.name} out: every node must compute the same schedule; "
                + spec.fix,
                cause=token,
            )
    fields = [
        _wrapped_steps(_one_value_ranges(token, spec), spec)
        for spec, token in zip(specs, fields, strict=True)
    ]
    try:
        expanded, _nth = croniter.expand(" ".join(fields), second_at_beginning=has_seconds)
    except CroniterError as exc:
        raise _field_error(expr, fields, specs, exc) from exc
    walkers = []
    never: CroniterBadDateError | None = None
    for walk in _walk_exprs(fields):
        # day_or=False: each expression is an intersection; the ORed halves are separate ones.
        walker = croniter(
            walk,
            _PROBE_START,
            ret_type=datetime,
            day_or=False,
            second_at_beginning=has_seconds,
            max_years_between_matches=_MATCH_HORIZON_YEARS,
        )
        try:
            walker.get_next(datetime)
        except CroniterBadDateError as exc:
            # Under the OR rule a half that never matches adds no dates; the other may still.
            never = exc
            continue
        except CroniterError as exc:
            raise InvalidCronError(
                f'cron "{expr}" is not a valid expression: {exc}', fix=_FIELD_COUNT_FIX, cause=exc
            ) from exc
        walkers.append(walker)
    if not walkers:
        raise _never_matches(expr, fields, never)
    return has_seconds, fields, [list(values) for values in expanded], tuple(walkers)


_RANGE: Final = re.compile(r"([0-9]+|[A-Za-z]+)-([0-9]+|[A-Za-z]+)(?:/.*)?")


def _one_value_ranges(token: str, spec: _Field) -> str:
    """``token`` with each range whose ends are the same value ("5-5", "MON-MON", "1-1/3",
    "7-SUN") written as that value, as Vixie cron reads it: croniter reads such a range as the
    whole field ("Jan-Jan" as every month), so "5-5 3-3 * * *" would fire every minute."""
    items = token.split(",")
    for i, item in enumerate(items):
        match = _RANGE.fullmatch(item)
        if match is None:
            continue
        low, high = (_value(end, spec) for end in match.group(1, 2))
        # Sunday is 0 and 7: "7-0" is Sunday alone, where "0-7" is the whole week.
        sunday = spec.name == "day-of-week" and (low, high) == (7, 0)
        if low is not None and (low == high or sunday):
            items[i] = match.group(1)
    return ",".join(items)


def _value(end: str, spec: _Field) -> int | None:
    """A range's end as the field's number (a name as its number: SUN is 0); None for a name
    the field has not, which croniter refuses as it is."""
    return int(end) if end.isdigit() else _NAMED.get(spec.name, {}).get(end.lower())


_STEPPED_RANGE: Final = re.compile(r"([0-9]+|[A-Za-z]+)-([0-9]+|[A-Za-z]+)/([0-9]+)")
#: Cron's names for months and days of the week (English, whatever the locale).
_NAMED: Final = {
    "month": {
        name: n
        for n, name in enumerate(
            ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
            start=1,
        )
    },
    "day-of-week": {
        name: n for n, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
    },
}


def _wrapped_steps(token: str, spec: _Field) -> str:
    """``token`` with each reversed range that has a step ("23-1/2", "SAT-TUE/2") written as
    the values it stands for: the range wraps past the field's end ("23-1" is 23, 0, 1) and the
    step takes every n-th of those (23 and 1). Croniter counts the step wrongly after the wrap
    ("20-3/3" as 20, 23, 3 rather than 20, 23, 2)."""
    high = 6 if spec.name == "day-of-week" else spec.high  # 7 is Sunday again, not a day
    items = token.split(",")
    for i, item in enumerate(items):
        match = _STEPPED_RANGE.fullmatch(item)
        if match is None or not int(match.group(3)):
            continue  # Not such a range; a step of 0 is refused with the rest.
        low, top = (_value(end, spec) for end in match.group(1, 2))
        if low is not None and spec.name == "day-of-week":
            low %= 7  # "7-2/2" starts on Sunday: in order, not reversed
        if low is None or top is None or low <= top or not spec.low <= top <= low <= high:
            continue  # In order, or out of range: croniter reads it, or refuses it, as it is.
        cycle = [*range(low, high + 1), *range(spec.low, top + 1)]
        items[i] = ",".join(str(value) for value in cycle[:: int(match.group(3))])
    return ",".join(items)


def _never_matches(expr: str, fields: list[str], cause: Exception | None) -> InvalidCronError:
    dom, month, dow = fields[-3:]
    fix = (
        'use a day that exists in that month, e.g. "0 0 28 2 *", or "0 0 L 2 *" for the last '
        "day of February"
    )
    if _days_ored(fields):
        days = f', nor does any fall on day-of-week "{dow}"'
    elif dow in ("*", "?"):
        days = ""
    else:
        days = f' on day-of-week "{dow}"'
        starred = dom if _unrestricted(dom) else dow
        if starred not in ("*", "?"):
            fix += (
                f'; a day field starting with "*" (here "{starred}") must match as well: to run '
                'when either day field matches, write it without the leading "*", e.g. "1-31/2" '
                'rather than "*/2"'
            )
    return InvalidCronError(
        f'cron "{expr}" can never match: no date has day-of-month "{dom}" in month "{month}"{days}',
        fix=fix,
        cause=cause,
    )


def _field_error(
    expr: str, fields: list[str], specs: tuple[_Field, ...], exc: CroniterError
) -> InvalidCronError:
    # croniter names neither the field nor the value, so try each field alone among stars.
    for i, (spec, token) in enumerate(zip(specs, fields, strict=True)):
        probe = ["*"] * len(fields)
        probe[i] = token
        try:
            croniter.expand(" ".join(probe), second_at_beginning=len(fields) == 6)
        except CroniterError as field_exc:
            return InvalidCronError(
                f'cron "{expr}": {spec.name} field "{token}" {_field_problem(spec, token)}',
                fix=spec.fix,
                cause=field_exc,
            )
    return InvalidCronError(
        f'cron "{expr}" is not a valid expression: {exc}',
        fix=_FIELD_COUNT_FIX,
        cause=exc,
    )


def _field_problem(spec: _Field, token: str) -> str:
    for item in token.split(","):
        values, _, step = item.partition("/")
        # isdecimal and ASCII: "²".isdigit() holds, yet int() refuses it.
        if step and (not (step.isascii() and step.isdecimal()) or int(step) == 0):
            return f'has step "{step}"; a step must be a whole number of at least 1'
        for bound in values.split("-"):
            if bound.isascii() and bound.isdecimal() and not spec.low <= int(bound) <= spec.high:
                if bound == token:
                    return f"is out of range {spec.low}-{spec.high}"
                return f"has {bound}, out of range {spec.low}-{spec.high}"
    return (
        f"is not valid (allowed: {spec.allowed}, *, lists like 1,5, ranges like 1-5, "
        "steps like */15)"
    )


def check_dst_options(dst_gap: object, dst_repeat: object, owner: str) -> tuple[DstGap, DstRepeat]:
    """Return ``(dst_gap, dst_repeat)`` when both are valid; raises :class:`InvalidDstOptionError`.

    ``owner`` names where the values came from (``'task "nightly"'``) for the message.
    """
    if not (isinstance(dst_gap, str) and dst_gap in _DST_GAPS):
        raise InvalidDstOptionError(
            f'{owner}: dst_gap must be "end-of-gap" or "skip", got {dst_gap!r}',
            fix='use dst_gap="end-of-gap" (a time skipped by the clock change runs when the gap '
            'ends, the default) or dst_gap="skip" (it does not run that day)',
            cause=dst_gap,
        )
    if not (isinstance(dst_repeat, str) and dst_repeat in _DST_REPEATS):
        raise InvalidDstOptionError(
            f'{owner}: dst_repeat must be "first" or "both", got {dst_repeat!r}',
            fix='use dst_repeat="first" (a time the clock change repeats runs once, at its first '
            'pass, the default) or dst_repeat="both" (it runs at both passes)',
            cause=dst_repeat,
        )
    return cast("DstGap", dst_gap), cast("DstRepeat", dst_repeat)


def next_occurrence(
    expr: str | CronSchedule,
    tz: str | ZoneInfo,
    after: datetime,
    *,
    dst_gap: DstGap = "end-of-gap",
    dst_repeat: DstRepeat = "first",
) -> datetime:
    """The first occurrence strictly after the aware datetime ``after``, as an aware UTC datetime.

    ``expr`` is read as wall-clock time in ``tz`` under the DST rule of this module;
    ``dst_gap`` and ``dst_repeat`` choose it for wall-clock schedules and do nothing for
    real-time ones. Raises :class:`InvalidCronError` for a bad expression,
    :class:`InvalidDstOptionError` for a bad option, ValueError/TypeError for a naive ``after``,
    ValueError when no occurrence comes before the end of year 9999.
    """
    if dst_gap == "end-of-gap" and dst_repeat == "first":
        # The scheduler's hot path: the default rule, with no validation to pay for.
        skip = both = False
    else:
        skip, both = _dst_flags(dst_gap, dst_repeat, "next_occurrence")
    schedule, zone, start = _schedule(expr), _zone(tz), _as_utc(after, "after")
    try:
        return _next(schedule, zone, start, skip, both)
    except OverflowError:
        raise ValueError(
            f'cron "{schedule.expr}" has no occurrence after {start.isoformat()} '
            "before the end of year 9999"
        ) from None


def occurrences(
    expr: str | CronSchedule,
    tz: str | ZoneInfo,
    after: datetime,
    until: datetime | None = None,
    *,
    dst_gap: DstGap = "end-of-gap",
    dst_repeat: DstRepeat = "first",
) -> Iterator[datetime]:
    """Successive occurrences strictly after ``after`` and up to ``until`` inclusive.

    Endless when ``until`` is None, up to the end of year 9999. Arguments are checked when the
    iterator is created.
    """
    schedule, zone, start = _schedule(expr), _zone(tz), _as_utc(after, "after")
    end = None if until is None else _as_utc(until, "until")
    skip, both = _dst_flags(dst_gap, dst_repeat, "occurrences")
    return _iterate(schedule, zone, start, end, skip, both)


def between(
    expr: str | CronSchedule,
    tz: str | ZoneInfo,
    start_exclusive: datetime,
    end_inclusive: datetime,
    limit: int | None = None,
    *,
    keep: Literal["earliest", "latest"] = "earliest",
    dst_gap: DstGap = "end-of-gap",
    dst_repeat: DstRepeat = "first",
) -> list[datetime]:
    """Occurrences ``o`` with ``start_exclusive < o <= end_inclusive``, in ascending order.

    With ``limit``, at most that many: the earliest ones, or with ``keep="latest"`` the most
    recent ones, found without walking the whole range (a long outage of a per-second cron
    would otherwise enumerate millions of occurrences to keep ten).
    """
    schedule, zone = _schedule(expr), _zone(tz)
    start = _as_utc(start_exclusive, "start_exclusive")
    end = _as_utc(end_inclusive, "end_inclusive")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise TypeError(f"limit must be an int or None, got {limit!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
    if keep not in ("earliest", "latest"):
        raise ValueError(f'keep must be "earliest" or "latest", got {keep!r}')
    skip, both = _dst_flags(dst_gap, dst_repeat, "between")
    if limit == 0 or end <= start:
        return []
    if limit is None:
        return list(_iterate(schedule, zone, start, end, skip, both))
    if keep == "earliest":
        found: list[datetime] = []
        for occurrence in _iterate(schedule, zone, start, end, skip, both):
            found.append(occurrence)
            if len(found) == limit:
                break
        return found
    # Widen a window back from the end until it holds `limit` occurrences or reaches the start.
    window = schedule._matcher.unit * limit
    while True:
        low = max(start, end - window)
        found = list(_iterate(schedule, zone, low, end, skip, both))
        if len(found) >= limit or low == start:
            return found[-limit:]
        window *= 2


def describe_occurrence(
    expr: str | CronSchedule,
    tz: str | ZoneInfo,
    occurrence: datetime,
    *,
    dst_gap: DstGap = "end-of-gap",
    dst_repeat: DstRepeat = "first",
) -> OccurrenceKind:
    """How the DST rule placed ``occurrence``, for admin previews.

    - ``"normal"``: the local wall time at that instant is one the expression names, and it
      occurs once;
    - ``"gap-shifted"``: a wall-clock slot that fell in a DST gap, fired at the gap's end (the
      local wall time there is not itself one the expression names); never under
      ``dst_gap="skip"``;
    - ``"repeated-first"``: the local wall time occurs twice and this is the first pass;
    - ``"repeated"``: the second pass of a repeated wall time (real-time schedules, and
      wall-clock ones under ``dst_repeat="both"``).

    Raises ValueError when ``occurrence`` is not an occurrence of the schedule under the
    options given.
    """
    schedule, zone = _schedule(expr), _zone(tz)
    instant = _as_utc(occurrence, "occurrence")
    skip, both = _dst_flags(dst_gap, dst_repeat, "describe_occurrence")
    if _next(schedule, zone, instant - _MICROSECOND, skip, both) != instant:
        raise ValueError(
            f"{instant.isoformat()} is not an occurrence of cron {schedule.expr!r} in {zone}"
        )
    local = instant.astimezone(zone)
    if local.fold:
        return "repeated"
    if local.replace(fold=1).utcoffset() != local.utcoffset():
        return "repeated-first"
    if schedule.wall_clock and not schedule._matcher.matches(local.replace(tzinfo=None)):
        return "gap-shifted"
    return "normal"


def _dst_flags(dst_gap: object, dst_repeat: object, owner: str) -> tuple[bool, bool]:
    """``(skip gaps, fire both passes)`` for valid options."""
    gap, repeat = check_dst_options(dst_gap, dst_repeat, owner)
    return gap == "skip", repeat == "both"


def _schedule(expr: str | CronSchedule) -> CronSchedule:
    return expr if isinstance(expr, CronSchedule) else parse(expr)


def _zone(tz: str | ZoneInfo) -> ZoneInfo:
    if isinstance(tz, ZoneInfo):
        return tz
    if isinstance(tz, str):
        # As a declaration reads it: a zone of the IANA database, never a host's file.
        return resolve_zone(tz, "", given_to="next_occurrence()")
    raise TypeError(f"tz must be an IANA zone name or a ZoneInfo, got {type(tz).__name__}")


def _as_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.utcoffset() is None:
        raise ValueError(
            f"{name} must be an aware datetime, got naive {value.isoformat()}; "
            "e.g. datetime.now(timezone.utc)"
        )
    return value.astimezone(UTC)


def _iterate(
    schedule: CronSchedule,
    zone: ZoneInfo,
    after: datetime,
    until: datetime | None,
    skip_gaps: bool,
    both_passes: bool,
) -> Iterator[datetime]:
    while True:
        try:
            after = _next(schedule, zone, after, skip_gaps, both_passes)
        except OverflowError:
            return  # past year 9999: the calendar datetime can hold ends here
        if until is not None and after > until:
            return
        yield after


def _next(
    schedule: CronSchedule, zone: ZoneInfo, after: datetime, skip_gaps: bool, both_passes: bool
) -> datetime:
    if schedule.wall_clock:
        return _next_wall_clock(schedule._matcher, zone, after, skip_gaps, both_passes)
    return _next_real_time(schedule._matcher, zone, after)


def _next_wall_clock(
    matcher: _WallMatcher, zone: ZoneInfo, after: datetime, skip_gaps: bool, both_passes: bool
) -> datetime:
    # Each slot maps to one instant and that mapping never goes backwards, so every slot at or
    # before after's local wall time maps at or before `after`: start the walk just past it.
    local = after.astimezone(zone)
    wall = matcher.first_after(local.replace(tzinfo=None))
    if both_passes and local.fold == 0 and local.replace(fold=1).utcoffset() != local.utcoffset():
        # `after` is in the first pass of a repeated window. Every first pass comes before every
        # second pass, so with no slot left in this first pass the answer is the second pass
        # of the window's earliest slot.
        change = _offset_change(zone, after, local.replace(fold=1).astimezone(UTC))
        window_start = _wall(change, _offset_at(zone, change))
        window_end = _wall(change, _offset_at(zone, after))
        if wall >= window_end:
            again = matcher.first_at_or_after(window_start)
            if again < window_end:
                return again.replace(tzinfo=zone, fold=1).astimezone(UTC)
    while True:
        first = wall.replace(tzinfo=zone).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if first == second:
            instant = first
        elif first < second:
            # A repeated wall time: fold=0 is the first pass. It lies before `after` only when
            # `after` is in the second pass; jump past the repeated window in one go.
            if first > after:
                return first
            if both_passes and second > after:
                return second
            end = _offset_change(zone, first, second)
            wall = matcher.first_at_or_after(_wall(end, _offset_at(zone, first)))
            continue
        else:
            # A gap: fold=0 reads the wall time with the offset before the change, fold=1 with
            # the one after, so the change itself lies in (second, first].
            end = _offset_change(zone, second, first)
            day = datetime(wall.year, wall.month, wall.day)
            gap_start = _wall(end, _offset_at(zone, second))
            gap_end = _wall(end, _offset_at(zone, end))
            if gap_start <= day and day + _DAY <= gap_end:
                # This local date never existed (Pacific/Apia, 2011-12-30): no slots at all.
                wall = matcher.first_at_or_after(day + _DAY)
                continue
            if skip_gaps:
                wall = matcher.first_at_or_after(gap_end)
                continue
            instant = end
        if instant > after:
            return instant
        wall = matcher.first_after(wall)


def _next_real_time(matcher: _WallMatcher, zone: ZoneInfo, after: datetime) -> datetime:
    # Walk spans of constant UTC offset: inside one, wall time and real time move together.
    start, offset, inclusive = after, _offset_at(zone, after), False
    while True:
        local = _wall(start, offset)
        wall = matcher.first_at_or_after(local) if inclusive else matcher.first_after(local)
        candidate = (wall - offset).replace(tzinfo=UTC)
        change = _next_offset_change(zone, start, offset, candidate)
        if change is None:
            return candidate
        # The instant of the change belongs to the new span and has not been tried yet.
        start, offset, inclusive = change, _offset_at(zone, change), True


def _wall(instant: datetime, offset: timedelta) -> datetime:
    return (instant + offset).replace(tzinfo=None)


def _offset_at(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    if offset is None:  # pragma: no cover - a ZoneInfo always has an offset
        raise ValueError(f"{zone.key} has no UTC offset at {instant.isoformat()}")
    return offset


def _next_offset_change(
    zone: ZoneInfo, start: datetime, offset: timedelta, bound: datetime
) -> datetime | None:
    """The first instant in (start, bound] whose UTC offset differs from ``offset``."""
    low = start
    while low < bound:
        high = min(low + _PROBE_STEP, bound)
        if _offset_at(zone, high) != offset:
            return _offset_change(zone, low, high)
        low = high
    return None


def wall_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The instant a naive local ``wall`` time in ``zone`` names, by the rule slots follow: a
    repeated wall time is its first pass, and one the clock skipped (in a gap) is the gap's
    end, where a slot there fires."""
    try:
        first = wall.replace(tzinfo=zone).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    except OverflowError:
        return wall.replace(tzinfo=zone)  # Years 1 and 9999 hold no clock change.
    if first <= second:
        return wall.replace(tzinfo=zone)
    # A gap: fold=0 reads it with the offset before the change, fold=1 with the one after.
    return _offset_change(zone, second, first).astimezone(zone)


def _offset_change(zone: ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The instant in (low, high] where the offset changes, given it changes once there."""
    # tz database changes fall on whole seconds, so search whole seconds only.
    offset = _offset_at(zone, low)
    low, high = low.replace(microsecond=0), high.replace(microsecond=0)
    while high - low > _SECOND:
        middle = low + timedelta(seconds=(high - low) // _SECOND // 2)
        if _offset_at(zone, middle) == offset:
            low = middle
        else:
            high = middle
    return high
