"""Long multi-node runs, for ``make soak`` only: random kills and drains for minutes.

``ULTIMAT3_SOAK_SECONDS`` sets the schedulers' soak's length (default 300), ``SOAK_SECONDS``
the whole fleet's (default 120; ``make soak SOAK_SECONDS=3600`` for an hour).
"""

from __future__ import annotations

import os
import random
import signal
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import OperationalError, close_old_connections
from django.utils import timezone

from testproject.demo.models import Ping
from ultimat3_jobs import cron
from ultimat3_jobs.models import Job
from ultimat3_jobs.registry import Registry

from ..redis_server import RedisServer
from .fleet import Chaos, Fleet, Samples, median, rss_windows
from .helpers import Process, processes, stop_all, wait_for
from .test_scheduler_processes import (
    assert_every_occurrence_exactly_once,
    current_leader,
    start_schedulers,
)

__all__ = ["processes"]

#: Seconds left out at each end of the run: occurrences there may straddle start-up or stop.
WINDOW_MARGIN = 10
#: Seconds the fleet may take, after the chaos, to end every job of the run.
SETTLE_SECONDS = 240
#: States a job of the run may end in.
ENDED = {"succeeded", "failed"}

pytestmark = [
    pytest.mark.soak,
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]


@pytest.mark.parametrize("leader", ["advisory", "lease"])
def test_soak__schedulers_killed_and_drained_at_random__every_occurrence_once(
    tmp_path: Path, processes: list[Process], leader: str
) -> None:
    seconds = float(os.environ.get("ULTIMAT3_SOAK_SECONDS", "300"))
    rng = random.Random(seconds)

    def add() -> None:
        start_schedulers(tmp_path, processes, leader, 1)

    for _ in range(3):
        add()
    deadline = time.monotonic() + seconds
    actions = 0
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1, 6))
        # Only processes past start-up: before it, SIGTERM kills rather than drains.
        live = [p for p in processes if p.alive() and p.named("jobs.scheduler.started")]
        if not live:
            continue
        victim = current_leader(live) if rng.random() < 0.7 else rng.choice(live)
        if victim is None:
            continue
        how = rng.choice([signal.SIGKILL, signal.SIGTERM])
        victim.signal(how)
        if how == signal.SIGTERM:
            assert victim.wait(30) == 0
        else:
            victim.wait(10)
        add()
        actions += 1
    time.sleep(5)
    stop_all(processes)
    seen = assert_every_occurrence_exactly_once()
    assert actions > 0
    assert len(seen) >= seconds * 0.9


def test_fleet_soak__every_role_killed_postgres_and_redis_restarted__every_occurrence_once(
    tmp_path: Path, redis_server: RedisServer, fresh_registry: Registry
) -> None:
    """The whole fleet under chaos for ``SOAK_SECONDS`` (default 120), then every row read."""
    # Imported here, in a registry restored afterwards: its 244 tasks are the fleet's alone.
    from testproject.acceptance.soak import PREFIX

    seconds = float(os.environ.get("SOAK_SECONDS", "120"))
    rng = random.Random(seconds)
    if redis_server.process is None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    fleet = Fleet(tmp_path, redis_server)
    samples = Samples(fleet, Job._meta.db_table)
    chaos = Chaos(fleet, samples, seconds, rng)
    began = time.monotonic()
    fleet.start()
    try:
        first = wait_for(
            lambda: Job.objects.filter(task__startswith=PREFIX).order_by("created_at").first(),
            90,
            "the first round of the fleet's tasks",
        )
        # Every task is armed in that first round: from its next second on, all must fire.
        low = first.created_at + timedelta(seconds=WINDOW_MARGIN)
        chaos.run()
        # Settle: no more chaos, everything up again, the schedulers past the window's end.
        settle_deadline = time.monotonic() + 60
        while not all(slot.started() for slot in fleet.slots):
            assert time.monotonic() < settle_deadline, "the fleet did not come back up"
            fleet.keep_running(rng)
            samples.take()
            time.sleep(0.2)
        high = timezone.now() - timedelta(seconds=WINDOW_MARGIN)
        wait_for(
            lambda: _settled(fleet, samples, rng, high),
            SETTLE_SECONDS,
            "every job of the run to end",
            step=0.5,
        )
    finally:
        fleet.stop()
    duration = time.monotonic() - began
    close_old_connections()
    report = _check(fleet, samples, low, high)
    print(_summary(fleet, samples, chaos, report, seconds, duration), flush=True)
    assert report.problems == [], "\n".join(report.problems[:60])
    assert sum(chaos.kills.values()) > 0


