"""The lease leader on whatever database the suite runs on: SQLite (the embedded default) too."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from .helpers import Process, processes, stop_all, wait_for
from .test_scheduler_processes import (
    assert_every_occurrence_exactly_once,
    current_leader,
    occurrences,
    progress_after,
    start_schedulers,
)

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_lease__two_schedulers_leader_killed__every_occurrence_once(
    tmp_path: Path, processes: list[Process]
) -> None:
    start_schedulers(tmp_path, processes, "lease", 2)
    wait_for(lambda: len(occurrences()) >= 2, 30, "the first dispatches")
    victim = wait_for(lambda: current_leader(processes), 15, "a leader")
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(5)
    wait_for(progress_after(killed_at), 20, "the other node to take over")
    stop_all(processes)
    survivors = [p for p in processes if p is not victim]
    assert all(p.popen.returncode == 0 for p in survivors)
    assert_every_occurrence_exactly_once()
