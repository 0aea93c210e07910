"""``manage.py run_demo`` (what ``make run`` runs): the whole product on this machine.

Migrates, creates the demo login when the database has no user, then runs the admin's web
server and ``run_jobs`` (the scheduler and a worker) as child processes and prints where to
log in. The first Ctrl-C/SIGTERM stops both: each child gets exactly one signal (they run in
a process group of their own, so the terminal's Ctrl-C reaches this launcher only), and
whatever is still running after ``--stop-timeout`` is killed. Test project only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from ultimat3_jobs.management.arguments import positive_seconds
from ultimat3_jobs.management.preflight import database_error

MANAGE = Path(__file__).resolve().parents[4] / "manage.py"
DEMO_USER = "admin"
DEMO_PASSWORD = "admin"
#: Seconds the web server gets to answer before the launcher gives up on it.
START_TIMEOUT = 60.0
#: Seconds of ``--stop-timeout`` left once run_jobs' drain grace is over: its exit.
DRAIN_MARGIN = 3.0


def ensure_demo_user() -> tuple[str, str] | None:
    """Create ``admin``/``admin`` when the database has no user; the login to print, if known."""
    users = get_user_model().objects
    if not users.exists():
        users.create_superuser(DEMO_USER, "", DEMO_PASSWORD)
        return DEMO_USER, DEMO_PASSWORD
    if users.filter(username=DEMO_USER).exists():
        return DEMO_USER, DEMO_PASSWORD
    return None


def _drain_grace(stop_timeout: float) -> float:
    """run_jobs' drain grace: its setting, cut to end before the launcher kills it (a margin
    off the stop timeout, or half of a short one)."""
    from ultimat3_jobs.conf import get_settings

    setting = get_settings().worker_drain_grace.total_seconds()
    return round(min(setting, max(stop_timeout - DRAIN_MARGIN, stop_timeout / 2)), 3)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Command(BaseCommand):
    help = (
        "Run the demo: migrate, create the admin/admin login if there is no user, then the "
        "admin's web server and run_jobs together. Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("ULTIMAT3_DEMO_PORT", "8000")),
            help="Port of the web server (default: $ULTIMAT3_DEMO_PORT, else 8000).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="Port of run_jobs' own metrics (default: $ULTIMAT3_DEMO_METRICS_PORT, else "
            "the web server's port + 1).",
        )
        parser.add_argument(
            "--stop-timeout",
            type=positive_seconds,
            default=20.0,
            help="Seconds the children get to drain on Ctrl-C before they are killed.",
        )

    def handle(
        self,
        *,
        host: str,
        port: int,
        metrics_port: int | None,
        stop_timeout: float,
        **options: Any,
    ) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Repeats (the terminal and make both signal) mean the same thing: stop once.
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)
        if metrics_port is None:
            metrics_port = int(os.environ.get("ULTIMAT3_DEMO_METRICS_PORT", str(port + 1)))
        for what, variable, number in (
            ("web server", "ULTIMAT3_DEMO_PORT", port),
            ("metrics", "ULTIMAT3_DEMO_METRICS_PORT", metrics_port),
        ):
            if not _port_free(host, number):
                raise CommandError(
                    f"port {number} on {host} (the {what}) is in use\n"
                    f"fix: stop what listens there, or pick another port: "
                    f"{variable}={number + 2} make run"
                )
        database = settings.DATABASES["default"]
        self.stdout.write(f"Migrating {database['NAME']} ({database['ENGINE'].rsplit('.', 1)[-1]})")
        try:
            call_command("migrate", interactive=False, verbosity=0)
        except DatabaseError as error:
            raise database_error(DEFAULT_DB_ALIAS, error) from error
        login = ensure_demo_user()
        children = self._spawn(host, port, metrics_port, stop_timeout)
        try:
            code = self._supervise(children, host, port, metrics_port, login, stop)
        finally:
            clean = self._stop(children, stop_timeout)
        if code or not clean:
            raise CommandError("the demo did not stop cleanly (see the messages above)")
        self.stdout.write("Stopped: the web server and run_jobs have exited.")

    def _spawn(
        self, host: str, port: int, metrics_port: int, stop_timeout: float
    ) -> dict[str, subprocess.Popen[bytes]]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        base = [sys.executable, str(MANAGE)]
        # A process group of their own: the terminal's Ctrl-C reaches this launcher only, and
        # each child gets exactly one signal from it (a second would cut run_jobs' drain short).
        commands = {
            "web server": [*base, "runserver", "--noreload", f"{host}:{port}"],
            "run_jobs": [
                *base,
                "run_jobs",
                "--metrics-port",
                str(metrics_port),
                "--metrics-addr",
                host,
                # Its own drain ends before it would be killed: what is still running then
                # goes back to the queue, not left running for a worker that is gone.
                "--drain-grace",
                str(_drain_grace(stop_timeout)),
            ],
        }
        children = {
            name: subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, process_group=0)
            for name, argv in commands.items()
        }
        pids = ", ".join(f"{name} pid {child.pid}" for name, child in children.items())
        self.stdout.write(f"Started {pids}", ending="\n")
        self.stdout.flush()
        return children

    def _supervise(
        self,
        children: dict[str, subprocess.Popen[bytes]],
        host: str,
        port: int,
        metrics_port: int,
        login: tuple[str, str] | None,
        stop: threading.Event,
    ) -> int:
        """Print the banner once the admin answers; return when told to stop or a child dies."""
        base_url = f"http://{host}:{port}"
        login_url = f"{base_url}/admin/login/"
        deadline = time.monotonic() + START_TIMEOUT
        announced = False
        while not stop.is_set():
            for name, child in children.items():
                if child.poll() is not None:
                    self.stderr.write(f"The {name} exited ({child.returncode}); stopping the demo.")
                    return 1
            if not announced:
                if _answers(login_url):
                    self._banner(base_url, f"http://{host}:{metrics_port}/metrics", login)
                    announced = True
                elif time.monotonic() > deadline:
                    self.stderr.write(f"{login_url} did not answer within {START_TIMEOUT:g} s.")
                    return 1
            stop.wait(0.25)
        self.stdout.write("Stopping: run_jobs drains (round in flight, jobs in flight)...")
        return 0

    def _banner(self, base_url: str, metrics_url: str, login: tuple[str, str] | None) -> None:
        who = (
            f"log in as {login[0]} / {login[1]}"
            if login is not None
            else "log in with one of this database's users (manage.py createsuperuser adds one)"
        )
        lines = [
            "",
            f"  The admin:   {base_url}/admin/   ({who})",
            f"  Tasks:       {base_url}/admin/ultimat3_jobs/task/",
            f"  Metrics:     {base_url}/metrics (the job table), "
            f"{metrics_url} (the scheduler's and the worker's own)",
            "  demo.every_ten_seconds fires every 10 s; its jobs show under Jobs and Demo > Beats.",
            "  Ctrl-C stops everything.",
            "",
        ]
        self.stdout.write("\n".join(lines))
        self.stdout.flush()

    def _stop(self, children: dict[str, subprocess.Popen[bytes]], timeout: float) -> bool:
        """One signal each, a bounded wait, then SIGKILL. True if all exited by themselves."""
        # runserver ends cleanly (status 0) on SIGINT; run_jobs drains on SIGTERM.
        signals = {"web server": signal.SIGINT, "run_jobs": signal.SIGTERM}
        for name, child in children.items():
            if child.poll() is None:
                child.send_signal(signals[name])
        deadline = time.monotonic() + timeout
        clean = True
        for name, child in children.items():
            try:
                code = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"The {name} did not stop within {timeout:g} s: killing it.")
                child.kill()
                child.wait()
                clean = False
                continue
            if code != 0:
                self.stderr.write(f"The {name} exited with status {code}.")
                clean = False
        return clean
