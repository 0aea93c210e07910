"""Argument types for the commands: a bad value is refused by argparse with a clear message.

Every number has an upper bound too: ``inf`` or ``1e308`` seconds would overflow the
``timedelta`` built from it, far past any sensible setting.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ultimat3_jobs.conf import MAX_RETENTION_DAYS

#: The longest interval or grace a flag accepts: a day.
MAX_SECONDS = 86_400.0
#: The most job threads one worker runs; each holds a database connection of its own.
MAX_CONCURRENCY = 128
#: The longest retention ``prune_jobs --days`` accepts: the setting's own bound, a century.
MAX_DAYS = MAX_RETENTION_DAYS
#: The most jobs a worker claims ahead of its threads (``--prefetch``), and the most outbox rows
#: the relay locks and sends in one transaction (``--batch``): each is a claim's ``LIMIT``.
MAX_BATCH = 10_000
#: The most occurrences ``backfill_task --limit`` lets one backfill enqueue: each is planned in
#: memory and every job is written in one transaction.
MAX_BACKFILL = 100_000


def _whole(value: str, maximum: int | None, least: int = 1) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < least:
        raise argparse.ArgumentTypeError(f"{value!r} must be {least} or more")
    if maximum is not None and number > maximum:
        raise argparse.ArgumentTypeError(f"{value!r} must be at most {maximum}")
    return number


def positive_int(value: str) -> int:
    """A whole number, 1 or more: a count kept in the process alone, never sent to the
    database (whose integers end at 2**63 - 1)."""
    return _whole(value, None)


def up_to(maximum: int, *, least: int = 1) -> Callable[[str], int]:
    """A whole number from ``least`` (1 unless said) to ``maximum``."""

    def whole(value: str) -> int:
        return _whole(value, maximum, least)

    whole.__name__ = f"whole number up to {maximum}"
    return whole


def positive_seconds(value: str) -> float:
    """A finite number of seconds, more than 0 and at most ``MAX_SECONDS``."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number of seconds")
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be more than 0 seconds")
    if seconds > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r} must be at most {MAX_SECONDS:g} seconds (a day)"
        )
    return seconds


def queue_names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a comma-separated list of queue names, e.g. default,emails"
        )
    return names
