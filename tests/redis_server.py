"""A throwaway Redis (Debian's ``redis-server``) on a free loopback port, for the Celery tests.

Started by the ``redis_server`` session fixture like the throwaway PostgreSQL: never a system
service. It keeps an append-only file, so a stop and a start (a broker outage) lose nothing.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def free_port() -> int:
    """A loopback port no one listens on now, for a server a test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process; ``stop()`` and ``start()`` again keep its data and port."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server not found: install it (as root: apt-get install -y redis-server); "
                "`make test` does so first (scripts/test_tools.sh)",
                pytrace=False,
            )
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ultimat3-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--protected-mode", "no",
            "--daemonize", "no",
        ]  # fmt: skip
        with (self.dir / "server.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.ping():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start; see {self.dir / 'server.log'}")
            time.sleep(0.05)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def point_celery_at(url: str) -> None:
    """The project's Celery app publishes to ``url`` from now on."""
    from testproject.celery import app

    if app.conf.broker_url == url:
        return  # Its pool reconnects by itself to a broker that came back.
    app.conf.broker_url = url
    app._pool = None
    app.amqp._producer_pool = None