def _settled(fleet: Fleet, samples: Samples, rng: random.Random, high: datetime) -> bool:
    """Past the window's end, the schedulers stop; then every job of the run must end."""
    from testproject.acceptance.soak import PREFIX

    fleet.keep_running(rng)
    samples.take()
    schedulers = [slot for slot in fleet.slots if slot.role == "scheduler"]
    if not all(slot.retired for slot in schedulers):
        if timezone.now() < high + timedelta(seconds=2 * WINDOW_MARGIN):
            return False
        fleet.stop(schedulers)
    try:
        rows = Job.objects.filter(task__startswith=PREFIX)
        busy = rows.filter(status__in=["running", "outbox", "relayed"]).exists()
        return not busy and not rows.filter(status="queued").exists()
    except OperationalError:
        close_old_connections()
        return False


@dataclass
class Report:
    tasks: int = 0
    occurrences: int = 0
    states: Counter[str] = field(default_factory=Counter)
    #: Jobs that ended failed because their worker was killed under them, by kind.
    failed_by_kills: Counter[str] = field(default_factory=Counter)
    #: Jobs failed by a killed worker whose body left no row, by kind.
    killed_before_writing: Counter[str] = field(default_factory=Counter)
    #: Jobs whose body ran more than once, by kind.
    ran_again: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    rss: dict[str, str] = field(default_factory=dict)
    dead_peak: tuple[int, int] = (0, 0)
    max_start_delay: float = 0.0


def _check(fleet: Fleet, samples: Samples, low: datetime, high: datetime) -> Report:
    from testproject.acceptance.soak import KIND_OF, PREFIX, SCHEDULE

    report = Report()
    problems = report.problems
    rows = list(
        Job.objects.filter(task__startswith=PREFIX).values(
            "pk", "task", "occurrence", "status", "attempts", "input", "last_error",
            "run_at", "started_at", "worker",
        )
    )  # fmt: skip
    runs = Counter(Ping.objects.filter(label__startswith="fleet ").values_list("label", flat=True))
    by_task: dict[str, list[datetime]] = {}
    for row in rows:
        if row["occurrence"] is not None:
            by_task.setdefault(row["task"], []).append(row["occurrence"])
        report.states[row["status"]] += 1
        kind = KIND_OF[row["task"]]
        where = f"job {row['pk']} ({row['task']} {row['occurrence']:%H:%M:%S})"
        if row["status"] not in ENDED:
            problems.append(f"{where} did not end: {row['status']}")
            continue
        wanted = {
            "ok": "succeeded",
            "slow": "succeeded",
            "relay": "succeeded",
            "fail": "failed",
            "hang": "failed",
            "dtask": "failed"
            if zlib.crc32(row["input"]["occurrence"].encode()) % 4 == 0
            else "succeeded",
        }[kind]
        if row["status"] != wanted and row["status"] == "failed" and _worker_died(row):
            # At least once, up to max_attempts: a job whose worker the chaos killed under it
            # on its last attempt ends failed (a Django Task has one attempt).
            report.failed_by_kills[kind] += 1
        elif row["status"] != wanted:
            problems.append(f"{where} ended {row['status']}, not {wanted}: {_last_line(row)}")
        n = runs[f"fleet {row['task']} {row['input']['occurrence']}"]
        where += f" [{row['status']}, worker {row['worker']}, error {_last_line(row)!r}]"
        if kind == "relay":
            # ExactlyOnceTask: what it writes to this database, exactly once.
            if n != 1:
                problems.append(f"{where} (ExactlyOnceTask) wrote its row {n} times")
        elif n == 0 and row["status"] == "failed" and _worker_died(row):
            # Killed under it: its body may have begun and died before its first write.
            report.killed_before_writing[kind] += 1
        elif not 1 <= n <= row["attempts"]:
            # At least once, never a run its attempts did not count; an attempt counted for a
            # body that never ran is one it should not have used.
            problems.append(f"{where} ran {n} times on {row['attempts']} attempts")
        report.ran_again[kind] += n > 1
        if row["started_at"] is not None and row["run_at"] is not None:
            delay = (row["started_at"] - row["run_at"]).total_seconds()
            report.max_start_delay = max(report.max_start_delay, delay)
    report.tasks = len(SCHEDULE)
    for name, _kind, expr, tz in SCHEDULE:
        fired = [o for o in by_task.get(name, []) if low < o <= high]
        expected = cron.between(expr, tz, low, high)
        report.occurrences += len(expected)
        doubled = sorted(o for o, n in Counter(fired).items() if n > 1)
        missing = sorted(set(expected) - set(fired))
        unexpected = sorted(set(fired) - set(expected))
        for what, found in (("twice", doubled), ("missing", missing), ("off", unexpected)):
            if found:
                shown = ", ".join(f"{o:%H:%M:%S}" for o in found[:5])
                problems.append(f"{name} ({expr}, {tz}): {len(found)} {what}: {shown}")
    for role in sorted({slot.role for slot in fleet.slots}):
        lives = [life for slot in fleet.slots if slot.role == role for life in slot.lives]
        peak = max((kb for life in lives for _, kb in life.rss), default=0)
        longest = max(lives, key=lambda life: (life.ended_at or 0) - life.started_at)
        lifetime = (longest.ended_at or time.monotonic()) - longest.started_at
        windows = rss_windows(lifetime)
        note = f"peak {peak / 1024:.0f} MB, longest life {lifetime:.0f} s"
        if windows is None:
            note += ": too short to judge its memory"
        else:
            (a0, a1), (b0, b1) = windows
            early = [kb for t, kb in longest.rss if a0 <= t - longest.started_at < a1]
            late = [kb for t, kb in longest.rss if b0 <= t - longest.started_at <= b1]
            if early and late:
                ratio = median(late) / median(early)
                note += f", late/early RSS {ratio:.3f}"
                if abs(ratio - 1) > 0.10:
                    problems.append(f"{role}: RSS moved {ratio:.3f}x in its longest life")
            else:
                note += ": no samples in its windows"
        report.rss[role] = note
    if samples.dead:
        _, dead, live = max(samples.dead, key=lambda sample: sample[1])
        report.dead_peak = (dead, live)
        for _, dead, live in samples.dead:
            if dead > max(10_000, live):
                problems.append(f"the job table had {dead} dead tuples beside {live} live")
                break
    else:
        problems.append("no dead-tuple sample was taken")
    return report


