"""Retry timing, pure: how long a failed job waits, and how long a failing loop backs off.

Nothing here reads a clock or the database, so both policies are tested as plain functions.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from datetime import timedelta

from .errors import class_path

#: ``last_error`` keeps the end of a traceback this long: the raise site is at the end.
ERROR_LIMIT = 20_000
#: Longest wait between two passes of a loop (scheduler rounds, worker claims) that keep failing.
MAX_LOOP_BACKOFF = timedelta(seconds=30)


def retry_delay(
    attempts: int,
    *,
    base: float,
    cap: timedelta,
    rand: Callable[[], float] = random.random,
) -> timedelta:
    """How long a job waits after failing attempt ``attempts``: ``base ** attempts`` capped,
    with full jitter (uniform from zero), so the failures of one outage do not retry in step.
    """
    try:
        ceiling = min(cap.total_seconds(), base ** max(attempts, 0))
    except OverflowError:
        ceiling = cap.total_seconds()
    return timedelta(seconds=ceiling * rand())


def loop_backoff(interval: timedelta, failures: int) -> timedelta:
    """The wait after ``failures`` failed passes in a row: doubling from ``interval``, capped.

    The cap is ``MAX_LOOP_BACKOFF``, or ``interval`` itself when that is longer, so a slow loop
    never polls faster because its database is down.
    """
    return min(interval * 2 ** min(max(failures, 0), 5), max(MAX_LOOP_BACKOFF, interval))


def format_error(error: BaseException) -> str:
    """The traceback as stored in ``last_error``: the end kept, storable whatever it holds.

    Never raises: a failure that cannot be recorded would leave its job running until it is
    recovered and finally failed as its worker having died in each attempt.
    """
    try:
        text = "".join(traceback.format_exception(error))
    except Exception:
        text = f"{class_path(type(error))} (its traceback could not be formatted)"
    return bounded(storable(text))


def bounded(traceback_text: str) -> str:
    """A traceback cut to its last ``ERROR_LIMIT`` characters, where the raise site is: an
    exception carrying megabytes of text must not make each row or log line as big."""
    if len(traceback_text) <= ERROR_LIMIT:
        return traceback_text
    return "...\n" + traceback_text[-ERROR_LIMIT:]


def storable(text: str) -> str:
    """``text`` as PostgreSQL stores it: NUL and unpaired surrogates written as escapes."""
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
