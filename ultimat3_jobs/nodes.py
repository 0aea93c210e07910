"""The node table: one heartbeat writer for schedulers, workers and relays, on the database clock.

A worker's jobs are recovered when its heartbeat goes stale and the admin judges a scheduler
by its last round; both compare against the database clock, so every heartbeat is written
with it (``Now()``) rather than with whichever clock the writing node keeps.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import IntegrityError, connections
from django.db.models.functions import Now

from . import clock as default_clock
from .db import database_now
from .logs import emit
from .models import Node

Role = Literal["scheduler", "worker", "relay"]
#: Where a scheduler, a worker or a relay is in its life: running, draining, stopped.
RunStatus = Literal["idle", "running", "draining", "stopped"]

#: A clock that stays skewed is warned about again this often.
SKEW_WARNING_EVERY = timedelta(minutes=1)
#: What a draining node's heartbeat says in ``last_error`` (then why: the signal, the reason):
#: alive, its jobs still running, and not ready for more.
DRAINING = "draining"


def new_node_id() -> str:
    """A node id that tells an operator where the process runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def heartbeat(
    *,
    using: str,
    node_id: str,
    role: Role,
    started_at: datetime,
    first: bool = False,
    **fields: Any,
) -> None:
    """Record that ``node_id`` is alive now, with ``fields`` (``last_error``, ``is_leader``...).

    One UPDATE once the row exists, and an INSERT for a row missing (deleted in the admin).
    ``first``: the process's first heartbeat, whose row is new since node ids name processes:
    outside a transaction it is one INSERT, and a row already there under this id (an INSERT
    whose reply was lost) is then brought up to date by the UPDATE.
    """
    rows = Node.objects.using(using)

    def create() -> None:
        rows.create(
            node_id=node_id,
            role=role,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=started_at,
            last_seen_at=Now(),
            **fields,
        )

    # Inside a caller's transaction a refused INSERT would spoil it: the UPDATE comes first.
    if first and not connections[using].in_atomic_block:
        try:
            create()
            return
        except IntegrityError:
            pass
    if rows.filter(node_id=node_id).update(**{"last_seen_at": Now(), "stopped_at": None, **fields}):
        return
    create()


def stopped(*, using: str, node_id: str, **fields: Any) -> None:
    """Mark ``node_id`` stopped: its row stays for the admin, never counted live again."""
    Node.objects.using(using).filter(node_id=node_id).update(stopped_at=Now(), **fields)


class Heartbeat:
    """One node's row, kept fresh by the role that runs it: who it is, held once, and when it
    is due to say it is alive again (every ``every``).

    ``skew_warning``: for a role that plans from its own clock (the scheduler computes
    occurrences from it), ``compare_clocks`` measures that clock against the database's, which
    judges leases and staleness, and warns past the threshold.
    """

    def __init__(
        self,
        *,
        using: str,
        node_id: str,
        role: Role,
        every: timedelta,
        clock: Callable[[], datetime] | None = None,
        skew_warning: timedelta | None = None,
    ) -> None:
        self.using = using
        self.node_id = node_id
        self.role: Role = role
        self.every = every
        self.clock = clock or default_clock.now
        self.skew_warning = skew_warning
        self.started_at = self.clock()
        self._next = 0.0
        #: ``time.monotonic()`` of the last heartbeat tried (written or failed, not one still in
        #: flight), and of the last one written: what a health probe reads (``health.py``).
        self.attempted: float | None = None
        self.written: float | None = None
        self._skew_warned: float | None = None
        self._logger = logging.getLogger(f"ultimat3_jobs.{role}")

    def due(self) -> bool:
        """Whether ``every`` has passed since the last heartbeat written (or none was)."""
        return time.monotonic() >= self._next

    def until_due(self) -> float:
        """Seconds until the next heartbeat is due; 0 when it is."""
        return max(0.0, self._next - time.monotonic())

    def beat(self, **fields: Any) -> None:
        """Write the heartbeat now, with ``fields``; the next is due ``every`` from now.

        Due again ``every`` from now even when the write fails (it raises): a database that is
        down is asked once an interval, not on every pass of a loop that keeps failing. Counted
        as tried once it ends: a probe that comes while it is being written (a database slow to
        answer, SQLite waiting for another process's write) sees the last one, not a failure.
        """
        moment = time.monotonic()
        self._next = moment + self.every.total_seconds()
        try:
            heartbeat(
                using=self.using,
                node_id=self.node_id,
                role=self.role,
                started_at=self.started_at,
                first=self.written is None,
                **fields,
            )
            self.written = moment
        finally:
            self.attempted = moment

    def compare_clocks(self) -> int:
        """This node's clock minus the database's, in milliseconds.

        Past ``skew_warning`` it is warned about when it first goes past the threshold, then at
        most once every ``SKEW_WARNING_EVERY``.
        """
        skew = self.clock() - database_now(self.using)
        threshold = self.skew_warning
        if threshold is not None and abs(skew) > threshold:
            moment = time.monotonic()
            warned = self._skew_warned
            if warned is None or moment - warned >= SKEW_WARNING_EVERY.total_seconds():
                emit(
                    self._logger,
                    f"jobs.{self.role}.clock-skew",
                    logging.WARNING,
                    node=self.node_id,
                    skew_ms=int(skew.total_seconds() * 1000),
                    fix="run NTP (chrony, systemd-timesyncd) on this host and the database "
                    "host; occurrences are computed from this node's clock",
                )
                self._skew_warned = moment
        else:
            self._skew_warned = None
        return int(skew.total_seconds() * 1000)

    def stopped(self, **fields: Any) -> None:
        """Mark this node stopped, with ``fields``. A node that never wrote its row writes it
        now, stopped, in one statement: ``run_scheduler --once`` keeps its one heartbeat for
        this (``DatabaseState``)."""
        if self.written is None:
            self.beat(stopped_at=Now(), **fields)
        else:
            stopped(using=self.using, node_id=self.node_id, **fields)
