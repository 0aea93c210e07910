"""The relay role (``manage.py run_relay``): outbox rows handed to the engine that runs them.

A round writes a Celery task or another backend's Django Task as an outbox row, in its own
transaction (``outbox.py``). The relay locks a batch of them, oldest first (``SKIP LOCKED``,
so several relays share the work), sends each (``engines.py``), records the engine's id and
the time, and commits. A relay killed between sending and recording sends again: delivery is
at least once, and ``ExactlyOnceTask`` (``celery.py``) makes the effect exactly once.

Rows of an ``ExactlyOnceTask`` handed over more than ``RELAY_RESEND_AFTER`` ago and still not
done are sent again: a worker can lose a message between taking it and recording it unacked.

A failed send is one of three faults. The engine's service cannot be reached (a connection or
transport error, ``broker_down``, for two rows of one engine in a batch): the batch ends, the
rows stay first, the loop backs off (``jobs.relay.broker-down``); one row failing so while its
engine takes another of the batch broke on its own message, and waits out of the way as an
unknown task's does (``jobs.relay.send-waiting``). The engine refused this one row (its
arguments, its options, its message): the row fails with the engine's error and a fix
(``jobs.relay.refused``) and the batch goes on. The row's task is not known here
(``RelayTargetError``, a relay of the last release during a rolling deploy): the row waits out
of the way, ``RELAY_UNKNOWN_TASK_GRACE`` at most, for a relay that knows it, then fails. A
resend is never failed for either: it waits for the next ``RELAY_RESEND_AFTER``.

Wake-ups come from LISTEN/NOTIFY where the database has it (PostgreSQL), with polling as the
fallback; the first SIGTERM finishes the row in hand, commits and exits (``lifecycle``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, transaction

from . import clock as default_clock
from . import instruments, nodes, tasks_compat
from .conf import get_settings
from .engines import Sent, result_value, send
from .errors import (
    BrokerUnavailableError,
    RelaySendFailedError,
    RelayTargetError,
    UltimateError,
)
from .lifecycle import (
    BURST_GIVE_UP_AFTER,
    DATABASE_ERRORS,
    UNAVAILABLE_EXIT,
    Backoff,
    Lifecycle,
    database_away,
    listen,
    rest_heard,
)
from .listener import RELAY_PAYLOAD, Listener
from .logs import emit, failure_fields
from .models import Job, JobStatus
from .nodes import RunStatus, new_node_id
from .outbox import RESENDABLE, TASKS
from .retries import format_error, storable
from .store import JobStore, store_for

#: The TASKS backend whose rows are this app's own jobs, run by its workers and never relayed.
JOBS_BACKEND = "ultimat3_jobs.backends.JobsBackend"

logger = logging.getLogger("ultimat3_jobs.relay")

#: Rows locked and sent per transaction.
DEFAULT_BATCH = 100
#: How long a row whose task is unknown here is put off before a relay looks at it again
#: (never past the end of its grace).
TARGET_RETRY = timedelta(seconds=5)


@dataclass
class RelayStats:
    """Counters since ``run()`` started, logged with every ``jobs.relay.stats`` event."""

    sent: int = 0
    resent: int = 0
    refused: int = 0
    #: Rows put off because their task is unknown here, or a resend could not be made (once
    #: per look).
    waiting: int = 0
    broker_errors: int = 0
    by_relay: dict[str, int] = field(default_factory=dict)


class Relay:
    """Sends outbox rows until stopped; ``burst`` returns once nothing is left to send now.

    Durations default to the ``ULTIMAT3_JOBS`` settings; ``clock`` is injectable for tests, and
    ``store`` (default: ``store_for(using)``) too.
    """

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        batch: int = DEFAULT_BATCH,
        burst: bool = False,
        poll_interval: timedelta | None = None,
        resend_after: timedelta | None = None,
        stats_interval: timedelta = timedelta(seconds=60),
        results_interval: timedelta = timedelta(seconds=5),
        listen: bool = True,
        node_id: str | None = None,
        clock: Callable[[], datetime] | None = None,
        sender: Callable[[Job, str], Sent] = send,
        store: JobStore | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, not {batch}")
        config = get_settings()
        self.using = using
        self.store = store or store_for(using)
        self.batch = batch
        self.burst = burst
        self.poll_interval = poll_interval or config.worker_poll_interval
        self.resend_after = resend_after or config.relay_resend_after
        self.stuck_after = config.relay_stuck_after
        self.unknown_task_grace = config.relay_unknown_task_grace
        self.stats_interval = stats_interval
        self.results_interval = results_interval
        self.listen = listen
        self.node_id = node_id or new_node_id()
        self.clock = clock or default_clock.now
        self.sender = sender
        self.stats = RelayStats()
        self.life = Lifecycle("jobs.relay")
        self.node = nodes.Heartbeat(
            using=using,
            node_id=self.node_id,
            role="relay",
            every=config.heartbeat_interval,
            clock=self.clock,
            skew_warning=config.clock_skew_warning,
        )
        #: How far this relay's clock ran ahead of the database's at its last heartbeat: its
        #: claims take what is due less that, as a worker's do.
        self._ahead = timedelta(0)
        self.backoff = Backoff(self.poll_interval)
        #: False since the engine last could not be reached, until a pass goes through
        #: (``health.py``).
        self.broker_reachable = True
        self._listener: Listener | None = None
        self._results_after = 0
        #: What a burst gave up on (its last failed pass raised it); None otherwise.
        self.gave_up: BaseException | None = None

    @property
    def status(self) -> RunStatus:
        """Where the relay is in its life: idle, running, draining, stopped."""
        return self.life.status

    @property
    def failures(self) -> int:
        """Passes that failed in a row, now."""
        return self.backoff.failures

    # -- one pass -------------------------------------------------------------------------------

    def relay_once(self) -> int:
        """Lock one batch, send it, record it, commit; how many rows were handed over.

        A broker that cannot be reached (a second row of its engine failing so) ends the batch:
        what was sent is committed, the rest stays in the outbox, and
        ``BrokerUnavailableError`` tells the loop to back off; a first row failing so while
        its engine takes another of the batch is put off (``_send_failed``). A row the engine
        refuses fails alone, and one whose task is unknown here waits
        (``RELAY_UNKNOWN_TASK_GRACE``); the batch goes on past both.
        """
        now = self.clock() - self._ahead
        down: BrokerUnavailableError | None = None
        # The first row of each engine that failed as if the engine were down, until the batch
        # shows which it was: a second row failing so (down), or another row it took.
        suspects: dict[str, tuple[Job, BrokerUnavailableError]] = {}
        took: dict[str, Job] = {}
        handed = 0
        with transaction.atomic(using=self.using):
            rows = self.store.claim_outbox(
                limit=self.batch,
                now=now,
                resend=RESENDABLE,
                resend_before=now - self.resend_after,
            )
            for job in rows:
                if self.life.draining.is_set():
                    break  # Drain: what is recorded commits; the rest waits for the next relay.
                try:
                    # A backend that runs the task inside enqueue() writes in our transaction:
                    # a savepoint keeps a task's database error from breaking the batch.
                    inline = job.relay == TASKS
                    with transaction.atomic(using=self.using) if inline else nullcontext():
                        sent = self.sender(job, self.using)
                except BrokerUnavailableError as error:
                    if _engine(job) in suspects:
                        down = suspects.pop(_engine(job))[1]
                        break
                    suspects[_engine(job)] = (job, error)
                    continue
                except RelayTargetError as error:
                    self._target_unknown(job, error)
                    continue
                except UltimateError as error:
                    if job.status == JobStatus.RELAYED:
                        self._resend_later(job, error)
                    else:
                        self._refuse(job, error)
                    continue
                except DatabaseError as error:
                    if not inline:
                        raise
                    # The task ran, inside enqueue(), and failed on the database: it is done.
                    sent = Sent("", done=True, ok=False, error=format_error(error))
                self._record(job, sent)
                handed += 1
                took[_engine(job)] = job
            for engine, (suspect, failure) in suspects.items():
                if engine in took:
                    # The engine took another row: this one broke on its own message.
                    self._send_failed(suspect, failure, taken=took[engine])
                elif down is None:
                    down = failure  # Alone, it cannot be told from an outage.
        if down is not None:
            raise down
        return handed

    def check_results(self) -> int:
        """Ask the backends of relayed Django Tasks that can tell (``supports_get_result``)
        whether they finished; mark those done. How many were."""
        aliases = _reporting_backends()
        if not aliases:
            return 0
        done = (tasks_compat.TaskResultStatus.SUCCESSFUL, tasks_compat.TaskResultStatus.FAILED)
        finished = 0
        with transaction.atomic(using=self.using):
            rows = self.store.relayed_tasks(
                backends=aliases, after=self._results_after, limit=self.batch
            )
            # Round the table in id order, so rows still running never hide the ones after.
            self._results_after = rows[-1].pk if len(rows) == self.batch else 0
            for job in rows:
                try:
                    result = tasks_compat.task_backends[job.backend].get_result(job.engine_id)
                except Exception:
                    continue  # Unknown to it (yet): asked again next time.
                if result.status not in done:
                    continue
                ok = result.status == tasks_compat.TaskResultStatus.SUCCESSFUL
                errors = getattr(result, "errors", None) or []
                self.store.relayed_done(
                    job_id=job.pk,
                    now=self.clock(),
                    ok=ok,
                    return_value=result_value(result) if ok else None,
                    error="" if ok else (errors[-1].traceback if errors else "failed"),
                    name=job.name,
                )
                finished += 1
        return finished

    def _record(self, job: Job, sent: Sent) -> None:
        now = self.clock()
        self.store.record_relayed(job_id=job.pk, engine_id=sent.engine_id, now=now)
        if sent.done:
            self.store.relayed_done(
                job_id=job.pk,
                now=now,
                ok=sent.ok,
                return_value=sent.return_value,
                error=sent.error,
                name=job.name,
            )
        again = job.status == "relayed"
        self.stats.sent += 1
        self.stats.resent += again
        self.stats.by_relay[job.relay] = self.stats.by_relay.get(job.relay, 0) + 1
        emit(
            logger,
            "jobs.relay.resent" if again else "jobs.relay.sent",
            job_id=job.pk,
            key=job.key,
            name=job.name,
            relay=job.relay,
            engine_id=sent.engine_id,
            done=sent.done,
        )

    def _refuse(self, job: Job, error: UltimateError, *, given_up: str = "") -> None:
        """Fail ``job`` with ``error``; ``given_up`` says why the grace it had ran out."""
        fields = error.as_fields()
        if given_up:
            fields["error"] = (
                f"{error.message}; {given_up} within RELAY_UNKNOWN_TASK_GRACE "
                f"({self.unknown_task_grace.total_seconds():g} s)"
            )
        text = storable(f"{fields['error']} [{error.code}]\nfix: {error.fix}")
        self.store.relay_refused(job_id=job.pk, now=self.clock(), error=text)
        self.stats.refused += 1
        emit(logger, "jobs.relay.refused", logging.ERROR, job_id=job.pk, name=job.name, **fields)

    def _target_unknown(self, job: Job, error: RelayTargetError) -> None:
        """Put off a row whose task this relay cannot find, so the rows behind it go on: a
        relay of the new release may know it (a rolling deploy). Past the grace, fail it."""
        self._put_off(
            job,
            error,
            waiting="waiting for a relay that knows it",
            given_up="no relay knew it",
            event="jobs.relay.target-waiting",
        )

    def _send_failed(self, job: Job, error: BrokerUnavailableError, *, taken: Job) -> None:
        """Put off a row that failed as an outage would while its engine took ``taken`` in the
        same batch, so it holds up no other: tried again every ``TARGET_RETRY`` (a broker that
        was only away a moment takes it then), failed past the grace."""
        failed = RelaySendFailedError(
            f"{error.message}; the engine took job {taken.pk} in the same batch",
            fix="find what in this row's message the engine cannot take (larger than the "
            "broker's limit, such as Redis' proto-max-bulk-len or RabbitMQ's max_message_size; "
            "input the backend raises an OS error for) and change the entry, then retry the row",
            cause=error.cause,
        )
        self._put_off(
            job,
            failed,
            waiting="tried again",
            given_up="it failed each time",
            event="jobs.relay.send-waiting",
        )

    def _put_off(
        self, job: Job, error: UltimateError, *, waiting: str, given_up: str, event: str
    ) -> None:
        """Put off a row that cannot go now but holds up no other, ``TARGET_RETRY`` at a time
        for ``RELAY_UNKNOWN_TASK_GRACE`` from the first time; past it, fail it."""
        if job.status == JobStatus.RELAYED:
            self._resend_later(job, error)
            return
        now = self.clock()
        since = job.target_unknown_since or now
        deadline = since + self.unknown_task_grace
        if now >= deadline:
            self._refuse(job, error, given_up=given_up)
            return
        until = min(now + TARGET_RETRY, deadline)
        note = (
            f"{error.message}; {waiting} until "
            f"{deadline.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC, then failed"
        )
        self.store.relay_deferred(
            job_id=job.pk,
            until=until,
            since=since,
            error=storable(f"{note} [{error.code}]\nfix: {error.fix}"),
        )
        self.stats.waiting += 1
        emit(
            logger,
            event,
            logging.WARNING,
            job_id=job.pk,
            name=job.name,
            waited=(now - since).total_seconds(),
            grace=self.unknown_task_grace.total_seconds(),
            until=until.isoformat(),
            **error.as_fields(),
        )

    def _resend_later(self, job: Job, error: UltimateError) -> None:
        """A resend this relay cannot make (its task unknown here, or refused) is put off by
        ``RELAY_RESEND_AFTER``, never failed: the row was handed over once, its first message
        may still run, and a relay that can resends it."""
        until = self.clock() + self.resend_after
        self.store.relay_deferred(
            job_id=job.pk,
            until=until,
            since=None,
            error=storable(f"{error.message}; not resent [{error.code}]\nfix: {error.fix}"),
        )
        self.stats.waiting += 1
        emit(
            logger,
            "jobs.relay.resend-deferred",
            logging.WARNING,
            job_id=job.pk,
            name=job.name,
            until=until.isoformat(),
            **error.as_fields(),
        )

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Relay until stopped (or, with ``burst``, until nothing is left); exit status 0, or
        ``UNAVAILABLE_EXIT`` for a burst that gave up after ``BURST_GIVE_UP_AFTER`` failed
        passes in a row (its engine or its database away; ``gave_up`` says what was raised).

        One ``run()`` at a time: a second while the first runs is a ``RuntimeError``.
        """
        if not self.life.begin():
            raise RuntimeError(f"relay {self.node_id} is already running")
        self.life.hook(self.stop)
        if self.listen:
            self._listener = listen(
                "relay",
                store=self.store,
                queues=frozenset({RELAY_PAYLOAD}),
                wake=self.life.wake.set,
                retry_after=self.poll_interval.total_seconds(),
            )
        emit(
            logger,
            "jobs.relay.started",
            node=self.node_id,
            batch=self.batch,
            burst=self.burst,
            listen=self._listener is not None,
        )
        last_stats = last_results = 0.0
        try:
            while not self.life.draining.is_set():
                if self.node.due():
                    self._heartbeat()
                self.life.wake.clear()  # A NOTIFY during the pass below starts the next at once.
                if self._pass():
                    continue  # A full batch: more may be waiting, no pause between them.
                if self.burst and not self.backoff.failures:
                    break
                if self.burst and self.backoff.failures >= BURST_GIVE_UP_AFTER:
                    self.gave_up = self.backoff.last_error
                    break
                if time.monotonic() - last_results >= self.results_interval.total_seconds():
                    with contextlib.suppress(*DATABASE_ERRORS):
                        self.check_results()
                    last_results = time.monotonic()
                if time.monotonic() - last_stats >= self.stats_interval.total_seconds():
                    self.log_stats()
                    last_stats = time.monotonic()
                if self.backoff.failures:
                    # Not cut short by a NOTIFY (rows keep coming while a broker is down): only
                    # a drain ends the backoff.
                    if database_away(self.backoff.last_error):
                        self.life.draining.wait(self.backoff.rest())
                    else:
                        rest_heard(
                            self.life.draining.wait, self.backoff.rest(), self.node, self._heartbeat
                        )
                else:
                    rest_heard(self.life.rest, self.backoff.rest(), self.node, self._heartbeat)
        finally:
            if self._listener is not None:
                self._listener.stop()
                self._listener = None
            self.log_stats()
            with contextlib.suppress(*DATABASE_ERRORS):
                self.node.stopped()
            emit(logger, "jobs.relay.stopped", node=self.node_id, sent=self.stats.sent)
            self.life.end()
        return 0 if self.gave_up is None else UNAVAILABLE_EXIT

    def _pass(self) -> bool:
        """One batch, its failure counted and logged; whether it was full (more may wait)."""
        try:
            handed = self.relay_once()
        except BrokerUnavailableError as error:
            self.broker_reachable = False
            self.stats.broker_errors += 1
            instruments.broker_unavailable()
            fields = self.backoff.failed(error)
            emit(
                logger,
                "jobs.relay.broker-down",
                logging.WARNING,
                broker_errors=self.stats.broker_errors,
                **fields,
            )
            return False
        except DATABASE_ERRORS as error:
            emit(logger, "jobs.relay.database-error", logging.WARNING, **self.backoff.failed(error))
            return False
        except Exception as error:
            # A bug or an engine's surprise must not stop the relay: the batch rolled back, its
            # rows wait in the outbox, and the next pass tries again.
            emit(logger, "jobs.relay.loop-failed", logging.ERROR, **self.backoff.failed(error))
            return False
        instruments.relayed(handed)
        # Nothing this pass gave the engine failed to reach it: rows taken, or none left to give
        # (another relay sent them once the broker was back).
        self.broker_reachable = True
        failures = self.backoff.succeeded()
        if failures:
            emit(logger, "jobs.relay.recovered", failures=failures)
        return handed >= self.batch

    def stop(self, reason: str = "stop") -> None:
        """Finish the row in hand, commit, and return from ``run()``."""
        # A relay that is not running has nothing to drain.
        if self.life.status == "running" and self.life.drain(reason):
            emit(logger, "jobs.relay.draining", reason=reason)

    def _heartbeat(self) -> None:
        failures = self.backoff.failures
        try:
            skew_ms = self.node.compare_clocks()
            self._ahead = timedelta(milliseconds=max(skew_ms, 0))
            last_error = f"{failures} failed passes" if failures else ""
            self.node.beat(last_error=last_error, clock_skew_ms=skew_ms)
        except DATABASE_ERRORS as error:
            emit(logger, "jobs.relay.heartbeat-failed", logging.WARNING, **failure_fields(error))

    def counts(self) -> dict[str, int]:
        """The outbox by state, ``stuck`` being relayed rows not done after RELAY_STUCK_AFTER."""
        return self.store.relay_counts(stuck_before=self.clock() - self.stuck_after)

    def log_stats(self) -> None:
        """``jobs.relay.stats``: this relay's counters and the outbox's rows by state."""
        try:
            counts = self.counts()
        except DATABASE_ERRORS as error:
            counts = {"error": 1}
            emit(logger, "jobs.relay.stats-failed", logging.WARNING, error=format_error(error))
        emit(
            logger,
            "jobs.relay.stats",
            sent=self.stats.sent,
            resent=self.stats.resent,
            refused=self.stats.refused,
            waiting=self.stats.waiting,
            broker_errors=self.stats.broker_errors,
            by_relay=self.stats.by_relay,
            **{f"rows_{name}": value for name, value in counts.items()},
        )


def _engine(job: Job) -> str:
    """Which engine ``job``'s row goes to: the Celery app's broker, or a Tasks backend's
    alias. A row that went through says only that its own engine is up."""
    return f"tasks:{job.backend}" if job.relay == TASKS else "celery"


def _reporting_backends() -> list[str]:
    """The ``TASKS`` aliases whose backend can say whether a relayed task finished.

    ``TASKS`` is read first: a project without other Django Tasks backends (with only the
    ``celery`` extra installed, say) never touches the Django Tasks framework here.
    """
    configured = getattr(settings, "TASKS", None) or {}
    others = [
        alias
        for alias, options in configured.items()
        if (options or {}).get("BACKEND") != JOBS_BACKEND
    ]
    if not others or not tasks_compat.AVAILABLE:
        return []
    aliases = []
    for alias in others:
        with contextlib.suppress(Exception):
            if tasks_compat.task_backends[alias].supports_get_result:
                aliases.append(alias)
    return aliases


__all__ = ["Relay", "RelayStats"]
