"""``run_jobs``: the scheduler and a worker in one real process, drained by one signal."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from testproject.demo.tasks import slow_ping
from ultimat3_jobs.models import Job, JobStatus

from .helpers import ROOT, Process, process_database_url, processes, spawn, wait_for

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
    started = tmp_path / "started"
    slow_ping.enqueue({"label": "long", "seconds": 120, "started": str(started)})
    wait_for(started.exists, 30, "the slow job to be running")
    process.signal(signal.SIGTERM)
    wait_for(lambda: process.named("jobs.worker.draining"), 15, "the drain to begin")
    assert process.alive()  # draining: the slow job is still in flight
    process.signal(signal.SIGTERM)
    assert process.wait(15) == 1
    assert process.named("jobs.worker.stopped") == []


@pytest.mark.parametrize("command", ["run_jobs", "run_scheduler", "run_worker", "run_relay"])
def test_long_running_commands__a_metrics_port_in_use_is_refused_with_the_fix(
    command: str,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), command, "--metrics-port", str(port)],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": process_database_url()},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot serve metrics on 0.0.0.0:{port}" in result.stderr
    assert "fix: pass a free port to --metrics-port" in result.stderr


def test_run_jobs__a_port_number_out_of_range_is_refused_by_the_flag() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "run_jobs", "--metrics-port", "70000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "is not a port (1-65535)" in result.stderr
