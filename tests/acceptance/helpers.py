"""Real processes against the test database: spawn, signal, read their JSON logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import close_old_connections

ROOT = Path(__file__).resolve().parents[2]


def process_database_url() -> str:
    """The URL of the database pytest-django created, for the processes a test starts."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


@dataclass
class Process:
    """A ``manage.py`` process whose stderr (the JSON log) goes to a file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: Any = field(repr=False, default=None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def events(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text(errors="replace").splitlines()
        parsed = []
        for line in lines:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "event" in value:
                parsed.append(value)
        return parsed

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == event]

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def alive(self) -> bool:
        return self.popen.poll() is None


def spawn(
    tmp_path: Path,
    name: str,
    *argv: str,
    settings_overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Process:
    log_path = tmp_path / f"{name}.log"
    log = log_path.open("wb")
    full_env = {
        **os.environ,
        "DATABASE_URL": process_database_url(),
        "ULTIMAT3_ACCEPTANCE": "1",
        "ULTIMAT3_JOBS": json.dumps(settings_overrides or {}),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    popen = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *argv, "--log-format", "json"],
        cwd=ROOT,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return Process(name, popen, log_path, log)


@dataclass
class CeleryWorker:
    """A ``celery worker`` process in a session of its own, so a signal reaches its pool too."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def ready(self) -> bool:
        return " ready." in self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, signum)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(10)


def spawn_celery(
    tmp_path: Path, name: str, *, hostname: str, concurrency: int, env: dict[str, str]
) -> CeleryWorker:
    """A prefork ``celery worker`` of the test project, its output in ``<name>.log``."""
    log_path = tmp_path / f"{name}.log"
    full_env = {
        **os.environ,
        "DATABASE_URL": process_database_url(),
        "ULTIMAT3_ACCEPTANCE": "1",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "testproject", "worker",
        "--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--hostname", f"{hostname}@%h",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return CeleryWorker(name, popen, log_path)


def throwaway_cluster() -> tuple[str, str] | None:
    """The data directory and server options of the suite's throwaway PostgreSQL cluster, as
    ``scripts/throwaway_postgres.py`` exports them; None against another server."""
    data, options = (
        os.environ.get("ULTIMAT3_TEST_PGDATA"),
        os.environ.get("ULTIMAT3_TEST_PGOPTIONS"),
    )
    return (data, options) if data and options else None


def restart_throwaway_postgres(down_for: float = 0.0) -> bool:
    """Restart the suite's throwaway cluster (``pg_ctl restart -m fast``), or stop it and
    start it again ``down_for`` seconds later; False, doing nothing, when the tests run
    against another server."""
    cluster = throwaway_cluster()
    if cluster is None:
        return False
    data, options = cluster
    from django.db import connection

    connection.close()
    runner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    pg_ctl = [*runner, "pg_ctl", "-D", data, "-o", options, "-m", "fast", "-w"]
    if not down_for:
        subprocess.run([*pg_ctl, "restart"], check=True, stdout=subprocess.DEVNULL)
        return True
    subprocess.run([*pg_ctl, "stop"], check=True, stdout=subprocess.DEVNULL)
    time.sleep(down_for)
    subprocess.run([*pg_ctl, "start"], check=True, stdout=subprocess.DEVNULL)
    return True


def wait_for(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        close_old_connections()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def stop_all(processes: list[Process], timeout: float = 15) -> None:
    # A process still importing Django has no signal handler yet: SIGTERM would kill it
    # outright (-15) rather than drain it. Let each get as far as its "started" event.
    deadline = time.monotonic() + timeout
    for process in processes:
        while (
            process.alive()
            and time.monotonic() < deadline
            and not any(e["event"].endswith(".started") for e in process.events())
        ):
            time.sleep(0.05)
    for process in processes:
        process.signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.signal(signal.SIGKILL)
            process.wait(5)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes a test started; every one is stopped at the end, whatever happened."""
    started: list[Process] = []
    yield started
    stop_all(started)
    for process in started:
        if process._log is not None:
            process._log.close()


def waiting_on(locker: int) -> list[str]:
    """The statements of other sessions waiting on a lock session ``locker`` holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [locker]
        )
        return [query for (query,) in cursor.fetchall()]
