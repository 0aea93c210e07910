"""Sentry Crons check-ins: ``in_progress`` when a monitored occurrence fires, then ``ok`` or
``error`` once its jobs have ended (all succeeded, or one failed or was cancelled).

Neither the round nor the worker waits on Sentry: the scheduler hands the occurrences it fired
to ``CheckIns.opened`` after its commit, the worker the jobs it finished to ``ended`` after
theirs, and a thread of the process sends them, a batch at a time. The check-in id is derived
from the occurrence (``monitors.check_in_id``), so the worker that closes it need not hear from
the scheduler that opened it. Which worker closes it is the database's call
(``JobStore.close_occurrences``): the one whose statement inserts the occurrence's closing row.

An occurrence that does not fire (skipped for overlap, dropped by catch-up, paused) sends
nothing, which is what makes Sentry report it missed. Without the ``sentry`` extra, or without
a Sentry client (``sentry_sdk.init`` with a DSN), nothing is sent and nothing is asked of the
database; ``sentry_sdk`` is not even imported unless the project imports it.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections

from .conf import Settings, get_settings
from .errors import SentryBehindError
from .lifecycle import DATABASE_ERRORS
from .logs import emit, failure_fields
from .monitors import check_in_id, is_monitored, monitor_config, slug
from .registry import registry
from .store import ClosedOccurrence, Enqueued, FiredOccurrence, JobStore, store_for

if TYPE_CHECKING:
    from .handles import TaskHandle


logger = logging.getLogger("ultimat3_jobs.checkins")

#: Tries of a closing statement that failed with the database, a second apart, before its jobs
#: are given up (their occurrences then time out in Sentry).
CLOSE_TRIES = 3
#: Seconds ``close()`` waits for what is queued to be sent.
CLOSE_TIMEOUT = 5.0
#: Seconds the thread waits at most for the Sentry client's queue to drain before it hands
#: over more (``_Paced``); a Sentry that takes longer is behind, and check-ins are lost.
PACE_TIMEOUT = 30.0


def _found_present(
    fired: Sequence[FiredOccurrence], enqueued: Enqueued, watched: Mapping[str, Watched]
) -> Iterator[int]:
    """The ids of the jobs of monitored occurrences that a round found already there."""
    for occurrence in fired:
        if occurrence.task in watched:
            for planned in occurrence.jobs:
                found = enqueued.get(planned.key)
                if found is not None and not found[1]:
                    yield found[0]


def sentry_installed() -> bool:
    """Whether the ``sentry`` extra (``sentry-sdk``) is importable here."""
    return find_spec("sentry_sdk") is not None


def _sentry() -> Any:
    """``sentry_sdk`` once the project has imported it, else None. A project that never did
    has set up no client to send with, and a process that sends nothing does not load it."""
    return sys.modules.get("sentry_sdk")


def sending() -> bool:
    """Whether this process sends check-ins: the project set a Sentry client up."""
    sdk = _sentry()
    return sdk is not None and bool(sdk.get_client().is_active())


def deployment(client: Any) -> str:
    """What sets the check-ins ``client`` sends apart from another deployment's
    (``monitors.check_in_id``): its DSN and environment, which the scheduler and the workers
    of one deployment share."""
    options = client.options
    return f"{options.get('dsn') or ''}|{options.get('environment') or ''}"


def _capture_checkin(**fields: Any) -> None:
    from sentry_sdk.crons import capture_checkin  # Sent only with a client: loaded by then.

    capture_checkin(**fields)


class _Paced:
    """Check-ins handed to ``client`` at the pace its transport takes them: its queue holds
    ``transport_queue_size`` items (100 by default) and drops what comes past it, so after
    each half of that, counted over every batch the thread sends, the sender waits for the
    queue to drain, up to ``PACE_TIMEOUT``. From the check-ins thread alone: neither a round
    nor a job waits."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.every = max(1, int(client.options.get("transport_queue_size") or 100) // 2)
        self.deployment = deployment(client)
        self.sent = 0
        #: This batch found Sentry behind: it waits no more, what the client drops is lost.
        self.behind = False

    def capture(self, **fields: Any) -> None:
        if self.sent and self.sent % self.every == 0 and not self.behind:
            began = time.monotonic()
            _sentry().flush(timeout=PACE_TIMEOUT)
            if time.monotonic() - began >= PACE_TIMEOUT:
                self.behind = True
                behind = SentryBehindError(
                    f"Sentry took more than {PACE_TIMEOUT:g} s for {self.every} check-ins: "
                    "the client drops what its queue cannot hold",
                    fix="check the Sentry host's reach and latency from this one, or raise "
                    "the client's transport_queue_size",
                )
                emit(logger, "jobs.checkins.failed", logging.WARNING, **failure_fields(behind))
        _capture_checkin(**fields)
        self.sent += 1


