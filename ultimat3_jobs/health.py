"""Whether each role is alive and ready, for load balancers, Kubernetes and exec probes.

One question, asked from two places:

- in a role's own process (``/healthz`` and ``/readyz`` on ``--metrics-port``), the role's own
  state answers: the scheduler's last round, the worker's and the relay's last heartbeat (each
  written from its loop, so a loop that hangs stops it), the relay's last word from its broker;
- from any other process (``manage.py jobs_status --check``, the django-health-check plugin in
  ``health_checks.py``), the node table and the leader election answer: a live leader whose
  last round is recent and whose leadership the database confirms (the advisory lock held, or
  the lease unexpired), a worker heard from, a relay whose engine takes its rows.

Alive means the loop turns (a liveness probe restarts a process that is not); ready means it
does its work now (the database answers, it is not draining). A scheduler is alive while its
last round ended within ``HEALTH_TICKS`` ticks; a worker or a relay while its last heartbeat
was tried within ``HEALTH_TICKS`` heartbeat intervals. While the database is away the loops
back off (up to ``retries.MAX_LOOP_BACKOFF``): they stay alive, and are not ready.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .conf import Settings, get_settings
from .db import app_database, database_now
from .humanize import duration
from .models import Node
from .nodes import DRAINING
from .retries import MAX_LOOP_BACKOFF
from .status import START_FIX, leadership_held, round_on_database_clock

if TYPE_CHECKING:
    from .nodes import Heartbeat
    from .relay import Relay
    from .scheduler import Scheduler
    from .worker import Worker

ROLES = ("scheduler", "worker", "relay")

WORKER_FIX = "start one with `python manage.py run_worker` (or `run_jobs`), and check its log"
RELAY_FIX = (
    "start `python manage.py run_relay`, and check that the Celery broker (CELERY_BROKER_URL) "
    "or the Tasks backend it sends to runs"
)
DATABASE_FIX = "check that the database runs and DATABASES points at it; the loop retries"
LEADER_FIX = (
    "check the scheduler's log (jobs.scheduler.leadership-lost, .tick-failed); a standby "
    "scheduler takes over within a round"
)


@dataclass(frozen=True)
class RoleHealth:
    """One role's answer: ``live`` (its loop turns), ``ready`` (it works now), what an operator
    reads in ``detail``, and, when not ready, what to do in ``fix``."""

    role: str
    live: bool
    ready: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


# -- in the role's own process ------------------------------------------------------------------


def scheduler_health(scheduler: Scheduler, *, moment: float | None = None) -> RoleHealth:
    """A scheduler of this process: its last round within ``HEALTH_TICKS`` ticks, its
    leadership known (its last round, and with it the election, went through)."""
    config = get_settings()
    now = time.monotonic() if moment is None else moment
    status = scheduler.status
    if status in ("idle", "stopped"):
        return RoleHealth("scheduler", False, False, f"not running ({status})", START_FIX)
    ticks = config.health_ticks
    allowed = ticks * scheduler.tick_interval.total_seconds()
    if scheduler.round_failed:
        # Backing off while the database is away: alive while it keeps trying.
        allowed = ticks * max(scheduler.tick_interval, MAX_LOOP_BACKOFF).total_seconds()
    began, ended = scheduler.round_began, scheduler.round_ended
    limit = f"more than {ticks} ticks"
    if began is not None and (ended is None or began > ended):
        # A long round (slow task functions, a first sync of many tasks) is not a dead loop.
        age = now - began
        stale = config.stale_round_warning.total_seconds()
        live = age <= max(allowed, stale)
        detail = f"a round in flight for {_seconds(age)}"
        if stale > allowed:
            limit = f"more than STALE_ROUND_WARNING, {_seconds(stale)}"
    elif ended is None:
        live, detail = True, "starting"
    else:
        age = now - ended
        live = age <= allowed
        detail = f"last round {_seconds(age)} ago"
    if not live:
        detail += f" ({limit})"
    role = "leader" if scheduler.is_leader else "standby"
    if scheduler.round_failed:
        return RoleHealth(
            "scheduler",
            live,
            False,
            f"{detail}; the last round failed, leadership unknown: {scheduler.last_error}",
            DATABASE_FIX,
        )
    ready = live and status == "running"
    fix = "" if ready else "the scheduler is draining" if live else LEADER_FIX
    return RoleHealth("scheduler", live, ready, f"{role}, {detail}", fix)


def _heartbeat_health(
    role: str,
    node: Heartbeat,
    status: str,
    config: Settings,
    now: float,
    fix: str,
) -> RoleHealth:
    if status in ("idle", "stopped"):
        return RoleHealth(role, False, False, f"not running ({status})", fix)
    ticks = config.health_ticks
    every = node.every.total_seconds()
    written, attempted = node.written, node.attempted
    if attempted is None:
        return RoleHealth(role, True, status == "running", "starting", "")
    failing = written is None or written < attempted
    allowed = ticks * (max(node.every, MAX_LOOP_BACKOFF).total_seconds() if failing else every)
    live = now - attempted <= allowed
    if failing:
        detail = f"its last heartbeat failed ({_seconds(now - attempted)} ago): database away"
        return RoleHealth(role, live, False, detail, DATABASE_FIX)
    detail = f"heartbeat {_seconds(now - attempted)} ago"
    if not live:
        return RoleHealth(role, False, False, f"{detail} (more than {ticks} heartbeats)", fix)
    ready = status == "running"
    return RoleHealth(role, True, ready, detail, "" if ready else f"the {role} is draining")


def worker_health(worker: Worker, *, moment: float | None = None) -> RoleHealth:
    """A worker of this process: its heartbeat, written by its claim loop, within
    ``HEALTH_TICKS`` heartbeat intervals."""
    now = time.monotonic() if moment is None else moment
    return _heartbeat_health("worker", worker.node, worker.status, get_settings(), now, WORKER_FIX)


def relay_health(relay: Relay, *, moment: float | None = None) -> RoleHealth:
    """A relay of this process: its heartbeat, and its broker taking its rows."""
    now = time.monotonic() if moment is None else moment
    found = _heartbeat_health("relay", relay.node, relay.status, get_settings(), now, RELAY_FIX)
    if found.ready and not relay.broker_reachable:
        detail = f"{found.detail}; its broker could not be reached"
        return RoleHealth("relay", found.live, False, detail, RELAY_FIX)
    return found


class ProcessHealth:
    """The roles this process runs, as ``/healthz`` and ``/readyz`` report them.

    Held weakly: a role that is gone is no longer reported.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: list[weakref.ref[Scheduler | Worker | Relay]] = []

    def watch(self, role: Scheduler | Worker | Relay) -> None:
        """Report ``role`` from now on, for as long as it exists."""
        with self._lock:
            self._roles = [ref for ref in self._roles if ref() is not None]
            self._roles.append(weakref.ref(role))

    def report(self) -> list[RoleHealth]:
        # Imported here: `jobs_status --check`, an exec probe's process, judges the database
        # and runs none of the roles.
        from .scheduler import Scheduler
        from .worker import Worker

        with self._lock:
            roles = [role for ref in self._roles if (role := ref()) is not None]
        found = []
        for role in roles:
            if isinstance(role, Scheduler):
                found.append(scheduler_health(role))
            elif isinstance(role, Worker):
                found.append(worker_health(role))
            else:
                found.append(relay_health(role))
        return found


