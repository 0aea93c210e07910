"""Health across real processes: ``jobs_status --check`` exits 0 while a scheduler and a worker
run and 1 within three ticks of the scheduler being SIGKILLed; ``--metrics-port`` answers
``/healthz`` and ``/readyz`` for the roles of its process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from .helpers import ROOT, Process, process_database_url, processes, spawn, wait_for
from .test_run_jobs import free_port

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

TICK = 1.0
SETTINGS = {"TICK_INTERVAL": TICK, "HEARTBEAT_INTERVAL": TICK, "WORKER_POLL_INTERVAL": 0.2}


def check() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "jobs_status", "--check"],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": process_database_url(),
            "ULTIMAT3_JOBS": json.dumps(SETTINGS),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def role(tmp_path: Path, name: str, port: int) -> Process:
    return spawn(
        tmp_path,
        name,
        f"run_{name}",
        "--metrics-port",
        str(port),
        "--metrics-addr",
        "127.0.0.1",
        settings_overrides=SETTINGS,
    )


def test_jobs_status_check__fails_within_three_ticks_of_the_scheduler_being_killed(
    tmp_path: Path, processes: list[Process]
) -> None:
    scheduler_port, worker_port = free_port(), free_port()
    scheduler = role(tmp_path, "scheduler", scheduler_port)
    worker = role(tmp_path, "worker", worker_port)
    processes.extend([scheduler, worker])

    wait_for(lambda: check().returncode == 0, 60, "jobs_status --check to pass")
    result = check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "scheduler: ok: leader" in result.stdout and "worker: ok" in result.stdout

    for port, name in ((scheduler_port, "scheduler"), (worker_port, "worker")):
        for path in ("/healthz", "/readyz"):
            # A probe may catch a beat late on a loaded machine: it answers 200 again at once.
            wait_for(lambda: probe(port, path)[0] == 200, 15, f"{name}'s {path}")  # noqa: B023
            status, body = probe(port, path)
            assert status == 200, body
            assert [(r["role"], r["live"], r["ready"]) for r in body["roles"]] == [
                (name, True, True)
            ]

    scheduler.signal(signal.SIGKILL)
    scheduler.wait(10)
    if connection.vendor == "postgresql":
        # The advisory lock died with the leader's connection: seen by the very next check.
        immediate = check()
        assert immediate.returncode == 1, immediate.stdout
    time.sleep(3 * TICK)
    result = check()
    assert result.returncode == 1, result.stdout
    assert "scheduler: FAILED" in result.stdout
    assert "worker: ok" in result.stdout
    assert "not healthy: scheduler" in result.stderr


def test_metrics_port__reports_the_job_table_unless_metrics_job_table_is_false(
    tmp_path: Path, processes: list[Process]
) -> None:
    reporting, quiet = free_port(), free_port()
    processes.append(role(tmp_path, "worker", reporting))
    processes.append(
        spawn(
            tmp_path,
            "quiet-worker",
            "run_worker",
            "--metrics-port",
            str(quiet),
            "--metrics-addr",
            "127.0.0.1",
            settings_overrides={**SETTINGS, "METRICS_JOB_TABLE": False},
        )
    )

    def exposition(port: int) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return str(answer.read().decode())
        except urllib.error.URLError:
            return ""  # Not listening yet.

    for port in (reporting, quiet):
        wait_for(lambda: exposition(port) != "", 60, "the worker's metrics port")  # noqa: B023

    table = "# TYPE ultimat3_jobs_jobs gauge"
    own = "# TYPE ultimat3_jobs_worker_jobs_processed_total counter"
    assert table in exposition(reporting) and own in exposition(reporting)
    assert table not in exposition(quiet) and own in exposition(quiet)
