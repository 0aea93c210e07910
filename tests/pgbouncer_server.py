"""A throwaway PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode, on a free
loopback port in front of the test database, for the tests of what the README says to do
behind one.

Started by a fixture, never a system service. PgBouncer refuses to run as root: as root it
runs as the ``postgres`` user, as the throwaway PostgreSQL cluster does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .redis_server import free_port

#: Where Debian installs it, off a non-root user's PATH.
_DEBIAN_BINARY = "/usr/sbin/pgbouncer"


class PgBouncer:
    """One ``pgbouncer`` process pooling transactions to the database of ``url``, with
    ``pool_size`` server connections: its clients' transactions share them, whichever client
    ran on which before (a statement one client prepared is on a backend another client uses)."""

    def __init__(self, url: str, *, pool_size: int) -> None:
        binary = shutil.which("pgbouncer") or (
            _DEBIAN_BINARY if os.access(_DEBIAN_BINARY, os.X_OK) else None
        )
        if binary is None:
            pytest.fail(
                "pgbouncer not found: install it (as root: apt-get install -y pgbouncer); "
                "`make test` does so first (scripts/test_tools.sh)",
                pytrace=False,
            )
        server = urlsplit(url)
        self.database = server.path.lstrip("/")
        self.user = server.username or "postgres"
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ultimat3-pgbouncer-"))
        # A server that asks for a password gets it from the pooler, not from its clients.
        password = f" password={server.password}" if server.password else ""
        ini = f"""
[databases]
{self.database} = host={server.hostname} port={server.port or 5432} dbname={self.database}{password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir / "pgbouncer.log"}
pidfile = {self.dir / "pgbouncer.pid"}
"""
        (self.dir / "pgbouncer.ini").write_text(ini)
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        argv = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.dir / "pgbouncer.log"
                text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                self.stop()
                pytest.fail(f"pgbouncer did not start:\n{text}", pytrace=False)
            time.sleep(0.05)

    def url(self, query: str = "") -> str:
        """A ``DATABASE_URL`` through this pooler, with ``query`` (``?...``) appended."""
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{self.database}{query}"

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