#: The roles of this process (the management commands watch what they build).
process = ProcessHealth()


# -- from any process: the database -------------------------------------------------------------


def database_health(
    using: str | None = None,
    *,
    roles: Sequence[str] | None = None,
    now: datetime | None = None,
) -> list[RoleHealth]:
    """Each of ``roles`` as the node table and the leader election say, judged by the database
    clock. ``roles`` defaults to the scheduler and the worker, and the relay where one runs (a
    relay node not stopped, crashed ones included).

    A scheduler node writes its row once a heartbeat, so a round is judged recent within
    ``HEALTH_TICKS`` ticks or heartbeat intervals, whichever is longer; a dead advisory leader
    is seen at once, its lock gone with its connection.
    """
    config = get_settings()
    using = using or app_database()
    now = now or database_now(using)
    nodes = list(Node.objects.using(using).filter(stopped_at__isnull=True))
    if roles is None:
        roles = ["scheduler", "worker"]
        if any(node.role == "relay" for node in nodes):
            roles.append("relay")
    found = []
    for role in roles:
        mine = [node for node in nodes if node.role == role]
        if role == "scheduler":
            found.append(_scheduler_from_nodes(mine, using, config, now))
        else:
            fix = WORKER_FIX if role == "worker" else RELAY_FIX
            found.append(_heartbeats_from_nodes(role, mine, config, now, fix))
    return found


