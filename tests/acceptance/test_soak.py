"""Long multi-node runs, for ``make soak`` only: random kills and drains for minutes.

``ULTIMAT3_SOAK_SECONDS`` sets the length (default 300).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from .helpers import Process, processes, stop_all
from .test_scheduler_processes import (
    assert_every_occurrence_exactly_once,
    current_leader,
    start_schedulers,
)

__all__ = ["processes"]

pytestmark = [
    pytest.mark.soak,
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]


@pytest.mark.parametrize("leader", ["advisory", "lease"])
def test_soak__schedulers_killed_and_drained_at_random__every_occurrence_once(
    tmp_path: Path, processes: list[Process], leader: str
) -> None:
    seconds = float(os.environ.get("ULTIMAT3_SOAK_SECONDS", "300"))
    rng = random.Random(seconds)

    def add() -> None:
        start_schedulers(tmp_path, processes, leader, 1)

    for _ in range(3):
        add()
    deadline = time.monotonic() + seconds
    actions = 0
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1, 6))
        # Only processes past start-up: before it, SIGTERM kills rather than drains.
        live = [p for p in processes if p.alive() and p.named("jobs.scheduler.started")]
        if not live:
            continue
        victim = current_leader(live) if rng.random() < 0.7 else rng.choice(live)
        if victim is None:
            continue
        how = rng.choice([signal.SIGKILL, signal.SIGTERM])
        victim.signal(how)
        if how == signal.SIGTERM:
            assert victim.wait(30) == 0
        else:
            victim.wait(10)
        add()
        actions += 1
    time.sleep(5)
    stop_all(processes)
    seen = assert_every_occurrence_exactly_once()
    assert actions > 0
    assert len(seen) >= seconds * 0.9
