"""The whole fleet as real processes, and the chaos done to it, for the fleet soak.

Two ``run_scheduler`` (lease election), a ``run_worker`` with threads and one with
``--pool process``, a ``run_relay`` and a ``celery worker`` on the throwaway PostgreSQL and
Redis, every one run by a :class:`Slot` that starts it again after it dies. :class:`Chaos`
kills the slots' processes at random (SIGKILL or SIGTERM), restarts PostgreSQL, terminates its
backends and restarts Redis (sparing each slot for half of the run, so that every role has a
long-lived process), while :class:`Samples` reads each process's resident memory and
the job table's dead tuples every few seconds.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import OperationalError, connection
from django.db.utils import InterfaceError

from ..redis_server import RedisServer
from .helpers import CeleryWorker, Process, restart_throwaway_postgres, spawn, spawn_celery

#: Settings every process of the fleet runs with: fast rounds and leases, quick recovery.
SETTINGS: dict[str, Any] = {
    "LEADER": "lease",
    "TICK_INTERVAL": 0.2,
    "LEASE_TTL": 2,
    "HEARTBEAT_INTERVAL": 1,
    "WORKER_STALE_AFTER": 10,
    "WORKER_DRAIN_GRACE": 10,
    "RETRY_BACKOFF_MAX": 5,
}
RESEND_AFTER = 10
#: Seconds a SIGTERMed process may take to drain before it is killed.
DRAIN_LIMIT = 40
#: The share of the run for which the chaos spares each slot (see Chaos.spared).
SPARED = 0.5


def fleet_env(redis: RedisServer) -> dict[str, str]:
    return {
        "ULTIMAT3_ACCEPTANCE_FLEET": "1",
        "CELERY_BROKER_URL": redis.url,
        "CELERY_VISIBILITY_TIMEOUT": "4",
        "CELERY_UNACKED_RESTORE_INTERVAL": "1",
    }


@dataclass
class Life:
    """One process of a slot: when it started and ended, and how."""

    process: Process | CeleryWorker
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    #: The signal the chaos sent it, if any, and when.
    sent: int | None = None
    sent_at: float | None = None
    #: (monotonic time, VmRSS in kB).
    rss: list[tuple[float, int]] = field(default_factory=list)


class Slot:
    """One member of the fleet (a role and its place), kept running: dead, it starts again."""

    def __init__(self, fleet: Fleet, name: str, role: str, argv: tuple[str, ...]) -> None:
        self.fleet, self.name, self.role, self.argv = fleet, name, role, argv
        self.lives: list[Life] = []
        self.restart_at: float | None = None
        #: Stopped for good: never started again.
        self.retired = False
        self._started_seen = False

    @property
    def current(self) -> Life | None:
        return self.lives[-1] if self.lives and self.lives[-1].ended_at is None else None

    def start(self) -> None:
        n = len(self.lives)
        name = f"{self.name}-{n}"
        process: Process | CeleryWorker
        if self.role == "celery":
            process = spawn_celery(
                self.fleet.tmp_path,
                name,
                hostname=name,
                concurrency=4,
                env=fleet_env(self.fleet.redis),
            )
        else:
            process = spawn(
                self.fleet.tmp_path,
                name,
                *self.argv,
                settings_overrides=SETTINGS,
                env=fleet_env(self.fleet.redis),
            )
        self.lives.append(Life(process, time.monotonic()))
        self._started_seen = False
        self.restart_at = None

    def started(self) -> bool:
        """Past start-up: its signal handlers are in place, so SIGTERM drains it."""
        life = self.current
        if life is None or not life.process.alive():
            return False
        if not self._started_seen:
            process = life.process
            if isinstance(process, CeleryWorker):
                self._started_seen = process.ready()
            else:
                self._started_seen = any(e["event"].endswith(".started") for e in process.events())
        return self._started_seen

    def reap(self, now: float, pause: float) -> Life | None:
        """Note the end of a process that exited; a new one is due ``pause`` seconds later."""
        life = self.current
        if life is None or life.process.alive():
            return None
        life.ended_at = now
        life.exit_code = life.process.popen.returncode
        close = getattr(life.process, "_log", None)
        if close is not None:
            close.close()
        self.restart_at = now + pause
        return life

    def send(self, signum: int) -> None:
        life = self.current
        if life is not None:
            life.sent, life.sent_at = signum, time.monotonic()
            life.process.signal(signum)


class Fleet:
    """Every slot of the fleet, and what they did."""

    def __init__(self, tmp_path: Path, redis: RedisServer) -> None:
        self.tmp_path, self.redis = tmp_path, redis
        relay = ("run_relay", "--poll-interval", "0.5", "--resend-after", str(RESEND_AFTER))
        self.slots = [
            Slot(self, "scheduler-a", "scheduler", ("run_scheduler", "--leader", "lease")),
            Slot(self, "scheduler-b", "scheduler", ("run_scheduler", "--leader", "lease")),
            Slot(
                self,
                "worker-thread",
                "worker-thread",
                ("run_worker", "--concurrency", "8", "-v", "2"),
            ),
            Slot(
                self,
                "worker-process",
                "worker-process",
                ("run_worker", "--concurrency", "6", "--pool", "process", "-v", "2"),
            ),
            Slot(self, "relay", "relay", relay),
            Slot(self, "celery", "celery", ()),
        ]
        #: Exits the chaos did not cause (a worker recycling itself, a crash), by slot.
        self.own_exits: Counter[str] = Counter()
        #: Exit codes after a SIGTERM, by role and code.
        self.term_exits: Counter[tuple[str, int | None]] = Counter()
        #: SIGTERMed processes still alive after DRAIN_LIMIT, killed, by slot.
        self.drain_overruns: Counter[str] = Counter()

    def start(self) -> None:
        for slot in self.slots:
            slot.start()

    def keep_running(self, rng: random.Random, *, restart: bool = True) -> None:
        """Reap what exited, kill what outlived its drain, start again what is due."""
        now = time.monotonic()
        for slot in self.slots:
            life = slot.current
            if (
                life is not None
                and life.sent_at is not None
                and now - life.sent_at > DRAIN_LIMIT
                and life.process.alive()
            ):
                self.drain_overruns[slot.name] += 1
                life.process.signal(signal.SIGKILL)
            ended = slot.reap(now, rng.uniform(0.5, 3.0))
            if ended is not None:
                if ended.sent is None:
                    self.own_exits[slot.name] += 1
                    slot.restart_at = now  # as a supervisor would, at once
                elif ended.sent == signal.SIGTERM:
                    self.term_exits[(slot.role, ended.exit_code)] += 1
            due = slot.restart_at is not None and now >= slot.restart_at
            if restart and due and not slot.retired and slot.current is None:
                slot.start()

    def stop(self, slots: list[Slot] | None = None, timeout: float = 60) -> None:
        """SIGTERM the processes of ``slots`` (default: all), and wait for them; none restarts.

        One still starting up (no signal handler yet) is waited for, then killed if need be.
        """
        slots = self.slots if slots is None else slots
        for slot in slots:
            slot.retired = True
        deadline = time.monotonic() + 20
        for slot in slots:
            while slot.current and not slot.started() and time.monotonic() < deadline:
                time.sleep(0.1)
        for slot in slots:
            life = slot.current
            if life is not None and life.sent == signal.SIGTERM:
                continue  # already draining
            slot.send(signal.SIGTERM if slot.started() else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for slot in slots:
            life = slot.current
            if life is None:
                continue
            try:
                life.process.popen.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                life.process.signal(signal.SIGKILL)
                life.process.popen.wait(10)
            slot.reap(time.monotonic(), 0)
            if life.sent == signal.SIGTERM:
                self.term_exits[(slot.role, life.exit_code)] += 1


def read_rss(pid: int) -> int | None:
    """VmRSS of ``pid`` in kB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def dead_tuples(table: str) -> tuple[int, int] | None:
    """(n_dead_tup, n_live_tup) of ``table``, or None while the database is away."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = %s",
                [table],
            )
            row = cursor.fetchone()
    except (OperationalError, InterfaceError):
        connection.close()
        return None
    return (int(row[0]), int(row[1])) if row else None


@dataclass
class Samples:
    """Resident memory per process and the job table's dead tuples, every ``every`` seconds."""

    fleet: Fleet
    table: str
    every: float = 5.0
    dead: list[tuple[float, int, int]] = field(default_factory=list)
    _last: float = 0.0

    def take(self) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        for slot in self.fleet.slots:
            life = slot.current
            if life is not None and life.process.alive():
                rss = read_rss(life.process.pid)
                if rss is not None:
                    life.rss.append((now, rss))
        counts = dead_tuples(self.table)
        if counts is not None:
            self.dead.append((now, *counts))


