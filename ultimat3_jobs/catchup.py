"""What a round owes one task: which due occurrences fire, which are dropped, the new watermark.

Pure: the watermark, now and the grace are passed in, so every policy is tested without a
database or a clock. "Due" is ``watermark < occurrence <= now``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from .cron import CronSchedule, next_occurrence

#: Dropped occurrences are counted up to this many; a longer run is recorded as "at least".
COUNT_LIMIT = 10_000


@dataclass(frozen=True)
class Span:
    """A run of consecutive occurrences, recorded as one row."""

    first: datetime
    last: datetime
    count: int
    at_least: bool = False


@dataclass(frozen=True)
class Decision:
    """``fire`` is ``[(occurrence, catch_up)]`` in order; ``watermark`` holds once all fire."""

    fire: list[tuple[datetime, bool]] = field(default_factory=list)
    dropped: Span | None = None
    watermark: datetime | None = None

    @property
    def due(self) -> bool:
        return bool(self.fire) or self.dropped is not None


def _span(schedule: CronSchedule, zone: ZoneInfo, after: datetime, until: datetime) -> Span | None:
    """The occurrences in ``(after, until]``, counted up to ``COUNT_LIMIT``."""
    first = last = None
    count = 0
    at = after
    while count < COUNT_LIMIT:
        at = next_occurrence(schedule, zone, at)
        if at > until:
            break
        first = first or at
        last = at
        count += 1
    else:
        if next_occurrence(schedule, zone, at) <= until:
            return Span(first or at, until, count, at_least=True)
    if first is None or last is None:
        return None
    return Span(first, last, count)


def _window(
    schedule: CronSchedule, zone: ZoneInfo, after: datetime, until: datetime, keep: int
) -> list[datetime]:
    """The last ``keep`` occurrences in ``(after, until]``, found without walking all of them.

    A per-second task down for a day owes 86,400 occurrences; run-all fires only the latest
    ``keep``, so widen a window back from ``until`` until it holds that many or reaches ``after``.
    """
    width = timedelta(minutes=1)
    while True:
        start = max(after, until - width)
        recent: deque[datetime] = deque(maxlen=keep)
        at = start
        while (at := next_occurrence(schedule, zone, at)) <= until:
            recent.append(at)
        if len(recent) >= keep or start == after:
            return list(recent)
        width *= 8


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
        return Decision()
    if policy == "run-once":
        second = next_occurrence(schedule, zone, first)
        return Decision(
            fire=[(first, second <= now)],
            dropped=_span(schedule, zone, first, now),
            watermark=now,
        )
    if policy == "run-all":
        recent = _window(schedule, zone, watermark, now, max_catch_up)
        late = [(o, now - o > misfire_grace) for o in recent]
        dropped = _span(schedule, zone, watermark, recent[0] - timedelta(milliseconds=1))
        return Decision(fire=late, dropped=dropped, watermark=now)
    # skip
    # An occurrence exactly ``misfire_grace`` old is still on time; instants are whole ms.
    on_time_after = max(watermark, now - misfire_grace - timedelta(milliseconds=1))
    on_time: list[tuple[datetime, bool]] = []
    at = on_time_after
    while (at := next_occurrence(schedule, zone, at)) <= now:
        on_time.append((at, False))
    return Decision(
        fire=on_time, dropped=_span(schedule, zone, watermark, on_time_after), watermark=now
    )
