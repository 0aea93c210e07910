"""Django Tasks scheduled by real ``run_scheduler`` processes and run by a real ``run_worker``.

Three schedulers dispatch a per-second task whose entry is a Django Task on ``JobsBackend``;
the leader is killed twice. Every occurrence must be enqueued exactly once, and each one's
result, read through the framework's API, must be its own occurrence.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from django.db import close_old_connections
from django_tasks import TaskResultStatus

from testproject.demo.background import stamp
from ultimat3_jobs.models import Job

from .helpers import Process, processes, spawn, stop_all, wait_for
from .test_scheduler_processes import (
    DJANGO_TASK,
    assert_every_occurrence_exactly_once,
    current_leader,
    occurrences,
    start_schedulers,
)

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]


def test_schedulers_and_a_worker__leader_killed__each_django_task_occurrence_runs_once(
    tmp_path: Path, processes: list[Process]
) -> None:
    start_schedulers(tmp_path, processes, "advisory", 3)
    worker = spawn(tmp_path, "worker", "run_worker", "--concurrency", "2")
    processes.append(worker)  # Stopped by the fixture too, whatever happens.
    wait_for(lambda: len(occurrences(DJANGO_TASK)) >= 2, 30, "the first dispatches")
    for _ in range(2):
        victim = wait_for(lambda: current_leader(processes), 15, "a leader")
        killed_at = time.time()
        victim.signal(signal.SIGKILL)
        victim.wait(5)
        start_schedulers(tmp_path, processes, "advisory", 1)
        wait_for(
            lambda: occurrences(DJANGO_TASK)[-1].timestamp() >= killed_at + 2,  # noqa: B023
            20,
            "dispatching to resume after a kill",
        )
    stop_all([p for p in processes if p is not worker])
    seen = assert_every_occurrence_exactly_once(DJANGO_TASK)
    assert len(seen) >= 6

    def all_finished() -> bool:
        close_old_connections()
        return not Job.objects.filter(task=DJANGO_TASK, status__in=["queued", "running"]).exists()

    wait_for(all_finished, 30, "the worker to run every occurrence")
    stop_all([worker])
    assert worker.popen.returncode == 0
    rows = Job.objects.filter(task=DJANGO_TASK).values_list("pk", "occurrence")
    for pk, occurrence in rows:
        assert occurrence is not None
        result = stamp.get_result(str(pk))
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == occurrence.isoformat()
        assert result.attempts == 1
