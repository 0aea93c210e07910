"""The whole-fleet soak's schedule: a few hundred tasks, per-second to per-minute.

Imported by ``tasks.py`` only when ULTIMAT3_ACCEPTANCE_FLEET is set, in every process of the
fleet (schedulers, both workers, the relay and the Celery worker). Every body leaves a row,
``Ping(label="fleet <task> <occurrence>")``, before it does anything else, so the test counts
how many times each occurrence ran. The kinds:

- ``ok``: a ``@job`` that only leaves its row;
- ``slow``: a ``@job`` that then sleeps 1 to 3 seconds;
- ``fail``: a ``@job`` that then raises (two attempts);
- ``hang``: a ``@job`` that then sleeps 600 seconds, past its ``timeout=2`` (one attempt);
- ``dtask``: a Django Task on ``JobsBackend`` (one in four raises);
- ``relay``: an ``ExactlyOnceTask`` Celery task, relayed by ``run_relay``.
"""

from __future__ import annotations

import time
import zlib
from datetime import datetime
from typing import Any

from celery import shared_task  # type: ignore[import-untyped, unused-ignore]
from django_tasks import task as django_task

from testproject.demo.models import Ping
from ultimat3_jobs import Entry, job, task
from ultimat3_jobs.celery import ExactlyOnceTask

#: (cron, how many tasks on it): per second down to per minute, one seconds field each.
CADENCES: list[tuple[str, int]] = [
    ("* * * * * *", 6),
    ("*/5 * * * * *", 24),
    ("*/15 * * * * *", 30),
    ("*/30 * * * * *", 30),
    ("{second} * * * * *", 150),
]
#: Kinds in turn; the ``hang`` tasks are added apart, once a minute only.
KINDS = ["ok", "dtask", "relay", "ok", "slow", "fail", "dtask", "relay"]
HANG_TASKS = 4
ZONES = ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"]
PREFIX = "fleet."


def record(name: str, occurrence: str) -> None:
    """The row that says this body ran once more for this occurrence."""
    Ping.objects.create(label=f"fleet {name} {occurrence}")


def pause_for(name: str, occurrence: str) -> float:
    """1 to 3 seconds, the same for every run of one occurrence."""
    return 1 + (zlib.crc32(f"{name} {occurrence}".encode()) % 2000) / 1000


@job(name="fleet.ok", max_attempts=5)
def ok(name: str, occurrence: str) -> None:
    record(name, occurrence)


@job(name="fleet.slow", max_attempts=5)
def slow(name: str, occurrence: str) -> None:
    record(name, occurrence)
    time.sleep(pause_for(name, occurrence))


@job(name="fleet.fail", max_attempts=2)
def fail(name: str, occurrence: str) -> None:
    record(name, occurrence)
    raise RuntimeError(f"{name} fails on purpose")


@job(name="fleet.hang", max_attempts=1, timeout=2)
def hang(name: str, occurrence: str) -> None:
    record(name, occurrence)
    time.sleep(600)


@django_task()
def dtask(name: str, occurrence: str) -> str:
    record(name, occurrence)
    if zlib.crc32(occurrence.encode()) % 4 == 0:
        raise ValueError(f"{name} fails on purpose")
    return occurrence


@shared_task(base=ExactlyOnceTask, bind=True, name="fleet.relayed")
def relayed(self: ExactlyOnceTask, name: str, occurrence: str) -> str:
    """Its row commits with "done", under the row lock: once per occurrence, whatever dies."""
    record(name, occurrence)
    return self.job_key or ""


TARGETS: dict[str, Any] = {
    "ok": ok,
    "slow": slow,
    "fail": fail,
    "hang": hang,
    "dtask": dtask,
    "relay": relayed,
}


def _declare(name: str, kind: str, cron: str, tz: str) -> None:
    target = TARGETS[kind]

    def entries(occurrence: datetime) -> list[Entry]:
        return [(target, {"name": name, "occurrence": occurrence.isoformat()})]

    entries.__name__ = name.replace(".", "_")
    task(cron=cron, tz=tz, name=name, catch_up="run-all", max_catch_up=1000)(entries)


def schedule() -> list[tuple[str, str, str, str]]:
    """Every task of the soak: (name, kind, cron, tz), in declaration order."""
    declared = []
    n = 0
    for cron, count in CADENCES:
        for _ in range(count):
            kind = KINDS[n % len(KINDS)]
            expr = cron.format(second=n % 60)
            declared.append((f"{PREFIX}{kind}_{n:03d}", kind, expr, ZONES[n % len(ZONES)]))
            n += 1
    for h in range(HANG_TASKS):
        declared.append((f"{PREFIX}hang_{n:03d}", "hang", f"{(h * 15 + 7) % 60} * * * * *", "UTC"))
        n += 1
    return declared


SCHEDULE = schedule()
KIND_OF: dict[str, str] = {name: kind for name, kind, _, _ in SCHEDULE}

for _name, _kind, _cron, _tz in SCHEDULE:
    _declare(_name, _kind, _cron, _tz)