def rss_windows(lifetime: float) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The two stretches of a life whose memory must agree: (early, late), seconds from start.

    A life of 30 minutes or more: minutes 10 to 20, and the last 10 minutes. Shorter, down to
    three minutes: the same thirds of it (its middle third, its last third). Shorter: None.
    """
    if lifetime >= 1800:
        return (600.0, 1200.0), (lifetime - 600, lifetime)
    if lifetime >= 180:
        return (lifetime / 3, 2 * lifetime / 3), (2 * lifetime / 3, lifetime)
    return None


def median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2)


@dataclass
class Chaos:
    """Random kills of every role, and planned database and broker outages, for ``seconds``."""

    fleet: Fleet
    samples: Samples
    seconds: float
    rng: random.Random
    kills: Counter[str] = field(default_factory=Counter)
    postgres_restarts: int = 0
    backend_terminations: int = 0
    redis_restarts: int = 0
    notes: list[str] = field(default_factory=list)

    def plan(self) -> list[tuple[float, str]]:
        """When (a fraction of the run) each outage happens."""
        return sorted(
            [
                (0.2, "terminate-backends"),
                (0.35, "restart-postgres"),
                (0.5, "terminate-backends"),
                (0.6, "restart-redis"),
                (0.75, "restart-postgres"),
                (0.85, "terminate-backends"),
            ]
        )

    def run(self) -> None:
        began = time.monotonic()
        deadline = began + self.seconds
        outages = self.plan()
        next_kill = began + self.rng.uniform(2, 6)
        while time.monotonic() < deadline:
            now = time.monotonic()
            self.fleet.keep_running(self.rng)
            self.samples.take()
            if outages and now >= began + outages[0][0] * self.seconds:
                self.outage(outages.pop(0)[1])
            if now >= next_kill:
                self.kill_one(now - began)
                next_kill = time.monotonic() + self.rng.uniform(2, 6)
            time.sleep(0.2)

    def spared(self, slot: Slot, elapsed: float) -> bool:
        """Whether ``slot`` is left alone now, ``elapsed`` seconds into the run.

        Each slot is, once, for half the run (the slots one after the other), so each role
        has a process that lives long enough for its memory to be judged.
        """
        index = self.fleet.slots.index(slot)
        length = self.seconds * SPARED
        start = (self.seconds - length) * index / max(1, len(self.fleet.slots) - 1)
        return start <= elapsed < start + length

    def kill_one(self, elapsed: float) -> None:
        live = [
            slot for slot in self.fleet.slots if slot.started() and not self.spared(slot, elapsed)
        ]
        if not live:
            return
        slot = self.rng.choice(live)
        how = signal.SIGKILL if self.rng.random() < 0.5 else signal.SIGTERM
        slot.send(how)
        self.kills[f"{slot.role} {signal.Signals(how).name}"] += 1

    def outage(self, what: str) -> None:
        if what == "terminate-backends":
            try:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    (count,) = cursor.fetchone()
            except (OperationalError, InterfaceError):
                connection.close()
                self.notes.append("a backend termination found the database away")
                return
            self.backend_terminations += 1
            self.notes.append(f"terminated {count} backends")
        elif what == "restart-postgres":
            if not restart_throwaway_postgres():
                self.notes.append("no PostgreSQL restart: not the throwaway cluster")
                return
            self.postgres_restarts += 1
        elif what == "restart-redis":
            self.fleet.redis.stop()
            time.sleep(self.rng.uniform(1, 3))
            self.fleet.redis.start()
            self.redis_restarts += 1