@dataclass(frozen=True, slots=True)
class Watched:
    """A monitored task: its monitor's slug and the config its ``in_progress`` upserts."""

    slug: str
    config: dict[str, Any]


def watched_tasks(tasks: Iterable[TaskHandle], config: Settings) -> dict[str, Watched]:
    """The tasks that are Sentry monitors, by name: ``monitor=``, else ``SENTRY_CRONS``.

    A task Sentry cannot follow (more than one run a minute) is left out under
    ``SENTRY_CRONS``; ``manage.py check`` names it (``W012``).
    """
    configs: dict[str, tuple[str, dict[str, Any]]] = {}
    for handle in tasks:
        if not is_monitored(handle.monitor, default=config.sentry_crons):
            continue
        made = monitor_config(
            handle.schedule,
            handle.tz,
            handle.monitor,
            checkin_margin=config.sentry_checkin_margin,
            max_runtime=config.sentry_max_runtime,
        )
        if made is not None:
            configs[handle.name] = (slug(handle.name, handle.monitor), made)
    shared = Counter(made_slug for made_slug, _ in configs.values())
    watched = {}
    for name, (made_slug, made) in configs.items():
        if shared[made_slug] > 1 and "-" in name and made_slug == slug(name):
            # Its own dashes read as another's dots: a digest keeps the two monitors apart,
            # and a name without dashes keeps its slug.
            made_slug = slug(name, alike=True)
        watched[name] = Watched(made_slug, made)
    return watched


