"""What a round owes one task: which due occurrences fire, which are dropped, the new watermark.

Pure: the schedule comes in as ``next_after`` (the first occurrence strictly after an instant),
and the watermark, now and the grace are passed in, so every policy is tested without a
database, a clock or a cron. "Due" is ``watermark < occurrence <= now``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .clock import ONE_MS

#: Dropped occurrences are counted up to this many; a longer run is recorded as "at least".
COUNT_LIMIT = 10_000

NextAfter = Callable[[datetime], datetime]


@dataclass(frozen=True, slots=True)
class Span:
    """A run of consecutive occurrences, recorded as one row."""

    first: datetime
    last: datetime
    count: int
    at_least: bool = False


@dataclass(frozen=True, slots=True)
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
    next_after: NextAfter, after: datetime, until: datetime
) -> tuple[Span | None, datetime]:
    """The occurrences in ``(after, until]`` counted up to ``COUNT_LIMIT``, and the next one."""
    first = last = None
    count = 0
    at = next_after(after)
    while at <= until:
        if count == COUNT_LIMIT:
            # Counting a week of a per-second task is no use to anyone; say "at least".
            assert first is not None
            return Span(first, until, count, at_least=True), next_after(until)
        first = first or at
        last = at
        count += 1
        at = next_after(at)
    if first is None or last is None:
        return None, at
    return Span(first, last, count), at


def _until(
    next_after: NextAfter, first: datetime, until: datetime
) -> tuple[list[datetime], datetime]:
    """``first`` and the occurrences after it up to ``until``, and the next one after those."""
    found = []
    at = first
    while at <= until:
        found.append(at)
        at = next_after(at)
    return found, at


def _latest(
    next_after: NextAfter, after: datetime, until: datetime, keep: int
) -> tuple[list[datetime], datetime]:
    """The last ``keep`` occurrences in ``(after, until]`` and the next one, without walking all.

    A per-second task down for a day owes 86,400 occurrences; run-all fires only the latest
    ``keep``, so widen a window back from ``until`` until it holds that many or reaches ``after``.
    """
    width = timedelta(minutes=1)
    while True:
        start = max(after, until - width)
        recent: deque[datetime] = deque(maxlen=keep)
        at = next_after(start)
        while at <= until:
            recent.append(at)
            at = next_after(at)
        if len(recent) >= keep or start == after:
            return list(recent), at
        width *= 8


def decide(
    next_after: NextAfter,
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
    first = next_after(watermark)
    if first > now:
        return Decision(next_due=first)
    if policy == "run-once":
        dropped, next_due = span_between(next_after, first, now)
        return Decision(
            next_due=next_due,
            fire=[(first, dropped is not None)],
            dropped=dropped,
            watermark=now,
        )
    if policy == "run-all":
        recent, next_due = _latest(next_after, watermark, now, max_catch_up)
        late = [(o, now - o > misfire_grace) for o in recent]
        dropped = None
        if recent[0] != first:
            dropped, _ = span_between(next_after, watermark, recent[0] - ONE_MS)
        return Decision(next_due=next_due, fire=late, dropped=dropped, watermark=now)
    # skip. An occurrence exactly ``misfire_grace`` old is still on time; instants are whole ms.
    on_time_after = max(watermark, now - misfire_grace - ONE_MS)
    dropped = None
    if first <= on_time_after:
        dropped, first = span_between(next_after, watermark, on_time_after)
    on_time, next_due = _until(next_after, first, now)
    return Decision(
        next_due=next_due,
        fire=[(o, False) for o in on_time],
        dropped=dropped,
        watermark=now,
    )