def _worker_died(row: Mapping[str, Any]) -> bool:
    error = row["last_error"] or ""
    return "its worker died during each of them" in error or "jobs.job.process-died" in error


def _last_line(row: Mapping[str, Any]) -> str:
    lines = (row["last_error"] or "").strip().splitlines()
    return lines[-1] if lines else ""


def _summary(
    fleet: Fleet,
    samples: Samples,
    chaos: Chaos,
    report: Report,
    seconds: float,
    duration: float,
) -> str:
    kills = ", ".join(f"{what} {n}" for what, n in sorted(chaos.kills.items()))
    states = ", ".join(f"{state} {n}" for state, n in sorted(report.states.items()))
    terms = ", ".join(f"{role}->{code} {n}" for (role, code), n in sorted(
        fleet.term_exits.items(), key=str
    ))  # fmt: skip
    lines = [
        "",
        f"fleet soak: {seconds:g} s of chaos, {duration:.0f} s in all, {report.tasks} tasks",
        f"  occurrences in the window: {report.occurrences}; jobs by state: {states}",
        f"  jobs whose body ran more than once (each run an attempt), by kind: "
        f"{dict(report.ran_again)}",
        f"  jobs failed because their worker was killed under them, by kind: "
        f"{dict(report.failed_by_kills)}",
        f"  jobs failed by a killed worker before their body wrote its row, by kind: "
        f"{dict(report.killed_before_writing)}",
        f"  latest start after run_at: {report.max_start_delay:.1f} s",
        f"  kills: {kills}",
        f"  exits after SIGTERM (role->code): {terms}",
        f"  exits of their own (restarted): {dict(fleet.own_exits)}",
        f"  SIGTERM drains past the limit, killed: {dict(fleet.drain_overruns)}",
        f"  PostgreSQL restarts {chaos.postgres_restarts}, backend terminations "
        f"{chaos.backend_terminations}, Redis restarts {chaos.redis_restarts}",
        f"  job table dead tuples at peak: {report.dead_peak[0]} (beside "
        f"{report.dead_peak[1]} live), {len(samples.dead)} samples",
        *(f"  RSS {role}: {note}" for role, note in sorted(report.rss.items())),
        *(f"  note: {note}" for note in chaos.notes),
        f"  problems: {len(report.problems)}",
    ]
    return "\n".join(lines)
