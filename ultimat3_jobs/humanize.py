"""Cron expressions and DST placements in words, for the admin.

The words come from ``cron-descriptor``: it covers the whole syntax croniter accepts (lists,
ranges, steps, ``L``, ``W``, ``#``, a leading seconds field) in some twenty languages, so the
admin does not grow a second cron parser that could drift from the real one. It is display
only: what runs when is decided by :mod:`ultimat3_jobs.cron` alone.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from pathlib import Path

from django.utils import translation

from .cron import CronSchedule, DstGap, DstRepeat, OccurrenceKind, parse
from .errors import InvalidCronError

_FALLBACK_LOCALE = "en_US"


@functools.cache
def _descriptor_locales() -> frozenset[str]:
    import cron_descriptor

    folder = Path(cron_descriptor.__file__).resolve().parent / "locale"
    return frozenset(path.stem for path in folder.glob("*.mo"))


def descriptor_locale(language: str | None = None) -> str:
    """The cron-descriptor locale closest to a Django language code (``"fr"`` -> ``"fr_FR"``)."""
    code = translation.to_locale(language or translation.get_language() or "en-us")
    available = _descriptor_locales()
    if code in available:
        return code
    prefix = code.split("_")[0].lower() + "_"
    for candidate in sorted(available):
        # A bare language means its home region first ("fr" -> "fr_FR"), then any region.
        if candidate.lower() == prefix + prefix[:-1]:
            return candidate
    same_language = sorted(c for c in available if c.lower().startswith(prefix))
    return same_language[0] if same_language else _FALLBACK_LOCALE


def describe_cron(expr: str, language: str | None = None) -> str:
    """``"0 3 * * 1-5"`` -> ``"At 03:00, Monday through Friday"``; ``""`` if it cannot say.

    24-hour times, because the admin shows times in 24-hour form next to it.
    """
    return _describe(expr, descriptor_locale(language))


@functools.lru_cache(maxsize=1024)
def _describe(expr: str, locale: str) -> str:
    from cron_descriptor import ExpressionDescriptor, Options

    options = Options()
    options.use_24hour_time_format = True
    options.locale_code = locale
    try:
        return str(ExpressionDescriptor(expr, options).get_description())
    except Exception:  # A description is a nicety: the raw expression is shown next to it.
        return ""


def dst_rule(
    expr: str | CronSchedule, dst_gap: DstGap = "end-of-gap", dst_repeat: DstRepeat = "first"
) -> str:
    """What a DST change does to this schedule, in one sentence (SPEC §3 and the options)."""
    try:
        schedule = parse(expr) if isinstance(expr, str) else expr
    except InvalidCronError:
        return ""
    if not schedule.wall_clock:
        return (
            "Real-time schedule: it runs at every real instant whose local time matches, so "
            "times inside a DST gap do not run and a repeated hour runs twice."
        )
    gap = (
        "a time skipped by a DST gap does not run that day"
        if dst_gap == "skip"
        else "a time skipped by a DST gap runs when the gap ends"
    )
    repeat = (
        "a time repeated when clocks go back runs at both passes"
        if dst_repeat == "both"
        else "a time repeated when clocks go back runs once, on its first pass"
    )
    return f"Wall-clock schedule: {gap}; {repeat}."


#: How each placement reads in the next-runs preview; empty for an ordinary occurrence.
OCCURRENCE_NOTES: dict[OccurrenceKind, str] = {
    "normal": "",
    "gap-shifted": "DST gap: this slot does not exist, so it runs when the gap ends",
    "repeated-first": "Repeated hour: first pass of a local time that occurs twice",
    "repeated": "Repeated hour: second pass of a local time that occurs twice",
}


def duration(delta: timedelta) -> str:
    """A short span for status lines: ``"45 s"``, ``"12 min"``, ``"3 h 5 min"``, ``"2 d 4 h"``."""
    seconds = int(abs(delta).total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours < 1:
        return f"{minutes} min"
    if days < 1:
        rest = minutes - hours * 60
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    rest = hours - days * 24
    return f"{days} d {rest} h" if rest else f"{days} d"
