"""Example declarations: what a project's ``tasks.py`` looks like."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

from django.db import connection, transaction

from ultimat3_jobs import Entry, job, task

from .models import Beat, Ping


@job(key="digest:{day}")
def send_digest(day: str) -> None:
    """Pretend to mail the digest of ``day``; leave a row so the run can be seen."""
    Ping.objects.create(label=f"digest {day}")


@job
def ping(label: str) -> None:
    Ping.objects.create(label=label)


@job
def record_beat(occurrence: str) -> None:
    """Leave a row saying which occurrence ran: what the admin shows moving under ``make run``."""
    Beat.objects.get_or_create(occurrence=datetime.fromisoformat(occurrence))


@task(cron="*/10 * * * * *", tz="UTC")
def every_ten_seconds(occurrence: datetime) -> list[Entry]:
    # Fires within ten seconds of starting, so a newcomer sees a job succeed right away.
    return [(record_beat, {"occurrence": occurrence.isoformat()})]


# -- The DST showcase: one wall-clock task, one real-time task (see the README's DST rule) ----


@task(cron="0 3 * * *", tz="Europe/Paris", catch_up="run-once")
def nightly_digest(occurrence: datetime) -> list[Entry]:
    # The occurrence, not now: a late or replayed run builds the digest of its own day.
    return [(send_digest, {"day": occurrence.date().isoformat()})]


@task(cron="*/15 * * * *", tz="America/New_York")
def quarter_hour_ping(occurrence: datetime) -> list[Entry]:
    return [(ping, {"label": f"quarter-hour {occurrence.isoformat()}"})]


# -- Jobs the worker tests and the benchmark run ---------------------------------------------


@job(max_attempts=3)
def always_fail(label: str) -> None:
    """Raise every time, so a test can watch the retries run out."""
    raise RuntimeError(f"demo failure: {label}")


@job
def slow_ping(label: str, seconds: float, started: str = "") -> None:
    """Sleep, then leave a row: a job that is still in flight when a test signals its worker.

    ``started``: a file made once the function runs. A job's row says "running" from its
    claim on, and a worker claims ahead of its threads, so the row alone does not say that.
    """
    if started:
        with open(started, "w"):
            pass
    time.sleep(seconds)
    Ping.objects.create(label=label)


@job(max_attempts=1)
def ping_once(label: str) -> None:
    """A job with one attempt: one lost to its worker's death would end it failed unrun."""
    Ping.objects.create(label=label)


@job(max_attempts=2)
def kill_own_worker(label: str) -> None:
    """Kill the worker process running it, as an out-of-memory kill would: a poison job."""
    os.kill(os.getpid(), signal.SIGKILL)


@job(timeout=2, max_attempts=1)
def hang(label: str, seconds: float = 600, started: str = "") -> None:
    """Block in C past its timeout (a socket read with none would do the same), then leave a
    row: a timed-out job whose code goes on, for the worker to leave behind or kill."""
    if started:
        with open(started, "w"):
            pass
    time.sleep(seconds)
    Ping.objects.create(label=label)


@job(timeout=2, max_attempts=1)
def hang_in_subprocess(label: str, pids: str) -> None:
    """Start two processes that outlive any wait, one deaf to SIGTERM, write their pids, and
    wait for them past the timeout: what a timed-out job started, for the worker to end."""
    sleeper = (
        "import signal, sys, time\n"
        "if sys.argv[1] == 'deaf':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(600)"
    )
    started = [subprocess.Popen([sys.executable, "-c", sleeper, how]) for how in ("plain", "deaf")]
    with open(pids, "w") as out:
        out.write(" ".join(str(p.pid) for p in started))
    for process in started:
        process.wait()
    Ping.objects.create(label=label)


@job(max_attempts=1)
def ping_uncommitted(label: str) -> None:
    """Write a row with autocommit off and return without committing: a job that forgets."""
    transaction.set_autocommit(False)
    Ping.objects.create(label=label)


@job(timeout=2, max_attempts=1)
def hold_lock_in_query(label: str, key: int) -> None:
    """Take an advisory lock in its transaction, then block in one statement past its timeout:
    the statement runs on in the server unless the timeout ends it (PostgreSQL only)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
        cursor.execute("SELECT pg_sleep(600)")
    Ping.objects.create(label=label)


@job(max_attempts=1)
def hold_the_gil(label: str, started: str) -> None:
    """Leave a row naming its process, then run a regular expression that backtracks for
    hours in C, the GIL held all along: no other thread of its process gets a turn."""
    Ping.objects.create(label=f"{label} {os.getpid()}")
    with open(started, "w"):
        pass
    re.match(r"(a+)+$", "a" * 64 + "b")


@job(max_attempts=1)
def exit_hard(label: str) -> None:
    """End its process at once, without cleanup, as a crash in an extension would."""
    os._exit(1)


@job(max_attempts=1)
def kill_own_process(label: str) -> None:
    """SIGKILL its own process, standing in for the kernel's out-of-memory killer."""
    os.kill(os.getpid(), signal.SIGKILL)


#: What ``grow`` keeps, so its process stays as large as it grew.
_KEPT: list[bytes] = []


@job
def grow(label: str, megabytes: int) -> None:
    """Take and keep ``megabytes`` of memory, then leave a row naming its process."""
    _KEPT.append(b"x" * (megabytes * 1024 * 1024))
    Ping.objects.create(label=f"{label} {os.getpid()}")


@job
def ping_pid(label: str) -> None:
    """Leave a row naming the process that ran it."""
    Ping.objects.create(label=f"{label} {os.getpid()}")


@job
def ping_frozen(label: str) -> None:
    """Leave a row naming how many objects its process keeps out of the cyclic collector."""
    Ping.objects.create(label=f"{label} {gc.get_freeze_count()}")


@job
def noop() -> None:
    """Do nothing: what the benchmark measures is the worker's own cost per job."""


@job
def stamp(label: str) -> None:
    """Leave the moment it started (epoch seconds): the benchmark's enqueue-to-start latency."""
    started = time.time()
    Ping.objects.create(label=f"{label} {started:.6f}")


if os.environ.get("ULTIMAT3_DEMO_PER_SECOND"):
    # Only when asked for: a task firing every second would flood a real project's job table.

    @task(cron="* * * * * *", tz="UTC", name="demo.every_second")
    def every_second(occurrence: datetime) -> list[Entry]:
        return [(ping, {"label": f"every-second {occurrence.isoformat()}"})]
