"""The one clock every reading of "now" goes through, so a frozen one cannot be bypassed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]

#: The precision instants are stored and compared at; "just before" an occurrence is 1 ms less.
ONE_MS = timedelta(milliseconds=1)


def system_clock() -> datetime:
    """Aware UTC now, truncated to the millisecond the watermarks are stored at."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


_current: Clock = system_clock


def now() -> datetime:
    """Now, from the installed clock."""
    return _current()


@contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Install ``clock`` for the duration of a ``with`` block."""
    global _current
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous


class FrozenClock:
    """A clock that only moves when told to; thread-safe so a scheduler thread can read it."""

    def __init__(self, at: datetime) -> None:
        if at.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self._at = at.astimezone(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._at

    def set(self, at: datetime) -> None:
        with self._lock:
            self._at = at.astimezone(UTC)

    def advance(self, delta: timedelta | float) -> datetime:
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        with self._lock:
            self._at += step
            return self._at
