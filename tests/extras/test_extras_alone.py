"""The app with no extra, only ``celery``, only ``tasks``, only ``otel``, or every one: it
imports, passes ``manage.py check`` and runs each role, the way a project that installed just
that would.

``make test`` runs this file in one virtualenv per single extra and with none (``make
extras``: ``.venv-extra-none``, ``-celery``, ``-tasks``, ``-otel``) and, with every extra
(``sentry`` and ``health`` too), in ``.venv`` with the rest of the suite. ``ULTIMAT3_EXTRAS``
names the extras a leg was built with, so a leg that holds more than it should fails here
rather than passing for the wrong reason.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

import ultimat3_jobs
from testproject.demo.models import Ping
from ultimat3_jobs import tasks_compat
from ultimat3_jobs.models import Job, JobStatus

from ..acceptance.helpers import ROOT, Process, process_database_url, processes, spawn, wait_for
from ..redis_server import RedisServer

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

CELERY = find_spec("celery") is not None
OTEL = find_spec("opentelemetry") is not None
DJANGO_TASKS = tasks_compat.AVAILABLE
SENTRY = find_spec("sentry_sdk") is not None
HEALTH = find_spec("health_check") is not None
#: The modules that are their extra's own, and whether it is installed: only these may refuse
#: to import, and only without it. (``checkins`` imports without ``sentry``: it sends nothing.)
EXTRA_MODULES = {
    "ultimat3_jobs.celery": CELERY,
    "ultimat3_jobs.backends": DJANGO_TASKS,
    "ultimat3_jobs.health_checks": HEALTH,
}
FAST = {"TICK_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 1, "WORKER_POLL_INTERVAL": 0.2}


def installed_extras() -> set[str]:
    found = (
        ("celery", CELERY),
        ("otel", OTEL),
        ("tasks", DJANGO_TASKS),
        ("sentry", SENTRY),
        ("health", HEALTH),
    )
    return {name for name, present in found if present}


def role_env() -> dict[str, str]:
    """The per-second tasks of the test project whose engines are installed."""
    return {"ULTIMAT3_ACCEPTANCE_RELAY": "1", "ULTIMAT3_ACCEPTANCE_IMMEDIATE": "1"}


def manage(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *argv],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": process_database_url(),
            "ULTIMAT3_ACCEPTANCE": "1",
            **role_env(),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_to_end(process: Process, timeout: float = 60) -> int:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.signal(signal.SIGKILL)
        pytest.fail(
            f"{process.name} did not end within {timeout}s:\n{process.log_path.read_text()}"
        )


def assert_clean(process: Process) -> None:
    """No traceback, no error, nothing the app does not know how to fix, in the log."""
    text = process.log_path.read_text(errors="replace")
    assert "Traceback" not in text, text
    bad = [
        e
        for e in process.events()
        if e.get("level") in ("error", "critical") or e.get("code") == "jobs.unexpected-error"
    ]
    assert not bad, bad


def test_extras__the_environment_holds_the_extras_it_is_named_for() -> None:
    # Outside a leg of the matrix this is `.venv`, built with the `dev` extra: every one.
    named = os.environ.get("ULTIMAT3_EXTRAS", "celery,otel,tasks,sentry,health")
    expected = {name for name in named.split(",") if name and name != "none"}
    assert installed_extras() == expected


def test_extras__every_module_imports_but_an_absent_extras_own() -> None:
    for module in pkgutil.walk_packages(ultimat3_jobs.__path__, "ultimat3_jobs."):
        try:
            importlib.import_module(module.name)
        except ImportError:
            if EXTRA_MODULES.get(module.name, True):
                raise


def test_extras__manage_py_check_passes() -> None:
    result = manage("check", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def fire_due_occurrences(tmp_path: Path, processes: list[Process], env: dict[str, str]) -> None:
    """Two ``run_scheduler --once``: the first arms every task at now; the second, a second and
    a half later, fires the per-second occurrences that came due in between."""
    for name in ("scheduler-arms", "scheduler-fires"):
        scheduler = spawn(
            tmp_path, name, "run_scheduler", "--once", settings_overrides=FAST, env=env
        )
        processes.append(scheduler)
        assert run_to_end(scheduler) == 0, scheduler.log_path.read_text()
        assert_clean(scheduler)
        if name == "scheduler-arms":
            time.sleep(1.5)


def test_extras__the_scheduler_and_the_worker_run_what_is_declared(
    tmp_path: Path, processes: list[Process]
) -> None:
    fire_due_occurrences(tmp_path, processes, role_env())
    worker = spawn(tmp_path, "worker", "run_worker", "--burst", settings_overrides=FAST)
    processes.append(worker)
    assert run_to_end(worker) == 0, worker.log_path.read_text()
    assert_clean(worker)

    ran = set(Job.objects.filter(status=JobStatus.SUCCEEDED).values_list("name", flat=True))
    assert "acceptance.mark" in ran
    if DJANGO_TASKS:
        assert any(name.endswith(".stamp") for name in ran), ran
    left = Job.objects.exclude(status__in=(JobStatus.SUCCEEDED, JobStatus.OUTBOX))
    assert not left.exists(), list(left.values("name", "status"))
    # No leg sets a tracer provider: with or without the API, no row keeps a trace context.
    assert set(Job.objects.values_list("trace_context", flat=True)) == {""}


def test_extras__the_relay_hands_entries_on_and_keeps_running(
    tmp_path: Path, processes: list[Process], request: pytest.FixtureRequest
) -> None:
    env = role_env()
    if CELERY:
        server: RedisServer = request.getfixturevalue("redis_server")
        env["CELERY_BROKER_URL"] = server.url
    fire_due_occurrences(tmp_path, processes, env)
    outbox = set(Job.objects.filter(status=JobStatus.OUTBOX).values_list("name", flat=True))
    assert ("demo.write_row" in outbox) == CELERY, outbox

    relay = spawn(
        tmp_path, "relay", "run_relay", "--poll-interval", "0.2", settings_overrides=FAST, env=env
    )
    processes.append(relay)

    def handed_on() -> bool:
        assert relay.alive(), relay.log_path.read_text()
        return not Job.objects.filter(status=JobStatus.OUTBOX).exists()

    wait_for(handed_on, 30, "the relay to hand every outbox row on")
    time.sleep(2)  # a few more passes: a relay that fails on every pass is gone by now
    assert relay.alive(), relay.log_path.read_text()
    relay.signal(signal.SIGTERM)
    assert run_to_end(relay) == 0, relay.log_path.read_text()
    assert_clean(relay)
    assert relay.named("jobs.relay.stopped")
    if CELERY:
        relayed = Job.objects.filter(name="demo.write_row")
        assert set(relayed.values_list("status", flat=True)) == {JobStatus.RELAYED}
    if DJANGO_TASKS:
        assert Ping.objects.filter(label__startswith="immediate ").exists()


@pytest.mark.skipif(DJANGO_TASKS, reason="a leg without the tasks extra")
def test_extras__a_django_task_row_waits_for_a_relay_that_has_the_tasks_extra() -> None:
    # A scheduler with both extras wrote it; this relay has Celery at most. The row steps out
    # of the way of the rows behind it, as one whose task is unknown here, and says what to do.
    from django.utils import timezone

    from ultimat3_jobs.relay import TARGET_RETRY, Relay

    now = timezone.now()
    row = Job.objects.create(
        name="testproject.demo.background.elsewhere",
        key="extras.tasks-row",
        status=JobStatus.OUTBOX,
        relay="tasks",
        backend="elsewhere",
        run_at=now,
        created_at=now,
    )
    assert Relay(listen=False).relay_once() == 0
    row.refresh_from_db()
    assert row.status == JobStatus.OUTBOX
    assert row.target_unknown_since is not None and row.run_at > now
    assert row.run_at - row.target_unknown_since <= TARGET_RETRY
    assert "Django Tasks is not installed here" in row.last_error
    assert "fix: install the tasks extra (pip install ultimat3-jobs[tasks])" in row.last_error
