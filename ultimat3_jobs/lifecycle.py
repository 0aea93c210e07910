"""What the scheduler, the worker and the relay share from start to stop.

A role's own work is one pass: a round, a claim, a batch sent. Around it every role lives the
same life, written here once:

- ``Lifecycle``: the status an operator reads, the drain the first SIGTERM/SIGINT begins (the
  second exits at once, ``shutdown``), and the rest between two passes that a wake-up (a
  NOTIFY, a job ending, a stop) cuts short;
- ``Backoff``: a pass that failed rests longer before the next, doubling up to a cap
  (``retries.loop_backoff``), and a connection a database failure broke is dropped so the next
  pass opens a fresh one;
- ``listen``: LISTEN where the database can, polling alone where it cannot.

The node row each role keeps alive is ``nodes.Heartbeat``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError, close_old_connections, connections
from django.db.backends.signals import connection_created

from . import shutdown
from .db import hung_up
from .listener import Listener
from .logs import failure_fields
from .nodes import Heartbeat, RunStatus
from .retries import loop_backoff

if TYPE_CHECKING:
    from .store import JobStore

#: What a pass raises when the database is away: retried with backoff, never fatal.
DATABASE_ERRORS = (DatabaseError, InterfaceError)
#: Exit status of a burst (``run_worker``, ``run_relay``) that gave up on what it could not
#: reach: it has no later to wait for.
UNAVAILABLE_EXIT = 3
#: Failed passes in a row after which a burst gives up.
BURST_GIVE_UP_AFTER = 3


class Lifecycle:
    """One role's run: its status, its drain, and the events its threads wait on.

    ``name`` is what the role registers with ``shutdown`` (``jobs.worker``...). Without
    ``drain_on_shutdown`` no signal is hooked: the owner (a test, an embedding) stops it.
    """

    def __init__(self, name: str, *, drain_on_shutdown: bool = True) -> None:
        self.name = name
        self.drain_on_shutdown = drain_on_shutdown
        self.status: RunStatus = "idle"
        #: Set to cut the rest between two passes short.
        self.wake = threading.Event()
        #: Set once the drain began; never cleared before the next ``begin``.
        self.draining = threading.Event()
        #: Clear while running or draining: ``wait`` returns once the role has stopped.
        self.stopped = threading.Event()
        self.stopped.set()
        #: Why the drain began (a signal's name, ``stop``...), and when (``time.monotonic``).
        self.reason = ""
        self.drain_started = 0.0
        self._lock = threading.Lock()
        self._release: Callable[[], None] | None = None

    def begin(self) -> bool:
        """Running, from a standstill only: False, and nothing changed, if it runs already."""
        with self._lock:
            if self.status in ("running", "draining"):
                return False
            self.status = "running"
            self.reason = ""
            self.wake.clear()
            self.draining.clear()
            self.stopped.clear()
        return True

    def hook(self, stop: Callable[[str], None]) -> None:
        """Call ``stop(signal_name)`` on the first SIGTERM/SIGINT, until ``end``.

        Only the main thread can install signal handlers: a role begun in another thread is
        stopped by its owner.
        """
        if self.drain_on_shutdown and self._release is None:
            self._release = shutdown.on_shutdown(self.name, stop)

    def drain(self, reason: str) -> bool:
        """Begin the stop: the status reads draining and the rest is cut short. True for the
        call that began it; a role already draining or stopped is left as it is."""
        with self._lock:
            began = self.status in ("idle", "running")
            if began:
                self.status = "draining"
                self.reason = reason
                self.drain_started = time.monotonic()
                self.draining.set()
                self.stopped.clear()  # Drained from idle (a round ticked by hand): not yet.
        self.wake.set()
        return began

    def end(self) -> None:
        """Stopped: the signal handed back, every ``wait`` answered."""
        if self._release is not None:
            self._release()
            self._release = None
        with self._lock:
            self.status = "stopped"
        self.stopped.set()

    def rest(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a wake-up; True if one came."""
        return self.wake.wait(max(0.0, seconds))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped; True if it is."""
        return self.stopped.wait(timeout)


class Backoff:
    """Passes that failed in a row, and the rest they earn: ``interval`` after a pass that went
    through, doubling from it after each failure, capped (``retries.loop_backoff``)."""

    def __init__(self, interval: timedelta) -> None:
        self.interval = interval
        self.failures = 0
        #: What the last failed pass raised.
        self.last_error: BaseException | None = None

    def failed(self, error: BaseException) -> dict[str, Any]:
        """Count one more failed pass; its log fields, with ``failures`` and ``retry_in``.

        A database failure leaves its connection unusable: it is dropped here, so the next pass
        reconnects rather than failing again on the broken one.
        """
        self.failures += 1
        self.last_error = error
        if isinstance(error, DATABASE_ERRORS):
            close_old_connections()
        return {"failures": self.failures, "retry_in": self.rest(), **failure_fields(error)}

    def succeeded(self) -> int:
        """A pass went through: the failures before it, forgotten (0 if there were none)."""
        failures, self.failures = self.failures, 0
        return failures

    def rest(self) -> float:
        """Seconds to rest before the next pass."""
        return loop_backoff(self.interval, self.failures).total_seconds()


def rest_heard(
    wait: Callable[[float], bool], seconds: float, node: Heartbeat, beat: Callable[[], None]
) -> bool:
    """Wait up to ``seconds`` by ``wait`` (a role's ``rest``, cut short by a wake-up, or its
    ``draining.wait``, by a drain alone), calling ``beat`` each time ``node``'s heartbeat falls
    due meanwhile; True if the wait was cut short. A rest longer than ``HEALTH_TICKS``
    heartbeats (a long poll interval, a backoff while a broker or a lock holds the loop up)
    must not read as a dead loop to the health checks."""
    end = time.monotonic() + max(0.0, seconds)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return False
        if wait(min(left, node.until_due())):
            return True
        if node.due():
            beat()


def database_away(error: BaseException | None) -> bool:
    """Whether ``error`` says the database cannot be reached: a loop backing off from it
    writes no heartbeat meanwhile, whose connection attempt could hold a drain up to the
    connect timeout; its next pass tries."""
    return error is not None and failure_fields(error)["code"] == "jobs.database-unavailable"


def listen(
    role: str,
    *,
    store: JobStore,
    queues: frozenset[str] | None,
    wake: Callable[[], None],
    retry_after: float,
) -> Listener | None:
    """A started LISTEN for ``role``, or None where the database cannot LISTEN (only
    PostgreSQL can): there, polling alone finds the work."""
    if not store.notifies:
        return None
    started = Listener(
        role=role, using=store.using, queues=queues, wake=wake, retry_after=retry_after
    )
    started.start()
    return started


#: Connections Django opened in this process so far (``connection_created``). A database
#: restart has every loop open a new one before it claims again: a thread then looks for a
#: hang-up on its own connections before its next job (``drop_broken_connections``). A look at
#: every job hands the GIL to another thread, and cost the worker about a fifth of its no-op
#: rate.
_opened = 0
_seen = threading.local()
#: Seconds after which a thread looks again whatever was opened: a lone backend terminated
#: (``pg_terminate_backend``, ``idle_session_timeout``) reconnects nothing else. Once a second
#: cost nothing measurable (README, "Figures").
HANG_UP_LOOK_EVERY = 1.0


def _count_opened(**kwargs: Any) -> None:
    global _opened
    _opened += 1  # A lost increment between two threads still changes the count.


connection_created.connect(_count_opened, dispatch_uid="ultimat3_jobs.lifecycle.opened")


def drop_broken_connections() -> None:
    """Close this thread's connections that errored and can no longer be used, and those the
    server hung up on while they sat idle (``db.hung_up``: a database restart, a terminated
    backend), so the next job opens a new one rather than failing on the dead one. It looks
    for a hang-up once another connection was opened since this thread last looked, or
    ``HANG_UP_LOOK_EVERY`` seconds after its last look.

    Unlike ``close_old_connections`` it leaves a working connection open whatever its age, so
    a thread running one job after another does not reconnect for each.
    """
    opened, now = _opened, time.monotonic()
    look = (
        getattr(_seen, "opened", None) != opened
        or now - getattr(_seen, "at", 0.0) >= HANG_UP_LOOK_EVERY
    )
    if look:
        _seen.opened, _seen.at = opened, now
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.errors_occurred:
            if not connection.is_usable():
                connection.close()
                continue
            connection.errors_occurred = False
        if look and hung_up(connection):
            connection.close()


__all__ = [
    "DATABASE_ERRORS",
    "Backoff",
    "Lifecycle",
    "database_away",
    "drop_broken_connections",
    "listen",
    "rest_heard",
]
