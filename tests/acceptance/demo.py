"""``manage.py run_demo`` (what ``make run`` runs) as a newcomer starts it: a real process on
free ports with a SQLite file of its own, its output read the way a person reads it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .helpers import ROOT


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Demo:
    popen: subprocess.Popen[bytes]
    output_path: Path
    database: Path
    port: int
    metrics_port: int
    _log: Any

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def wait_for_output(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.popen.poll() is not None:
                pytest.fail(f"run_demo exited ({self.popen.returncode}):\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {pattern!r} in {timeout}s of output:\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def login(self, timeout: float = 60) -> tuple[str, str]:
        """The login the banner prints, once the admin answers."""
        found = self.wait_for_output(r"log in as (\S+) / (\S+)\)", timeout)
        return found.group(1), found.group(2)

    def child_pids(self) -> list[int]:
        found = self.wait_for_output(r"Started web server pid (\d+), run_jobs pid (\d+)", 30)
        return [int(found.group(1)), int(found.group(2))]

    def stop(self, signum: int = signal.SIGINT, timeout: float = 40) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
        try:
            return self.popen.wait(timeout)
        finally:
            self._log.close()


def start_demo(tmp_path: Path) -> Demo:
    database = tmp_path / "demo.sqlite3"
    port, metrics_port = free_port(), free_port()
    output_path = tmp_path / "run_demo.out"
    log = output_path.open("wb")
    # The environment of a fresh shell: none of the suite's settings or database.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ULTIMAT3_", "DATABASE_"))}
    env.update(
        DATABASE_URL=f"sqlite:///{database}",
        ULTIMAT3_DEMO_PORT=str(port),
        ULTIMAT3_DEMO_METRICS_PORT=str(metrics_port),
        PYTHONUNBUFFERED="1",
    )
    popen = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_demo"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return Demo(popen, output_path, database, port, metrics_port, log)


def pid_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