def _scheduler_from_nodes(
    nodes: list[Node], using: str, config: Settings, now: datetime
) -> RoleHealth:
    window = config.health_ticks * max(config.tick_interval, config.heartbeat_interval)
    live = [node for node in nodes if now - node.last_seen_at <= window]
    if not live:
        heard = _last_heard(nodes, now)
        return RoleHealth("scheduler", False, False, f"no scheduler heard from {heard}", START_FIX)
    claiming = [node for node in live if node.is_leader]
    if not claiming:
        return RoleHealth(
            "scheduler", True, False, f"{len(live)} scheduler(s), none leads", LEADER_FIX
        )
    # A leader killed outright says it leads until it goes silent: the one the database still
    # grants it leads, the one that took over.
    leader = next((node for node in claiming if leadership_held(node, using, config, now)), None)
    if leader is None:
        gone = claiming[0]
        lost = (
            "its advisory lock is gone (the process or its connection died)"
            if gone.leader == "advisory"
            else "its lease expired or another node holds it"
        )
        return RoleHealth(
            "scheduler", False, False, f"leader {_node_name(gone)}: {lost}", LEADER_FIX
        )
    name = _node_name(leader)
    round_at = round_on_database_clock(leader)
    if round_at is None or now - round_at > window:
        ago = "never" if round_at is None else duration(now - round_at)
        return RoleHealth(
            "scheduler", False, False, f"leader {name}: last round {ago} ago", LEADER_FIX
        )
    age = (now - round_at).total_seconds()
    return RoleHealth("scheduler", True, True, f"leader {name}, last round {_seconds(age)} ago")


def _node_name(node: Node) -> str:
    return f"{node.host}:{node.pid} ({node.leader})"


def _heartbeats_from_nodes(
    role: str, nodes: list[Node], config: Settings, now: datetime, fix: str
) -> RoleHealth:
    window = config.health_ticks * config.heartbeat_interval
    live = [node for node in nodes if now - node.last_seen_at <= window]
    if not live:
        heard = _last_heard(nodes, now)
        return RoleHealth(role, False, False, f"no {role} heard from {heard}", fix)
    working = [node for node in live if not node.last_error]
    if not working:
        last = live[0]
        if all(node.last_error.startswith(DRAINING) for node in live):
            return RoleHealth(role, True, False, f"{len(live)} {role}(s), each draining", fix)
        return RoleHealth(
            role, True, False, f"{len(live)} {role}(s), each failing: {last.last_error}", fix
        )
    return RoleHealth(role, True, True, f"{len(working)} {role}(s) heard from")


def _last_heard(nodes: list[Node], now: datetime) -> str:
    """How long the newest of ``nodes`` (not stopped) has been silent."""
    if not nodes:
        return "(none is running)"
    last = max(node.last_seen_at for node in nodes)
    return f"for {duration(max(now - last, timedelta(0)))}"


__all__ = [
    "ROLES",
    "ProcessHealth",
    "RoleHealth",
    "database_health",
    "process",
    "relay_health",
    "scheduler_health",
    "worker_health",
]
