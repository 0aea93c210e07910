"""What a round owes one task: which due occurrences fire, which are dropped, the new watermark.

Pure: the watermark, now and the grace are passed in, so every policy is tested without a
database or a clock. "Due" is ``watermark < occurrence <= now``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from .cron import CronSchedule, between, next_occurrence

#: Dropped occurrences are counted up to this many; a longer run is recorded as "at least".
COUNT_LIMIT = 10_000
ONE_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Span:
    """A run of consecutive occurrences, recorded as one row."""

    first: datetime
    last: datetime
    count: int
    at_least: bool = False


@dataclass(frozen=True)
class Decision:
    """``fire`` is ``[(occurrence, catch_up)]`` in order; ``watermark`` holds once all fire.

    ``next_due`` is the first occurrence after the round, so the caller need not compute it.
    """

    next_due: datetime
    fire: list[tuple[datetime, bool]] = field(default_factory=list)
    dropped: Span | None = None
    watermark: datetime | None = None

    @property
    def due(self) -> bool:
        return bool(self.fire) or self.dropped is not None


def span_between(
    schedule: CronSchedule, zone: ZoneInfo, after: datetime, until: datetime
) -> tuple[Span | None, datetime]:
    """The occurrences in ``(after, until]`` counted up to ``COUNT_LIMIT``, and the next one."""
    first = last = None
    count = 0
    at = next_occurrence(schedule, zone, after)
    while at <= until:
        if count == COUNT_LIMIT:
            # Counting a week of a per-second task is no use to anyone; say "at least".
            assert first is not None
            return Span(first, until, count, at_least=True), next_occurrence(schedule, zone, until)
        first = first or at
        last = at
        count += 1
        at = next_occurrence(schedule, zone, at)
    if first is None or last is None:
        return None, at
    return Span(first, last, count), at


def _until(
    schedule: CronSchedule, zone: ZoneInfo, first: datetime, until: datetime
) -> tuple[list[datetime], datetime]:
    """``first`` and the occurrences after it up to ``until``, and the next one after those."""
    found = []
    at = first
    while at <= until:
        found.append(at)
        at = next_occurrence(schedule, zone, at)
    return found, at


def decide(
    schedule: CronSchedule,
    zone: ZoneInfo,
    *,
    policy: str,
    max_catch_up: int,
    watermark: datetime,
    now: datetime,
    misfire_grace: timedelta,
) -> Decision:
    """Apply the catch-up policy to the occurrences due since ``watermark``.

    - skip: fire the on-time ones (``now - o <= misfire_grace``), drop the missed ones;
    - run-once: fire the earliest due one (``catch_up`` when more than one was due) and drop
      the rest in the same round, never one per round;
    - run-all: fire the most recent ``max_catch_up`` in order, drop the older ones.
    """
    first = next_occurrence(schedule, zone, watermark)
    if first > now:
        return Decision(next_due=first)
    if policy == "run-once":
        dropped, next_due = span_between(schedule, zone, first, now)
        return Decision(
            next_due=next_due,
            fire=[(first, dropped is not None)],
            dropped=dropped,
            watermark=now,
        )
    if policy == "run-all":
        recent = between(schedule, zone, watermark, now, max_catch_up, keep="latest")
        next_due = next_occurrence(schedule, zone, now)
        late = [(o, now - o > misfire_grace) for o in recent]
        dropped = None
        if recent[0] != first:
            dropped, _ = span_between(schedule, zone, watermark, recent[0] - ONE_MS)
        return Decision(next_due=next_due, fire=late, dropped=dropped, watermark=now)
    # skip. An occurrence exactly ``misfire_grace`` old is still on time; instants are whole ms.
    on_time_after = max(watermark, now - misfire_grace - ONE_MS)
    dropped = None
    if first <= on_time_after:
        dropped, first = span_between(schedule, zone, watermark, on_time_after)
    on_time, next_due = _until(schedule, zone, first, now)
    return Decision(
        next_due=next_due,
        fire=[(o, False) for o in on_time],
        dropped=dropped,
        watermark=now,
    )
