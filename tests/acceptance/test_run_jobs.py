"""``run_jobs``: the scheduler and a worker in one real process, drained by one signal."""

from __future__ import annotations

import signal
import socket
import urllib.request
from pathlib import Path

import pytest

from testproject.demo.tasks import slow_ping
from ultimat3_jobs.models import Job, JobStatus

from .helpers import Process, processes, spawn, wait_for

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = {"WORKER_POLL_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 0.5}
TASK = "acceptance.every_second"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(tmp_path: Path, procs: list[Process], *argv: str) -> Process:
    process = spawn(tmp_path, "run-jobs", "run_jobs", *argv, settings_overrides=FAST)
    procs.append(process)
    wait_for(lambda: process.named("jobs.worker.started"), 30, "run_jobs to start its worker")
    return process


def test_run_jobs__dispatches_and_runs_then_one_sigterm_drains_both(
    tmp_path: Path, processes: list[Process]
) -> None:
    port = free_port()
    process = start(tmp_path, processes, "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    succeeded = wait_for(
        lambda: list(
            Job.objects.filter(task=TASK, status=JobStatus.SUCCEEDED).values_list("worker")
        ),
        30,
        "a job of the per-second task to succeed",
    )
    worker_node = process.named("jobs.worker.started")[0]["node"]
    assert {node for (node,) in succeeded} == {worker_node}  # this process's own worker ran it

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    assert f'ultimat3_jobs_scheduler_occurrences_dispatched_total{{task="{TASK}"}}' in body
    assert 'ultimat3_jobs_worker_jobs_processed_total{name="acceptance.mark"' in body
    assert 'ultimat3_jobs_scheduler_leader{node="' in body

    process.signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert len(process.named("jobs.scheduler.draining")) == 1
    assert len(process.named("jobs.worker.draining")) == 1
    assert process.named("jobs.scheduler.stopped")[0]["reason"] == "SIGTERM"
    stopped = process.named("jobs.worker.stopped")[0]
    assert (stopped["reason"], stopped["exit_code"]) == ("SIGTERM", 0)
    assert len(process.named("jobs.scheduler.leadership-acquired")) == 1


def test_run_jobs__second_signal_exits_at_once_mid_drain(
    tmp_path: Path, processes: list[Process]
) -> None:
    process = start(tmp_path, processes)
    job_id = slow_ping.enqueue({"label": "long", "seconds": 120}).job_id
    wait_for(
        lambda: Job.objects.filter(pk=job_id, status=JobStatus.RUNNING).exists(),
        30,
        "the slow job to be running",
    )
    process.signal(signal.SIGTERM)
    wait_for(lambda: process.named("jobs.worker.draining"), 15, "the drain to begin")
    assert process.alive()  # draining: the slow job is still in flight
    process.signal(signal.SIGTERM)
    assert process.wait(15) == 1
    assert process.named("jobs.worker.stopped") == []
