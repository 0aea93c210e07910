"""When the worker's dispatcher claims a batch ahead of its threads (``worker.claims_ahead``)."""

from __future__ import annotations

import pytest

from ultimat3_jobs.worker import claims_ahead

# Four threads, a batch of 100 ahead, claimed again once 50 or fewer wait.
FOUR = {"concurrency": 4, "low_water": 50}


@pytest.mark.parametrize(
    ("waiting", "running", "expected"),
    [
        # Every thread busy and work still waiting below the low water: the threads are
        # working through it, so the next batch comes before they run dry.
        (10, 14, True),
        (50, 54, True),
        # A thread idle, nothing waiting.
        (0, 3, True),
        (0, 0, True),
        # Enough waits already.
        (51, 55, False),
        # Nothing waits and every thread is busy: those jobs may be long, a batch would wait.
        (0, 4, False),
    ],
)
def test_claims_ahead__while_threads_work_through_what_waits_not_behind_busy_ones(
    waiting: int, running: int, expected: bool
) -> None:
    assert claims_ahead(waiting=waiting, running=running, **FOUR) is expected
