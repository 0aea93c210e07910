"""Leader elections: which node may dispatch this round.

``acquire()`` is asked every round (for a lease it is the renewal) and ``fence()`` again inside
the dispatch transaction, so a node paused or cut off after winning cannot enqueue once
another node has taken over.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Case, DurationField, ExpressionWrapper, F, Q, Value, When
from django.db.models.fields import DateTimeField
from django.db.models.functions import Coalesce, Now

from .conf import default_leader, get_settings
from .db import dedicated_connection
from .errors import LeaderUnavailableError
from .logs import emit, failure_fields
from .models import Lease

logger = logging.getLogger("ultimat3_jobs.leader")

#: An expiry every database clock has passed: a released or brand-new lease.
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)

ADVISORY_NEEDS_POSTGRES_FIX = (
    'pass --leader lease, or set ULTIMAT3_JOBS["LEADER"] = "lease" (works on every database '
    'and behind PgBouncer), or "sole" for a single node; or move to PostgreSQL'
)


def leader_problem(kind: str | None, vendor: str) -> LeaderUnavailableError | None:
    """Why the election ``kind`` (None: the default) cannot run on a ``vendor`` database."""
    kind = kind or default_leader(vendor)
    if kind == "advisory" and vendor != "postgresql":
        return LeaderUnavailableError(
            f"the advisory leader needs PostgreSQL, but the database is {vendor}",
            fix=ADVISORY_NEEDS_POSTGRES_FIX,
        )
    return None


class LeaderElection(Protocol):
    name: str
    #: Renew this often while a long round runs (a lease would expire under it); None: never.
    renew_every: timedelta | None

    def acquire(self) -> bool:
        """Whether this node leads this round. Renews what it holds; never raises past a False."""

    def fence(self, using: str) -> bool:
        """Inside the dispatch transaction on ``using``: do we still lead?"""

    def release(self) -> None:
        """Hand leadership back, if held."""


class SoleLeader:
    """A single node: always the leader."""

    name = "sole"
    renew_every: timedelta | None = None

    def acquire(self) -> bool:
        return True

    def fence(self, using: str) -> bool:
        return True

    def release(self) -> None:
        return None


def _expires_in(ttl: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(
        Now() + Value(ttl, output_field=DurationField()), output_field=DateTimeField()
    )


class LeaseLeader:
    """A lease row with an expiry judged by the database clock.

    Statement-level only, so it works behind a transaction-pooling PgBouncer and on SQLite.
    Only the owner renews; anyone may take an expired lease.
    """

    name = "lease"

    def __init__(
        self, *, node_id: str, ttl: timedelta, lease: str = "scheduler", using: str = "default"
    ) -> None:
        self.node_id = node_id
        self.ttl = ttl
        self.lease = lease
        self.using = using
        self.renew_every: timedelta | None = ttl / 3

    def acquire(self) -> bool:
        rows = Lease.objects.using(self.using)
        mine_or_free = Q(owner=self.node_id) | Q(expires_at__lt=Now())
        began = time.monotonic()
        updated = rows.filter(mine_or_free, name=self.lease).update(
            owner=self.node_id,
            expires_at=_expires_in(self.ttl),
            # Kept while we renew; restarted when we take the lease over.
            acquired_at=Case(
                When(owner=self.node_id, then=Coalesce(F("acquired_at"), Now())), default=Now()
            ),
        )
        if updated:
            if time.monotonic() - began < self.ttl.total_seconds() / 3:
                return True
            # The update waited on the row's lock (a leader stopped mid-round held it): its
            # expiry counts from the statement's start, before the wait, and may have passed.
            # Renewed now, while it is still ours.
            return bool(
                rows.filter(name=self.lease, owner=self.node_id).update(
                    expires_at=_expires_in(self.ttl)
                )
            )
        if not rows.filter(name=self.lease).exists():
            # First election on this database: create the row expired, then contend for it.
            try:
                with transaction.atomic(using=self.using):
                    rows.create(name=self.lease, owner="", expires_at=LONG_AGO)
            except IntegrityError:
                pass  # Another node created it first; contend for it as usual.
            return self.acquire()
        return False

    def fence(self, using: str) -> bool:
        # Checks and extends in one statement; the row lock it takes holds off a takeover
        # until the dispatch transaction commits.
        extended = (
            Lease.objects.using(using)
            .filter(name=self.lease, owner=self.node_id, expires_at__gt=Now())
            .update(expires_at=_expires_in(self.ttl))
        )
        return extended == 1

    def release(self) -> None:
        # Only the owner hands it back; the next node need not wait out the TTL.
        Lease.objects.using(self.using).filter(name=self.lease, owner=self.node_id).update(
            owner="", expires_at=LONG_AGO, acquired_at=None
        )


#: The ``application_name`` of an advisory leader's connection, its node's id after it.
LEADER_APPLICATION = "ultimat3_jobs scheduler leader"


def leader_application(node_id: str) -> str:
    """The ``application_name`` of node ``node_id``'s advisory leader connection (PostgreSQL
    keeps 63 bytes of it)."""
    return f"{LEADER_APPLICATION} {node_id}".strip()[:63]


class AdvisoryLeader:
    """``pg_try_advisory_lock`` on a connection this node owns, apart from Django's.

    Django closes its connections between rounds; a lock taken on one of those would vanish
    with it. Every round re-checks the lock in ``pg_locks``, which also notices a dead
    connection (a terminated backend, a restarted server) and concedes.
    """

    name = "advisory"
    renew_every: timedelta | None = None

    def __init__(self, *, key: int, using: str = "default", node_id: str = "") -> None:
        self.key = key
        self.using = using
        self.node_id = node_id
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._held = False

    def _connect(self) -> psycopg.Connection[Any]:
        # Named for its node: the status pages tell which node holds the lock from it.
        conn = dedicated_connection(self.using, leader_application(self.node_id))
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        self._pid = int(row[0]) if row else None
        return conn

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None
        self._pid = None

    def acquire(self) -> bool:
        try:
            if self._conn is None or self._conn.closed:
                self._drop()
                self._conn = self._connect()
            if self._held:
                row = self._conn.execute(_HOLDS_LOCK, self._lock_args(self._pid)).fetchone()
                self._held = bool(row and row[0])
            if not self._held:
                row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()
                self._held = bool(row and row[0])
            return self._held
        except psycopg.Error as error:
            # The connection, and with it the lock, is gone: concede and reconnect next round.
            emit(logger, "jobs.leader.connection-lost", logging.WARNING, **failure_fields(error))
            self._drop()
            return False

    def _lock_args(self, pid: int | None) -> list[int | None]:
        # A bigint key is stored as classid (high 32 bits) and objid (low 32 bits), objsubid 1.
        return [pid, (self.key >> 32) & 0xFFFFFFFF, self.key & 0xFFFFFFFF]

    def fence(self, using: str) -> bool:
        if not self._held or self._pid is None:
            return False
        with connections[using].cursor() as cursor:
            cursor.execute(_HOLDS_LOCK, self._lock_args(self._pid))
            row = cursor.fetchone()
        return bool(row and row[0])

    def release(self) -> None:
        if self._conn is not None and self._held:
            # A dead connection has released it already.
            with contextlib.suppress(psycopg.Error):
                self._conn.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        self._drop()


class RoundAdvisoryLeader:
    """The advisory lock of ``AdvisoryLeader``, for a process that runs one round and exits
    (``run_scheduler --once``): taken on the round's own connection rather than on one opened
    for it. A session's lock lives as long as the session, so the fence need not ask
    ``pg_locks``: the round's transaction runs on the connection that took it, or that
    connection is gone and the transaction with it: a connection and two statements fewer. The
    key is ``AdvisoryLeader``'s: a running scheduler and a ``--once`` never dispatch at the same
    time.
    """

    name = "advisory"
    renew_every: timedelta | None = None

    def __init__(self, *, key: int, using: str = "default") -> None:
        self.key = key
        self.using = using
        #: The session the lock was taken in (psycopg's connection under Django's).
        self._session: Any = None

    def _holds(self, using: str) -> bool:
        session = self._session
        return (
            session is not None and not session.closed and connections[using].connection is session
        )

    def acquire(self) -> bool:
        if self._holds(self.using):
            return True
        self._session = None
        connection = connections[self.using]
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [self.key])
                row = cursor.fetchone()
        except DatabaseError as error:
            emit(logger, "jobs.leader.connection-lost", logging.WARNING, **failure_fields(error))
            return False
        if row and row[0]:
            self._session = connection.connection
        return self._session is not None

    def fence(self, using: str) -> bool:
        return self._holds(using)

    def release(self) -> None:
        if self._holds(self.using):
            # A lost connection has released it already.
            with contextlib.suppress(DatabaseError), connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        self._session = None


#: Whether backend ``pid`` holds the advisory lock on (classid, objid).
_HOLDS_LOCK = """
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND pid = %s
      AND classid = %s AND objid = %s AND objsubid = 1
)
"""


def build_leader(
    kind: str | None, *, node_id: str, using: str = "default", once: bool = False
) -> LeaderElection:
    """The election ``kind`` names (or the settings/database default); ``once`` for a process
    that runs one round (``RoundAdvisoryLeader``)."""
    config = get_settings()
    vendor = connections[using].vendor
    kind = kind or config.leader or default_leader(vendor)
    if kind == "sole":
        return SoleLeader()
    if kind == "lease":
        return LeaseLeader(node_id=node_id, ttl=config.lease_ttl, using=using)
    problem = leader_problem(kind, vendor)
    if problem is not None:
        raise problem
    if once:
        return RoundAdvisoryLeader(key=config.advisory_lock_key, using=using)
    return AdvisoryLeader(key=config.advisory_lock_key, using=using, node_id=node_id)
