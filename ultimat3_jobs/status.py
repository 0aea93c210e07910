"""The scheduler's health as the ``Node`` table tells it: who leads, when the last round ran.

Read-only and computed at a given instant, so the admin's status box and its tests agree on
what "stale" means without a clock of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections

from .conf import Settings, get_settings
from .db import app_database, database_now
from .humanize import duration
from .leaders import LEADER_APPLICATION, leader_application
from .models import Lease, Node

START_FIX = (
    "start one with `python manage.py run_scheduler`, or `python manage.py run_jobs` (the "
    "scheduler and a worker in one process)"
)
STALE_FIX = (
    "check that a `manage.py run_scheduler` process is running and can reach the database; "
    "its log says why rounds stopped"
)
RELAY_FIX = (
    "check that `manage.py run_relay` and the Celery workers run and reach the broker; the "
    "jobs list, filtered on status relayed, shows them with their engine ids"
)
SKEW_FIX = (
    "run NTP (chrony, systemd-timesyncd) on that host and on the database host; occurrences "
    "are computed from the leader's clock"
)


@dataclass(frozen=True)
class StatusWarning:
    """One problem with the scheduler, and what to do about it."""

    message: str
    fix: str


@dataclass(frozen=True)
class SchedulerStatus:
    """What the admin shows above the tasks list."""

    now: datetime
    #: The live scheduler node holding leadership, if any.
    leader: Node | None
    #: Live scheduler nodes, leader first.
    schedulers: list[Node]
    #: Live worker nodes.
    workers: list[Node]
    #: The latest round any scheduler node ran.
    last_round_at: datetime | None
    warnings: list[StatusWarning] = field(default_factory=list)
    #: Live ``run_relay`` nodes.
    relays: list[Node] = field(default_factory=list)

    @property
    def last_round_age(self) -> timedelta | None:
        return None if self.last_round_at is None else self.now - self.last_round_at

    @property
    def healthy(self) -> bool:
        return not self.warnings


def leadership_held(node: Node, using: str, config: Settings, now: datetime) -> bool:
    """Whether the database still grants ``node`` the leadership its row claims: an advisory
    lock lives and dies with its connection (named for its node), a lease until it expires. A
    SIGKILLed leader's row says it leads until it goes silent; this says at once."""
    if node.leader == "advisory" and connections[using].vendor == "postgresql":
        key = config.advisory_lock_key
        with connections[using].cursor() as cursor:
            cursor.execute(_ADVISORY_HOLDERS, [(key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF])
            holders = [name or "" for (name,) in cursor.fetchall()]
        if not holders:
            return False
        ours = leader_application(node.node_id)
        # Another node's leader connection says whose it is; a connection of the release
        # before, or of a `--once` round (Django's own), does not: it may be this node's.
        return any(
            name == ours or not name.startswith(f"{LEADER_APPLICATION} ") for name in holders
        )
    if node.leader == "lease":
        lease = Lease.objects.using(using).filter(name="scheduler").first()
        return lease is not None and lease.owner == node.node_id and lease.expires_at > now
    return True


#: The ``application_name`` of each backend that holds the schedulers' advisory lock (classid,
#: objid of a bigint key) in this database: an advisory lock belongs to its database, and
#: another project on the server (its own job tables, the same default key) holds its own.
_ADVISORY_HOLDERS = """
SELECT a.application_name FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s
  AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _skew_text(skew_ms: int) -> str:
    side = "ahead of" if skew_ms > 0 else "behind"
    return f"{abs(skew_ms) / 1000:.1f} s {side}"


def round_on_database_clock(node: Node) -> datetime | None:
    """When ``node``'s last round ran, by the database's clock: a round keeps the instant it
    planned from, on its node's clock, and its heartbeat the skew it measured then. Judged
    against the database's now as it is, a leader 20 s behind read as silent for 20 s more."""
    if node.last_round_at is None:
        return None
    return node.last_round_at - timedelta(milliseconds=node.clock_skew_ms or 0)


def scheduler_status(now: datetime | None = None, using: str | None = None) -> SchedulerStatus:
    """The scheduler's status at ``now`` (default: the database's clock, which every heartbeat
    and lease is written with, not the viewer's), from one read of ``Node``.

    A node counts as live when it has not stopped and was seen within the stale-round
    threshold (or three heartbeats, whichever is longer); a crashed node keeps its row, and
    its old ``is_leader`` must not pass for a leader.
    """
    config = get_settings()
    using = using or app_database()
    now = now or database_now(using)
    stale_after = config.stale_round_warning
    silent_after = max(stale_after, config.heartbeat_interval * 3)
    nodes = list(Node.objects.using(using).all())

    def live(node: Node) -> bool:
        return node.stopped_at is None and now - node.last_seen_at <= silent_after

    schedulers = [n for n in nodes if n.role == "scheduler"]
    live_schedulers = sorted(
        (n for n in schedulers if live(n)),
        key=lambda n: (not n.is_leader, -n.last_seen_at.timestamp()),
    )
    claiming = [n for n in live_schedulers if n.is_leader]
    leading = [n for n in claiming if leadership_held(n, using, config, now)]
    leader = leading[0] if leading else None
    workers = [n for n in nodes if n.role == "worker" and live(n)]
    rounds = [at for at in map(round_on_database_clock, schedulers) if at is not None]
    last_round_at = max(rounds) if rounds else None

    warnings: list[StatusWarning] = []
    if not schedulers:
        warnings.append(StatusWarning("No scheduler has run against this database yet.", START_FIX))
    elif not live_schedulers:
        # A node that stopped cleanly says so at once; only a crashed one waits out the silence.
        last = max(schedulers, key=lambda n: n.stopped_at or n.last_seen_at)
        gone = (
            f"the last one stopped {duration(now - last.stopped_at)} ago"
            if last.stopped_at is not None
            else f"the last one was last heard from {duration(now - last.last_seen_at)} ago"
        )
        warnings.append(
            StatusWarning(
                f"No scheduler is running ({gone}): tasks are not being dispatched.", START_FIX
            )
        )
    elif last_round_at is None:
        warnings.append(StatusWarning("No scheduler round has run yet.", STALE_FIX))
    elif now - last_round_at > stale_after:
        warnings.append(
            StatusWarning(
                f"No scheduler round for {duration(now - last_round_at)} "
                f"(warning after {duration(stale_after)}): tasks are not being dispatched.",
                STALE_FIX,
            )
        )
    if claiming and not leading:
        dead = claiming[0]
        warnings.append(
            StatusWarning(
                f"The scheduler {dead.host}:{dead.pid} says it leads, but no longer holds its "
                f"{dead.leader} leadership (the process or its connection died): tasks are not "
                "being dispatched until another takes over.",
                STALE_FIX,
            )
        )
    elif len(leading) > 1:
        names = ", ".join(f"{n.host}:{n.pid} ({n.leader})" for n in leading)
        warnings.append(
            StatusWarning(
                f"Schedulers {names} lead at once: their rounds undo each other's (logged "
                "jobs.scheduler.watermark-moved).",
                "give every scheduler the same LEADER and ADVISORY_LOCK_KEY settings",
            )
        )
    threshold_ms = config.clock_skew_warning.total_seconds() * 1000
    for node in live_schedulers + workers:
        if node.clock_skew_ms is not None and abs(node.clock_skew_ms) > threshold_ms:
            warnings.append(
                StatusWarning(
                    f"The clock of {node.role} {node.host}:{node.pid} is "
                    f"{_skew_text(node.clock_skew_ms)} the database "
                    f"(warning above {config.clock_skew_warning.total_seconds():g} s).",
                    SKEW_FIX,
                )
            )
    if leader is not None and leader.last_error:
        warnings.append(
            StatusWarning(
                f"The leader reports an error: {leader.last_error}",
                "see the scheduler's log for the event and its fix",
            )
        )
    stuck = relay_warning(now, using)
    if stuck is not None:
        warnings.append(stuck)
    return SchedulerStatus(
        now=now,
        leader=leader,
        schedulers=live_schedulers,
        workers=workers,
        last_round_at=last_round_at,
        warnings=warnings,
        relays=[n for n in nodes if n.role == "relay" and live(n)],
    )


def relay_warning(now: datetime, using: str | None = None) -> StatusWarning | None:
    """A warning when relayed jobs have not been reported done after ``RELAY_STUCK_AFTER``."""
    from .store import store_for

    after = get_settings().relay_stuck_after
    count = store_for(using).stuck_relayed(before=now - after)
    if not count:
        return None
    plural = "job has" if count == 1 else "jobs have"
    return StatusWarning(
        f"{count} relayed {plural} not been done after {duration(after)}.", RELAY_FIX
    )
