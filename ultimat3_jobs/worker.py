"""The worker role: threads that run claimed jobs, the claiming loop, drain and stop.

Job rows change only through ``jobstore``, retry timing comes from ``retries``, wake-ups
from ``listener``, heartbeats go through ``nodes``: this module holds no SQL.

The thread that calls ``run()`` is the dispatcher: it claims jobs in batches sized to the idle
job threads and hands them over. It alone heartbeats and recovers the jobs of dead workers, so
a long job can stall neither. The first SIGTERM stops claiming and waits for the jobs in flight
(bounded by a grace period); the second exits at once.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    DataError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)

from . import clock as default_clock
from . import jobstore, metrics, nodes, shutdown
from .conf import get_settings, stale_after_problem
from .jobstore import Recovered
from .listener import Listener
from .logs import emit, failure_fields
from .models import Job
from .nodes import RunStatus, new_node_id
from .registry import registry
from .retries import format_error, loop_backoff, retry_delay, storable

logger = logging.getLogger("ultimat3_jobs.worker")

Outcome = Literal["succeeded", "retrying", "failed", "lost"]

#: Exit status of a clean stop: every job in flight finished.
CLEAN_EXIT = 0
#: Exit status when the drain ran out of grace and jobs in flight went back to the queue.
ABANDONED_EXIT = shutdown.FORCED_EXIT
#: Exit status of a burst worker that gave up on an unreachable database.
UNAVAILABLE_EXIT = 3
#: Failed passes in a row after which a burst worker gives up: it has no later to wait for.
BURST_GIVE_UP_AFTER = 3


class Worker:
    """Claims due jobs and runs them in ``concurrency`` threads until stopped.

    ``burst`` returns once nothing is due and nothing runs; ``max_jobs`` stops claiming after
    that many. Durations default to the ``ULTIMAT3_JOBS`` settings; ``clock`` and ``rand`` are
    injectable for tests.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: timedelta | None = None,
        heartbeat_interval: timedelta | None = None,
        stale_after: timedelta | None = None,
        drain_grace: timedelta | None = None,
        backoff_base: float | None = None,
        backoff_max: timedelta | None = None,
        listen: bool = True,
        using: str = DEFAULT_DB_ALIAS,
        node_id: str | None = None,
        clock: Callable[[], datetime] | None = None,
        rand: Callable[[], float] | None = None,
        drain_on_shutdown: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, not {max_jobs}")
        config = get_settings()
        self.queues = frozenset(queues) if queues else None
        self.concurrency = concurrency
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = poll_interval or config.worker_poll_interval
        self.heartbeat_interval = heartbeat_interval or config.heartbeat_interval
        self.stale_after = stale_after or config.worker_stale_after
        self.drain_grace = drain_grace if drain_grace is not None else config.worker_drain_grace
        self.backoff_base = backoff_base if backoff_base is not None else config.retry_backoff_base
        self.backoff_max = backoff_max or config.retry_backoff_max
        self.listen = listen
        self.using = using
        self.node_id = node_id or new_node_id()
        self.clock = clock or default_clock.now
        self.rand = rand or random.random
        self.drain_on_shutdown = drain_on_shutdown
        problem = stale_after_problem(self.stale_after, self.heartbeat_interval)
        if problem is not None:
            raise problem
        self.status: RunStatus = "idle"
        self.exit_code: int | None = None
        self.last_error = ""
        #: Jobs claimed since ``run()`` started, and how those that finished ended.
        self.claimed = 0
        self.outcomes: dict[Outcome, int] = {"succeeded": 0, "retrying": 0, "failed": 0, "lost": 0}
        self._lock = threading.Lock()
        self._in_flight: dict[int, Job] = {}
        self._inbox: queue.Queue[Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._wake = threading.Event()
        self._draining = threading.Event()
        self._abandoned = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._drain_started = 0.0
        self._drain_reason = ""
        self._listener: Listener | None = None
        self._release_hook: Callable[[], None] | None = None
        self._gave_up = False
        self._started_at = self.clock()

    # -- the job table ----------------------------------------------------------------------

    def claim(self, limit: int) -> list[Job]:
        """Mark up to ``limit`` due jobs running on this node, oldest ``run_at`` first."""
        return jobstore.claim(
            using=self.using, worker=self.node_id, limit=limit, now=self.clock(), queues=self.queues
        )

    def execute(self, job: Job) -> Outcome:
        """Run one claimed job and record how it ended."""
        if job.backend:
            return self._execute_django_task(job)
        handle = registry.get_job(job.name)
        started = time.monotonic()
        if handle is None:
            # Retrying cannot help: this code does not know the job. Fail it now, loudly.
            message = (
                f'job "{job.name}" is not registered in this worker; fix: deploy the code that '
                "declares it with @job, and check that its app is in INSTALLED_APPS, then "
                "retry the job from the admin"
            )
            return self._failed(job, message, started, retry=False, fields={"error": message})
        try:
            handle.func(**job.input)
        except BaseException as error:
            return self._failed(
                job, format_error(error), started, retry=True, fields=failure_fields(error)
            )
        return self._finish(
            job,
            "succeeded",
            started,
            lambda: jobstore.succeed(
                using=self.using, job_id=job.pk, worker=self.node_id, now=self.clock()
            ),
        )

    def _execute_django_task(self, job: Job) -> Outcome:
        """A Django Task's row: one run, no retry; its return value or ``TaskError`` kept."""
        from . import backends

        started = time.monotonic()
        run = backends.run_task(job)
        using, job_id, node, now = self.using, job.pk, self.node_id, self.clock()
        if run.error is None:
            outcome = self._finish(
                job,
                "succeeded",
                started,
                lambda: jobstore.task_succeeded(
                    using=using, job_id=job_id, worker=node, now=now, return_value=run.return_value
                ),
            )
        else:
            outcome = self._finish(
                job,
                "failed",
                started,
                lambda: jobstore.task_failed(
                    using=using,
                    job_id=job_id,
                    worker=node,
                    now=now,
                    error=run.message,
                    error_class=run.error_class,
                    tb=run.traceback,
                ),
                log=failure_fields(run.error),
            )
        if outcome != "lost":
            backends.finished(run, now=now)
        return outcome

    def _failed(
        self, job: Job, text: str, started: float, *, retry: bool, fields: dict[str, Any]
    ) -> Outcome:
        using, job_id, node = self.using, job.pk, self.node_id
        text = storable(text)

        def recorded(write: Callable[[str], bool]) -> Callable[[], bool]:
            def attempt() -> bool:
                try:
                    return write(text)
                except DataError:
                    # The database refused the message itself: the outcome must still land.
                    return write(f"the error of this attempt could not be stored ({job.name})")

            return attempt

        if retry and job.attempts < job.max_attempts:
            delay = retry_delay(
                job.attempts, base=self.backoff_base, cap=self.backoff_max, rand=self.rand
            )
            run_at = self.clock() + delay
            return self._finish(
                job,
                "retrying",
                started,
                recorded(
                    lambda error: jobstore.retry(
                        using=using, job_id=job_id, worker=node, run_at=run_at, error=error
                    )
                ),
                log={"retry_at": run_at, **fields},
            )
        return self._finish(
            job,
            "failed",
            started,
            recorded(
                lambda error: jobstore.fail(
                    using=using, job_id=job_id, worker=node, now=self.clock(), error=error
                )
            ),
            log=fields,
        )

    def _finish(
        self,
        job: Job,
        outcome: Outcome,
        started: float,
        write: Callable[[], bool],
        *,
        log: dict[str, Any] | None = None,
    ) -> Outcome:
        duration_ms = round((time.monotonic() - started) * 1000, 1)
        if not self._record(job, write):
            # Recovered by another worker (our heartbeat went stale) or cancelled meanwhile:
            # its row is no longer ours to write.
            outcome = "lost"
        metrics.job_finished(job.name, job.queue, outcome, duration_ms / 1000)
        level = {"succeeded": logging.INFO, "failed": logging.ERROR}.get(outcome, logging.WARNING)
        emit(
            logger,
            f"jobs.worker.job-{outcome}",
            level,
            job=job.pk,
            name=job.name,
            queue=job.queue,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            duration_ms=duration_ms,
            **(log or {}),
        )
        with self._lock:
            self.outcomes[outcome] += 1
        return outcome

    def _record(self, job: Job, write: Callable[[], bool]) -> bool:
        """Write a job's outcome if the row is still ours; retry while the database is away."""
        delay = 0.05
        while True:
            try:
                return write()
            except (OperationalError, InterfaceError) as error:
                # The job ran; losing its outcome would run it again. Keep trying until the
                # drain gives up on this job, which then goes back to the queue.
                if self._abandoned.is_set():
                    raise
                emit(
                    logger,
                    "jobs.worker.record-failed",
                    logging.WARNING,
                    job=job.pk,
                    **failure_fields(error),
                )
                close_old_connections()
                time.sleep(delay)
                delay = min(delay * 2, self.poll_interval.total_seconds())

    def heartbeat(self) -> None:
        """Record that this node is alive, by the database clock that judges staleness."""
        nodes.heartbeat(
            using=self.using,
            node_id=self.node_id,
            role="worker",
            started_at=self._started_at,
            last_error=self.last_error,
        )

    def recover(self) -> Recovered:
        """Return the running jobs of workers that stopped heartbeating to the queue."""
        recovered = jobstore.recover(
            using=self.using, stale_after=self.stale_after, now=self.clock()
        )
        if recovered.requeued or recovered.failed:
            emit(
                logger,
                "jobs.worker.recovered",
                logging.WARNING,
                requeued=recovered.requeued,
                failed=recovered.failed,
                jobs=list(recovered.jobs),
            )
        return recovered

    # -- threads ----------------------------------------------------------------------------

    def _job_thread(self) -> None:
        try:
            while True:
                try:
                    job = self._inbox.get(timeout=self.poll_interval.total_seconds())
                except queue.Empty:
                    # Idle: let Django's rules (CONN_MAX_AGE) close the connection, as the end
                    # of a request would. Closing it after every job instead cost a new
                    # connection per job while busy, a third of the throughput.
                    close_old_connections()
                    continue
                if job is None:
                    return
                try:
                    _drop_broken_connections()
                    self.execute(job)
                except Exception as error:
                    emit(
                        logger,
                        "jobs.worker.record-failed",
                        logging.ERROR,
                        job=job.pk,
                        **failure_fields(error),
                    )
                finally:
                    with self._lock:
                        self._in_flight.pop(job.pk, None)
                    self._wake.set()
        finally:
            connections.close_all()

    @property
    def listening(self) -> bool:
        """Whether a LISTEN connection is up now (PostgreSQL); polling covers the rest."""
        return self._listener is not None and self._listener.listening.is_set()

    def in_flight(self) -> list[int]:
        """Ids of the jobs this worker is running now."""
        with self._lock:
            return sorted(self._in_flight)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Claim and run jobs until stopped (or, in burst mode, until nothing is due).

        Returns the exit status: ``CLEAN_EXIT`` when every job in flight finished,
        ``ABANDONED_EXIT`` when the drain grace ran out and they went back to the queue.
        """
        self._begin()
        return self._serve()

    def start(self) -> threading.Thread:
        """``run()`` in a thread of its own; ``stop()`` drains it."""
        self._begin()

        def serve() -> None:
            try:
                self._serve()
            finally:
                connections.close_all()

        thread = threading.Thread(target=serve, name="ultimat3-worker", daemon=True)
        thread.start()
        return thread

    def _begin(self) -> None:
        with self._lock:
            if self.status in ("running", "draining"):
                raise RuntimeError(f"worker {self.node_id} is already running")
            self.status = "running"
            self.exit_code = None
            self.claimed = 0
            self._stopped.clear()
            self._abandoned.clear()
            self._draining.clear()
            self._drain_reason = ""
            self._gave_up = False
            self._wake.clear()

    def stop(self, reason: str = "stop", *, wait: bool = True) -> None:
        """Stop claiming and let the jobs in flight finish, within the drain grace."""
        with self._lock:
            first = self.status == "running" and not self._draining.is_set()
            if first:
                self.status = "draining"
                self._drain_started = time.monotonic()
                self._drain_reason = reason
                self._draining.set()
            in_flight = len(self._in_flight)
        if first:
            emit(
                logger,
                "jobs.worker.draining",
                reason=reason,
                in_flight=in_flight,
                grace_s=self.drain_grace.total_seconds(),
            )
        self._wake.set()
        if wait:
            self._stopped.wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the worker has stopped; True if it has."""
        return self._stopped.wait(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job threads to end (abandoned jobs may still be running); True if so."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _serve(self) -> int:
        exit_code = CLEAN_EXIT
        try:
            self._start_up()
            self._loop()
            exit_code = self._settle()
            if self._gave_up and exit_code == CLEAN_EXIT:
                exit_code = UNAVAILABLE_EXIT
        finally:
            self._shut_down(exit_code)
        return exit_code

    def _start_up(self) -> None:
        if self.drain_on_shutdown:
            self._release_hook = shutdown.on_shutdown("jobs.worker", self.stop)
        self._threads = [
            threading.Thread(target=self._job_thread, name=f"ultimat3-job-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        for thread in self._threads:
            thread.start()
        # A burst worker never sleeps waiting for new work, so it has nothing to LISTEN for.
        if self.listen and not self.burst and connections[self.using].vendor == "postgresql":
            self._listener = Listener(
                using=self.using,
                queues=self.queues,
                wake=self._wake.set,
                retry_after=self.poll_interval.total_seconds(),
            )
            self._listener.start()
        emit(
            logger,
            "jobs.worker.started",
            node=self.node_id,
            queues=sorted(self.queues) if self.queues else "all",
            concurrency=self.concurrency,
            burst=self.burst,
            max_jobs=self.max_jobs,
            listen=self._listener is not None,
        )

    def _loop(self) -> None:
        """Claim while there is room; sleep until a job ends, a NOTIFY, or the poll interval."""
        next_heartbeat = next_recovery = 0.0
        failures = 0
        while not self._draining.is_set():
            idle_wait = self.poll_interval.total_seconds()
            try:
                moment = time.monotonic()
                if moment >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = moment + self.heartbeat_interval.total_seconds()
                if moment >= next_recovery:
                    self.recover()
                    next_recovery = moment + self.heartbeat_interval.total_seconds()
                with self._lock:
                    room = self.concurrency - len(self._in_flight)
                    running = len(self._in_flight)
                if self.max_jobs is not None:
                    room = min(room, self.max_jobs - self.claimed)
                # Cleared before claiming, so a job ending during the claim still wakes us.
                self._wake.clear()
                jobs = self.claim(room) if room > 0 and not self._draining.is_set() else []
                self._hand_over(jobs)
                failures = 0
                self.last_error = ""
            except DatabaseError as error:
                failures += 1
                fields = failure_fields(error)
                self.last_error = str(fields["error"])
                emit(logger, "jobs.worker.loop-failed", logging.ERROR, failures=failures, **fields)
                close_old_connections()
                if self.burst and failures >= BURST_GIVE_UP_AFTER:
                    self._gave_up = True
                    return
                idle_wait = loop_backoff(self.poll_interval, failures).total_seconds()
                self._wake.clear()
                self._draining.wait(idle_wait)
                continue
            if self.max_jobs is not None and self.claimed >= self.max_jobs:
                return
            if self.burst and not jobs and running == 0:
                return
            if room > 0 and len(jobs) == room:
                continue  # Every slot we asked for was filled: more may be due right away.
            until_heartbeat = next_heartbeat - time.monotonic()
            if not self._wake.wait(max(0.0, min(idle_wait, until_heartbeat))):
                # A quiet spell: let Django drop a broken or expired connection.
                close_old_connections()

    def _hand_over(self, jobs: list[Job]) -> None:
        with self._lock:
            for job in jobs:
                self._in_flight[job.pk] = job
            self.claimed += len(jobs)
        for job in jobs:
            emit(logger, "jobs.worker.job-started", logging.DEBUG, job=job.pk, name=job.name)
            self._inbox.put(job)

    def _settle(self) -> int:
        """Wait for the jobs in flight; past the drain grace, hand them back to the queue."""
        next_heartbeat = 0.0
        while True:
            with self._lock:
                left = list(self._in_flight)
            if not left:
                return CLEAN_EXIT
            deadline = None
            if self._draining.is_set():
                deadline = self._drain_started + self.drain_grace.total_seconds()
                if time.monotonic() >= deadline:
                    break
            moment = time.monotonic()
            if moment >= next_heartbeat:
                # Jobs still run: keep them from looking orphaned to the other workers.
                try:
                    self.heartbeat()
                except DatabaseError as error:
                    emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
                next_heartbeat = moment + self.heartbeat_interval.total_seconds()
            timeout = next_heartbeat - moment
            if deadline is not None:
                timeout = min(timeout, deadline - moment)
            self._wake.clear()
            with self._lock:
                busy = bool(self._in_flight)
            if busy:
                # Short waits, so a SIGTERM arriving now starts the grace clock promptly.
                self._wake.wait(max(0.0, min(timeout, 0.5)))
        self._abandoned.set()
        emit(
            logger,
            "jobs.worker.drain-timeout",
            logging.ERROR,
            jobs=left,
            grace_s=self.drain_grace.total_seconds(),
            fix='raise ULTIMAT3_JOBS["WORKER_DRAIN_GRACE"] (and the orchestrator\'s stop '
            "timeout) above your longest job, or split long jobs",
        )
        try:
            jobstore.give_back(
                using=self.using, job_ids=left, worker=self.node_id, now=self.clock()
            )
        except DatabaseError as error:
            # The heartbeat stops with us, so the other workers recover them instead.
            emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
        return ABANDONED_EXIT

    def _shut_down(self, exit_code: int) -> None:
        clean = not self._abandoned.is_set()
        for _ in self._threads:
            self._inbox.put(None)
        if clean:
            self.join(timeout=5)
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        try:
            nodes.stopped(using=self.using, node_id=self.node_id)
        except DatabaseError as error:
            emit(logger, "jobs.worker.loop-failed", logging.ERROR, **failure_fields(error))
        if self._release_hook is not None:
            self._release_hook()
            self._release_hook = None
        with self._lock:
            self.status = "stopped"
            self.exit_code = exit_code
            outcomes = {str(name): count for name, count in self.outcomes.items()}
        emit(
            logger,
            "jobs.worker.stopped",
            reason=self._drain_reason
            or ("database-unavailable" if self._gave_up else "burst" if self.burst else "max-jobs"),
            exit_code=exit_code,
            claimed=self.claimed,
            **outcomes,
        )
        self._stopped.set()


__all__ = ["ABANDONED_EXIT", "CLEAN_EXIT", "UNAVAILABLE_EXIT", "Worker"]


def _drop_broken_connections() -> None:
    """Close this thread's connections that errored and can no longer be used."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and connection.errors_occurred:
            if not connection.is_usable():
                connection.close()
            else:
                connection.errors_occurred = False