class CheckIns:
    """Sends the check-ins of the monitored tasks of one database, from a thread of its own.

    ``tasks`` defaults to the registry's; ``store`` to ``store_for(using)``. ``inline`` sends
    each batch in the calling thread instead, for tests that hold the database in a
    transaction of their own.
    """

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        store: JobStore | None = None,
        tasks: Sequence[TaskHandle] | None = None,
        inline: bool = False,
    ) -> None:
        self.using = using
        self._store = store
        self._tasks = list(tasks) if tasks is not None else None
        self.inline = inline
        self._cache: tuple[int, Settings, dict[str, Watched]] | None = None
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._paced: _Paced | None = None

    @property
    def store(self) -> JobStore:
        if self._store is None:
            self._store = store_for(self.using)
        return self._store

    def watched(self) -> dict[str, Watched]:
        """The monitored tasks, made again only when the declarations or settings change."""
        version = -1 if self._tasks is not None else registry.version
        config = get_settings()
        cached = self._cache
        if cached is None or cached[0] != version or cached[1] is not config:
            tasks = self._tasks if self._tasks is not None else registry.tasks()
            cached = self._cache = (version, config, watched_tasks(tasks, config))
        return cached[2]

    # -- what the roles hand over -----------------------------------------------------------------

    def opened(self, fired: Sequence[FiredOccurrence], enqueued: Enqueued | None = None) -> None:
        """A round committed ``fired``: their ``in_progress`` check-ins are sent (after it).

        Jobs ``enqueued`` did not create (a backfill enqueued the occurrence ahead) may have
        ended before the round: their occurrence is closed then, once opened.
        """
        # The client first: without one, a round of many tasks never walks them for monitors.
        if fired and sending() and self.watched():
            self._put(("opened", (fired, enqueued or {})))

    def ended(self, jobs: Iterable[tuple[int, str | None]]) -> None:
        """Jobs ``(id, key)`` finished for good (their finish committed): the occurrences whose
        last jobs they were are closed. Only keys of monitored tasks are looked at; a key of
        None leaves the job for the database to sort out."""
        if not sending():
            return
        watched = self.watched()
        if not watched:
            return
        # An occurrence key starts with its task's name, which holds no ":".
        ids = [job_id for job_id, key in jobs if key is None or key.partition(":")[0] in watched]
        if ids:
            self._put(("ended", ids))

    def flush(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Wait until what was handed over is sent (to the Sentry client); True if it was."""
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
        if not running:
            return True
        done = threading.Event()
        self._queue.put(("flush", done))
        return done.wait(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Send what is queued, stop the thread and flush the Sentry client: a role stopping."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._queue.put(("stop", None))
            thread.join(timeout)
        if sending():
            _sentry().flush(timeout=timeout)

    # -- the thread -------------------------------------------------------------------------------

    def _put(self, item: tuple[str, Any]) -> None:
        if self.inline:
            self._send([item])
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="ultimat3-checkins", daemon=True
                )
                self._thread.start()
        self._queue.put(item)

    def _run(self) -> None:
        try:
            while True:
                batch = [self._queue.get()]
                while True:  # Whatever else is waiting goes in the same batch.
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                self._send(batch)
                if any(kind == "stop" for kind, _ in batch):
                    return
        finally:
            connections.close_all()

    def _pacer(self) -> _Paced | None:
        """The pace of this thread's check-ins for the client set up now, if one is."""
        if not sending():
            return None
        client = _sentry().get_client()
        if self._paced is None or self._paced.client is not client:
            self._paced = _Paced(client)
        self._paced.behind = False
        return self._paced

    def _send(self, batch: list[tuple[str, Any]]) -> None:
        watched = self.watched()
        paced = self._pacer()
        ended: list[int] = []
        for kind, value in batch:
            if kind == "opened":
                fired, enqueued = value
                try:
                    if paced is not None:
                        self._open(fired, watched, paced)
                except Exception as error:  # Sentry's client must never stop the thread.
                    emit(logger, "jobs.checkins.failed", logging.WARNING, **failure_fields(error))
                ended.extend(_found_present(fired, enqueued, watched))
        ended += [job_id for kind, ids in batch if kind == "ended" for job_id in ids]
        if ended and paced is not None:
            self._close(ended, watched, paced)
        for kind, value in batch:
            if kind == "flush":
                value.set()

    def _open(
        self, fired: Sequence[FiredOccurrence], watched: dict[str, Watched], paced: _Paced
    ) -> None:
        for occurrence in fired:
            monitor = watched.get(occurrence.task)
            if monitor is None:
                continue
            check_in = check_in_id(occurrence.task, occurrence.occurrence, paced.deployment)
            paced.capture(
                monitor_slug=monitor.slug,
                check_in_id=check_in,
                status="in_progress",
                monitor_config=monitor.config,
            )
            if not occurrence.jobs:
                # Nothing to run: the occurrence ended as it fired.
                paced.capture(
                    monitor_slug=monitor.slug,
                    check_in_id=check_in,
                    status="ok",
                    duration=0.0,
                    monitor_config=monitor.config,
                )

    def _close(self, job_ids: list[int], watched: dict[str, Watched], paced: _Paced) -> None:
        for attempt in range(1, CLOSE_TRIES + 1):
            try:
                closed = self.store.close_occurrences(job_ids, tasks=watched)
                break
            except DATABASE_ERRORS as error:
                connections[self.using].close()
                emit(
                    logger,
                    "jobs.checkins.failed",
                    logging.WARNING,
                    jobs=len(job_ids),
                    attempt=attempt,
                    **failure_fields(error),
                )
                if attempt == CLOSE_TRIES:
                    return
                time.sleep(1.0)
        for row in closed:
            self._send_closed(row, watched, paced)

    def _send_closed(
        self, row: ClosedOccurrence, watched: dict[str, Watched], paced: _Paced
    ) -> None:
        monitor = watched.get(row.task)
        if monitor is None:
            return
        try:
            # With the monitor's config, as the ``in_progress`` has: should that one have been
            # lost, Sentry makes the monitor from this one rather than refusing it.
            paced.capture(
                monitor_slug=monitor.slug,
                check_in_id=check_in_id(row.task, row.occurrence, paced.deployment),
                status=row.status,
                duration=max((row.finished_at - row.started_at).total_seconds(), 0.0),
                monitor_config=monitor.config,
            )
        except Exception as error:
            emit(logger, "jobs.checkins.failed", logging.WARNING, **failure_fields(error))


__all__ = ["CheckIns", "Watched", "sentry_installed", "watched_tasks"]
