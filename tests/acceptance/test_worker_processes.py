"""``run_worker`` processes on one PostgreSQL: exactly-once runs, retries, kills and drains."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections, transaction
from django.db.models import Count

from testproject.demo.models import Ping
from testproject.demo.tasks import always_fail, ping, ping_frozen, slow_ping
from ultimat3_jobs.models import Job, JobStatus

from .helpers import Process, processes, spawn, wait_for

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

FAST = {
    "WORKER_POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 0.3,
    "WORKER_STALE_AFTER": 1.5,
    "RETRY_BACKOFF_MAX": 0.2,
}


def start_worker(
    tmp_path: Path, procs: list[Process], name: str, *argv: str, **overrides: Any
) -> Process:
    process = spawn(tmp_path, name, "run_worker", *argv, settings_overrides={**FAST, **overrides})
    procs.append(process)
    return process


def node_of(process: Process) -> str:
    """The node id a worker announced on start (and stamps on the jobs it claims)."""
    started = wait_for(lambda: process.named("jobs.worker.started"), 20, f"{process.name} to start")
    return str(started[0]["node"])


def job_row(job_id: int) -> Job:
    close_old_connections()
    return Job.objects.get(pk=job_id)


def test_two_workers__run_500_jobs_exactly_once(tmp_path: Path, processes: list[Process]) -> None:
    workers = [start_worker(tmp_path, processes, f"worker-{n}", "--concurrency", "4") for n in "ab"]
    nodes = {node_of(worker) for worker in workers}
    labels = [f"job-{n:03d}" for n in range(500)]
    with transaction.atomic():
        for label in labels:
            ping.enqueue({"label": label})
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 500,
        60,
        "all 500 jobs to succeed",
    )
    assert sorted(Ping.objects.values_list("label", flat=True)) == labels
    twice = Ping.objects.values("label").annotate(n=Count("id")).filter(n__gt=1)
    assert list(twice) == []
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert set(Job.objects.values_list("worker", flat=True)) == nodes, "one worker ran nothing"
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [worker.wait(15) for worker in workers] == [0, 0]


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_worker_run_from_the_command_line__keeps_what_setup_built_out_of_the_collector(
    tmp_path: Path, processes: list[Process], pool: str
) -> None:
    # Django, the app and every task live as long as the process: frozen, the collector no
    # longer walks them, in a long run's full collections nor in those the interpreter runs at
    # exit. The process pool's child sets Django up itself, and freezes as its worker does.
    ping_frozen.enqueue({"label": "frozen"})
    worker = start_worker(tmp_path, processes, "worker", "--burst", "--pool", pool)
    assert worker.wait(60) == 0, worker.log_path.read_text()
    (row,) = Ping.objects.filter(label__startswith="frozen ")
    assert int(row.label.split()[1]) > 10_000


def test_failing_job__is_retried_then_ends_failed_with_its_error(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(tmp_path, processes, "worker")
    node_of(worker)
    made = always_fail.enqueue({"label": "boom"})
    wait_for(lambda: job_row(made.job_id).status == JobStatus.FAILED, 20, "the job to end failed")
    row = job_row(made.job_id)
    assert (row.attempts, row.max_attempts) == (3, 3)
    assert "RuntimeError: demo failure: boom" in row.last_error
    assert row.finished_at is not None
    assert len(worker.named("jobs.worker.job-retrying")) == 2
    (failed,) = worker.named("jobs.worker.job-failed")
    assert failed["error"] == "RuntimeError: demo failure: boom"


def test_sigkill_mid_job__the_other_worker_recovers_and_finishes_it(
    tmp_path: Path, processes: list[Process]
) -> None:
    workers = [start_worker(tmp_path, processes, f"worker-{n}") for n in "ab"]
    nodes = {node_of(worker): worker for worker in workers}
    made = slow_ping.enqueue({"label": "survivor", "seconds": 1.5})
    running = wait_for(
        lambda: (row := job_row(made.job_id)).status == JobStatus.RUNNING and row,
        10,
        "the job to start",
    )
    victim = nodes.pop(running.worker)
    victim.signal(signal.SIGKILL)
    assert victim.wait(5) == -signal.SIGKILL
    ((survivor_node, survivor),) = nodes.items()
    wait_for(lambda: job_row(made.job_id).status == JobStatus.SUCCEEDED, 20, "the job to finish")
    row = job_row(made.job_id)
    assert (row.worker, row.attempts) == (survivor_node, 2)
    assert list(Ping.objects.values_list("label", flat=True)) == ["survivor"]
    assert survivor.named("jobs.worker.recovered")


def test_sigterm__drains_the_job_in_flight_and_exits_0(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(tmp_path, processes, "worker", WORKER_DRAIN_GRACE=20)
    node_of(worker)
    started = tmp_path / "started"
    made = slow_ping.enqueue({"label": "drained", "seconds": 1.0, "started": str(started)})
    wait_for(started.exists, 10, "the job to start")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: worker.named("jobs.worker.draining"), 5, "the drain to begin")
    late = ping.enqueue({"label": "after the signal"})
    assert worker.wait(15) == 0
    assert job_row(made.job_id).status == JobStatus.SUCCEEDED
    assert job_row(late.job_id).status == JobStatus.QUEUED
    assert list(Ping.objects.values_list("label", flat=True)) == ["drained"]
    (stopped,) = worker.named("jobs.worker.stopped")
    assert (stopped["exit_code"], stopped["succeeded"]) == (0, 1)


def test_second_sigterm__exits_at_once(tmp_path: Path, processes: list[Process]) -> None:
    worker = start_worker(tmp_path, processes, "worker", WORKER_DRAIN_GRACE=60)
    node_of(worker)
    started = tmp_path / "started"
    slow_ping.enqueue({"label": "never", "seconds": 30, "started": str(started)})
    wait_for(started.exists, 10, "the job to start")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: worker.named("jobs.worker.draining"), 5, "the drain to begin")
    worker.signal(signal.SIGTERM)
    assert worker.wait(3) == 1


def test_scheduler_and_worker__a_per_second_jobs_side_effect_shows_within_two_seconds(
    tmp_path: Path, processes: list[Process]
) -> None:
    env = {"ULTIMAT3_DEMO_PER_SECOND": "1"}
    processes.append(
        spawn(tmp_path, "scheduler", "run_scheduler", "--tick-interval", "0.1", env=env)
    )
    processes.append(spawn(tmp_path, "worker", "run_worker", "--concurrency", "2", env=env))

    def seen() -> list[tuple[str, datetime]]:
        return list(
            Ping.objects.filter(label__startswith="every-second ").values_list(
                "label", "created_at"
            )
        )

    pings = wait_for(lambda: len(seen()) >= 3 and seen(), 30, "three per-second pings")
    for label, created_at in pings:
        occurrence = datetime.fromisoformat(label.removeprefix("every-second "))
        assert timedelta(0) <= created_at - occurrence < timedelta(seconds=2), label
