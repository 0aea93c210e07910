"""Run a command against a throwaway PostgreSQL cluster.

    python scripts/throwaway_postgres.py [--durable] -- COMMAND [ARGS...]


The cluster lives in a temporary directory, listens on a free loopback port with trust auth, and
is stopped and deleted when the command ends. ``DATABASE_URL`` is exported to the command. As
root, the server runs as the ``postgres`` user, because PostgreSQL refuses to run as root.
``initdb`` and ``pg_ctl`` are taken from ``PATH``, else from Debian's newest
``/usr/lib/postgresql/<version>/bin``, which then goes on the command's ``PATH`` too.

It runs with ``fsync=off``, which the tests can afford, unless ``--durable``: then with
PostgreSQL's default, every commit flushed to disk, as in production. The benchmarks time
commits, so they use it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_bin_dir() -> str | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (Debian's), if there is one."""
    found = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")
    versions = [path for path in found if path.split("/")[4].isdigit()]
    if not versions:
        return None
    return os.path.dirname(max(versions, key=lambda path: int(path.split("/")[4])))


def _as_server_user(argv: Sequence[str]) -> list[str]:
    if os.geteuid() != 0:
        return list(argv)
    return ["runuser", "-u", "postgres", "--", *argv]


def _chown_to_server_user(path: str) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(path, entry.pw_uid, entry.pw_gid)


def main(argv: Sequence[str]) -> int:
    if "--" not in argv or set(argv[: argv.index("--")]) - {"--durable"}:
        print("usage: throwaway_postgres.py [--durable] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    durable = "--durable" in argv[: argv.index("--")]
    command = list(argv[argv.index("--") + 1 :])
    bin_dir = _server_bin_dir()
    if bin_dir is not None and not (shutil.which("initdb") and shutil.which("pg_ctl")):
        # The tests that restart the server call pg_ctl too.
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    tools = {tool: shutil.which(tool) for tool in ("initdb", "pg_ctl")}
    for tool, path in tools.items():
        if path is None:
            print(
                f"{tool} not found: install PostgreSQL (as root: apt-get install -y postgresql)",
                file=sys.stderr,
            )
            return 2
    initdb, pg_ctl = str(tools["initdb"]), str(tools["pg_ctl"])
    root = tempfile.mkdtemp(prefix="ultimat3-pg-")
    os.chmod(root, 0o755)
    _chown_to_server_user(root)
    data = os.path.join(root, "data")
    port = _free_port()
    quiet = {"stdout": subprocess.DEVNULL}
    subprocess.run(
        _as_server_user([initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8"]),
        check=True,
        **quiet,  # type: ignore[arg-type]
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200"
    if not durable:
        options += " -c fsync=off"
    log = os.path.join(root, "server.log")
    subprocess.run(
        _as_server_user([pg_ctl, "-D", data, "-l", log, "-o", options, "-w", "start"]),
        check=True,
        **quiet,  # type: ignore[arg-type]
    )
    env = dict(os.environ)
    env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/postgres"
    # Tests that restart the server need to know where it lives.
    env["ULTIMAT3_TEST_PGDATA"] = data
    env["ULTIMAT3_TEST_PGOPTIONS"] = options
    print(f"throwaway PostgreSQL on 127.0.0.1:{port} ({data})", file=sys.stderr)
    try:
        return subprocess.call(command, env=env)
    finally:
        subprocess.run(
            _as_server_user([pg_ctl, "-D", data, "-m", "immediate", "stop"]),
            check=False,
            **quiet,  # type: ignore[arg-type]
        )
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
