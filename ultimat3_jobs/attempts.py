"""One attempt of a claimed job: running it, and writing and reporting how it ended.

A @job's function, or a Django Task's row run through ``backends``, runs in one of the
worker's threads; how it ended (``Ended``, with a Django Task's return value or error) waits
for the worker's dispatcher, which writes it with its next claim; a Django Task's
``task_finished`` is sent once that write committed. Every write goes through the job store,
conditional on the row still being this worker's attempt.

Every job ends: a write the database refuses for its values (not for the connection) is tried
once more as a plain failure with ``jobs.job.result-unstorable``, and one refused even then is
handed back to the worker (``Written.refused``), whose lost-claim path (``release_unheld``)
puts it back in the queue: no row stays ``running`` under a live worker that no longer holds
it. While the connection is away, writes are retried: the job ran, and losing its outcome
would run it again.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from django.db import (
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    close_old_connections,
)

from . import instruments, tracing
from .checkins import CheckIns
from .conf import get_settings
from .db import committed, dumps, in_transaction, left_in_transaction, running_job_of
from .errors import (
    JobProcessDiedError,
    JobRowUnreadableError,
    JobTimeoutError,
    JobUnknownError,
    ResultUnstorableError,
    UltimateError,
    class_path,
)
from .logs import emit, failure_fields
from .models import JobStatus
from .registry import registry
from .retries import format_error, retry_delay, storable
from .store import ClaimedJob, Finish, JobStore, StartedTask, TaskResultColumns, started_task

if TYPE_CHECKING:
    from .backends import TaskRun

logger = logging.getLogger("ultimat3_jobs.worker")
#: The block of a job run while tracing is off.
_UNTRACED: AbstractContextManager[None] = nullcontext()

_T = TypeVar("_T")

Outcome = Literal["succeeded", "retrying", "failed", "lost"]

#: What a finish's row status says of the attempt.
_OUTCOMES: dict[str, Outcome] = {
    JobStatus.SUCCEEDED: "succeeded",
    JobStatus.QUEUED: "retrying",
    JobStatus.FAILED: "failed",
}
# A line per success at INFO would cost a busy worker much of its time; ``stopped`` counts
# them and ``-v 2`` shows each.
_LEVELS = {"succeeded": logging.DEBUG, "failed": logging.ERROR}

#: The connection is away: a write is retried, its outcome kept.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
#: The database refused a row's values: writing it again as it is cannot help.
REFUSED_ERRORS = (DataError, IntegrityError)

#: The path of the error a refused outcome ends with, as a Django Task's row keeps it.
UNSTORABLE_CLASS = class_path(ResultUnstorableError)


@dataclass(frozen=True, slots=True)
class Ended:
    """An attempt that ran: its finish, waiting to be written, and what its log line says."""

    job: ClaimedJob
    finish: Finish
    duration_ms: float
    log: dict[str, Any] = field(default_factory=dict)
    #: A Django Task's run: ``task_finished`` tells of it once its finish is written.
    run: TaskRun | None = None


@dataclass(frozen=True, slots=True)
class Written:
    """What a write of outcomes did: the ids written; the attempts as written (one whose
    outcome the database refused is written as a failure instead), to report; and those whose
    every write it refused, rows still ``running``, for the worker's lost-claim path."""

    ids: set[int]
    ended: Sequence[Ended]
    refused: list[Ended] = field(default_factory=list)


def unstorable(error: BaseException) -> ResultUnstorableError:
    """The error a job ends with when the database refused how it ended."""
    return ResultUnstorableError(
        f"the database refused this job's outcome: {format_error(error)[-2000:]}",
        fix="return and raise only what a job row keeps (JSON without NUL or unpaired "
        "surrogates, within the size limit), then retry the job from the admin",
        cause=error,
    )


class StartMarks:
    """The start marks of claimed-ahead jobs, shared by the threads that take jobs at the same
    moment: the first to ask writes the marks of every thread waiting then, in one statement,
    and the others wait for it (as a database's group commit does), so a busy worker writes
    fewer of them than it starts jobs. Each thread gets its own answer before its job runs.
    """

    def __init__(self, *, store: JobStore, node_id: str, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.node_id = node_id
        self.clock = clock
        self._ready = threading.Condition()
        self._asked: dict[int, ClaimedJob] = {}
        self._answers: dict[int, datetime | BaseException | None] = {}
        self._writing = False

    def mark(self, job: ClaimedJob) -> datetime | None:
        """When ``job`` was marked started, its function now free to run (None: no longer
        ours). Raises what the statement raised: the mark may or may not have landed, the job
        must not run."""
        with self._ready:
            self._asked[job.id] = job
            while job.id not in self._answers and self._writing:
                self._ready.wait()
            if job.id not in self._answers:
                self._writing = True
                asked, self._asked = self._asked, {}
            else:
                asked = {}
        if asked:
            answers: dict[int, datetime | BaseException | None]
            try:
                jobs, now = list(asked.values()), self.clock()
                marked = self.store.mark_started(jobs=jobs, worker=self.node_id, now=now)
                answers = {pk: now if pk in marked else None for pk in asked}
            except BaseException as error:
                answers = dict.fromkeys(asked, error)
            with self._ready:
                self._answers.update(answers)
                self._writing = False
                self._ready.notify_all()
        with self._ready:
            answer = self._answers.pop(job.id)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class Attempts:
    """Runs the attempts of one worker's claimed jobs and records how they ended.

    ``outcomes`` counts them; ``abandoned`` is the worker's: once set (its drain gave up), a
    write no longer retries while the database is away. Thread-safe: every job thread and the
    dispatcher share one.
    """

    def __init__(
        self,
        *,
        store: JobStore,
        node_id: str,
        clock: Callable[[], datetime],
        rand: Callable[[], float] = random.random,
        backoff_base: float,
        backoff_max: timedelta,
        retry_every: timedelta,
        abandoned: threading.Event,
        checkins: CheckIns | None = None,
    ) -> None:
        self.store = store
        #: Sentry check-ins closed by the jobs that end here for good.
        self.checkins = checkins or CheckIns(using=store.using, store=store)
        self.node_id = node_id
        self.clock = clock
        self.rand = rand
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_every = retry_every.total_seconds()
        self.abandoned = abandoned
        self.outcomes: dict[Outcome, int] = {"succeeded": 0, "retrying": 0, "failed": 0, "lost": 0}
        self._lock = threading.Lock()
        self._marks = StartMarks(store=store, node_id=node_id, clock=clock)
        #: The spans of the attempts running here, by (job id, attempt): a timeout ends one.
        self._spans: dict[tuple[int, int], Any] = {}

    # -- running ------------------------------------------------------------------------------

    def start(self, job: ClaimedJob) -> bool | StartedTask:
        """Make ``job``'s start durable before its function runs, unless the claim did: a job
        that kills its worker at once must still use up an attempt, or it would be claimed and
        run forever. A Django Task's start is marked as a @job's is, and its row, which its
        run reads, is made from its claim. False: the row is no longer ours, it must not run.
        Raises the database's error: the start may or may not have landed, the job must not
        run."""
        started_at = job.started_at or self._marks.mark(job)
        if started_at is None:
            return False
        if job.backend:
            # Its result's times are the row's: the start as the claim or the mark wrote it.
            return started_task(job, worker=self.node_id, started_at=started_at)
        return True

    def run(self, job: ClaimedJob) -> Ended:
        """Run one claimed, started @job; how it ended, not yet written."""
        handle = registry.get_job(job.name)
        started = time.monotonic()
        if handle is None:
            return self.unknown(job, started)
        before = in_transaction()
        try:
            # Its span continues the trace its row keeps (its occurrence's, its caller's).
            with (
                tracing.job_run(job, worker=self.node_id) as span,
                self._spanned(job, span),
                running_job_of(self.store.using),
            ):
                handle.func(**job.input)
                committed(job.name, before)
        except BaseException as error:
            # Whatever it raised: the next job's writes must not join its transaction.
            left_in_transaction(before)
            return self.raised(job, format_error(error), failure_fields(error), started)
        return self.succeeded(job, started)

    # How an attempt ended, for one that ran here or in a child process (``pool``); ``started``
    # is when it began, by ``time.monotonic()``.

    def succeeded(self, job: ClaimedJob, started: float) -> Ended:
        return Ended(job, Finish.succeeded(job, now=self.clock()), _since(started))

    def raised(self, job: ClaimedJob, text: str, fields: dict[str, Any], started: float) -> Ended:
        """The job's function raised: ``text`` is its traceback."""
        return self._failed(job, text, started, retry=True, fields=fields)

    def unknown(self, job: ClaimedJob, started: float, grace: timedelta | None = None) -> Ended:
        """A job no worker declared within ``grace`` (``Worker._unknown``), or one whose
        declaration this worker lost since its claim: failed, unrun, not retried."""
        waited = (
            f", nor in any that claimed it within UNKNOWN_JOB_GRACE ({grace.total_seconds():g} s)"
            if grace is not None
            else ""
        )
        error = JobUnknownError(
            f'job "{job.name}" is not declared in this worker{waited}', fix=UNKNOWN_JOB_FIX
        )
        text = f"{error.message} [{error.code}]\nfix: {error.fix}"
        return self._failed(job, text, started, retry=False, fields=error.as_fields())

    def unreadable(self, job: ClaimedJob) -> Ended:
        """A row the claim could not read (``ClaimedJob.unreadable``), or a @job's whose input
        is no object of keyword arguments: failed unrun, since a retry reads the same row; a
        Django Task's with its ``TaskError``."""
        why = job.unreadable or (
            f"its input, {dumps(job.input)[:200]}, is not an object of keyword arguments"
        )
        error = JobRowUnreadableError(
            f"job {job.id} ({job.name}) holds a value this worker cannot read: {why}",
            fix="correct the row's run_at, created_at, input or args (written around the app, "
            "by SQL), then retry the job from the admin; enqueue through the app, which refuses "
            "such values",
        )
        ended = self._failed(
            job, str(error), time.monotonic(), retry=False, fields=error.as_fields()
        )
        if job.backend:
            result = TaskResultColumns(None, class_path(JobRowUnreadableError), "")
            finish = replace(ended.finish, result=result)
            ended = replace(ended, finish=finish)
        return ended

    def _spanned(self, job: ClaimedJob, span: Any) -> AbstractContextManager[None]:
        """``span`` known as the running attempt's while the block runs (``_broken_off_span``);
        nothing to do while tracing is off, on a no-op job's path."""
        return _UNTRACED if span is None else self._holding(job, span)

    @contextmanager
    def _holding(self, job: ClaimedJob, span: Any) -> Iterator[None]:
        self._spans[job.id, job.attempts] = span
        try:
            yield
        finally:
            self._spans.pop((job.id, job.attempts), None)

    def _broken_off_span(self, job: ClaimedJob, error: UltimateError) -> None:
        tracing.broken_off(self._spans.pop((job.id, job.attempts), None), error)

    def broken_off(self, job: ClaimedJob, error: UltimateError, started: float) -> Ended:
        """The attempt was ended from outside (``timed_out``, ``died``): a failed attempt,
        retried by the job's ``max_attempts``. Its span ends now, failed."""
        self._broken_off_span(job, error)
        return self._failed(job, str(error), started, retry=True, fields=error.as_fields())

    def _failed(
        self, job: ClaimedJob, text: str, started: float, *, retry: bool, fields: dict[str, Any]
    ) -> Ended:
        # Storable whatever the exception held (NUL, lone surrogates): the outcome must land.
        text = storable(text)
        if retry and job.attempts < job.max_attempts:
            delay = retry_delay(
                job.attempts, base=self.backoff_base, cap=self.backoff_max, rand=self.rand
            )
            run_at = self.clock() + delay
            finish = Finish.retrying(job, run_at=run_at, error=text)
            return Ended(job, finish, _since(started), {"retry_at": run_at, **fields})
        finish = Finish.failed(job, now=self.clock(), error=text)
        return Ended(job, finish, _since(started), fields)

    def run_task(self, job: ClaimedJob, row: StartedTask) -> Ended:
        """A Django Task's started row: one run, no retry; how it ended, with its return value
        or ``TaskError`` for the row to keep, not yet written."""
        from . import backends

        started = time.monotonic()
        with tracing.job_run(job, worker=self.node_id) as span, self._spanned(job, span):
            run = backends.run_task(row)
            if run.error is not None:
                tracing.failed(span, run.error)
        now = self.clock()
        if run.error is None:
            # A retried row that failed before succeeds without its earlier error.
            result = TaskResultColumns(run.return_value)
            finish = Finish(job.id, job.attempts, JobStatus.SUCCEEDED, now, result=result)
            return Ended(job, finish, _since(started), run=run)
        result = TaskResultColumns(None, run.error_class, storable(run.traceback))
        error = storable(run.message)
        finish = Finish(job.id, job.attempts, JobStatus.FAILED, now, error=error, result=result)
        return Ended(job, finish, _since(started), failure_fields(run.error), run=run)

    def run_django_task(self, job: ClaimedJob, row: StartedTask) -> Outcome | None:
        """``run_task``, its outcome written at once (a process pool's child has no
        dispatcher to batch it with). None when the database refused every write of it: the
        row is still running as this worker's, for its lost-claim path."""
        written = self.record([self.run_task(job, row)])
        [outcome] = self.report_all(written)
        return None if written.refused else outcome

    def end_task(
        self, job: ClaimedJob, row: StartedTask, error: UltimateError, started: float
    ) -> Outcome:
        """A Django Task's run ended from outside (``timed_out``, ``died``): failed with
        ``error``, written at once (the framework never retries), and ``task_finished`` sent
        once it is. What its run writes later, if it ever returns, finds the row no longer
        running and changes nothing."""
        from . import backends

        self._broken_off_span(job, error)
        run = backends.ended_from_outside(row, error)
        finish = Finish.failed(job, now=self.clock(), error=storable(str(error)))
        finish = replace(finish, result=TaskResultColumns(None, run.error_class, run.traceback))
        [outcome] = self.report_all(
            self.record([Ended(job, finish, _since(started), error.as_fields(), run=run)])
        )
        return outcome

    def lost(self, job: ClaimedJob) -> Outcome:
        """A claimed-ahead job whose row was no longer ours when a thread took it (cancelled,
        or recovered by another worker meanwhile): it did not run here."""
        return self.report(Ended(job, Finish.succeeded(job, now=self.clock()), 0.0), False)

    # -- writing ------------------------------------------------------------------------------

    def _write_now(self, ended: Sequence[Ended], write: Callable[[], _T]) -> _T:
        """``write`` the outcomes ``ended``, retried while the database is away: each failure
        drops the connection it broke, so the next try opens a fresh one.

        The job ran; losing its outcome would run it again. So it keeps trying until the drain
        gives up on this job (``abandoned``), which then goes back to the queue.
        """
        delay = 0.05
        while True:
            try:
                return write()
            except CONNECTION_ERRORS as error:
                if self.abandoned.is_set():
                    raise
                self.record_failed(ended, error)
                close_old_connections()
                time.sleep(delay)
                delay = min(delay * 2, self.retry_every)

    def record(self, ended: Sequence[Ended]) -> Written:
        """Write outcomes now, where the row is still ours; retried while the database is
        away (``_write_now``)."""
        return self._write_now(ended, lambda: self.write(ended))

    def write(self, ended: Sequence[Ended]) -> Written:
        """Write outcomes in one statement; a batch the database refuses, one by one."""
        try:
            ids = self.store.finish(worker=self.node_id, finishes=[e.finish for e in ended])
        except REFUSED_ERRORS as error:
            return self.write_each(ended, error)
        return Written(ids, ended)

    def write_each(self, ended: Sequence[Ended], error: BaseException) -> Written:
        """Outcomes of a batch the database refused with ``error``, written one by one, so the
        one it refuses cannot hold the others back. That one is written as a failure with
        ``jobs.job.result-unstorable``; refused even so, it is returned in ``refused``.

        A connection error on the way is raised: the caller keeps the outcomes to write again.
        """
        self.record_failed(ended, error)
        ids: set[int] = set()
        written: list[Ended] = []
        refused: list[Ended] = []
        for one in ended:
            try:
                ids |= self.store.finish(worker=self.node_id, finishes=[one.finish])
                written.append(one)
                continue
            except REFUSED_ERRORS as alone:
                refusal = unstorable(alone)
            text = storable(str(refusal))
            finish = Finish.failed(one.job, now=self.clock(), error=text)
            if one.run is not None:
                # A Django Task's row keeps the refusal as its error, and its run tells of it.
                finish = replace(finish, result=TaskResultColumns(None, UNSTORABLE_CLASS, ""))
                run = one.run
                run.error, run.error_class, run.traceback = refusal, UNSTORABLE_CLASS, ""
                run.return_value = None
            failed = Ended(one.job, finish, one.duration_ms, refusal.as_fields(), run=one.run)
            written.append(failed)
            try:
                ids |= self.store.finish(worker=self.node_id, finishes=[failed.finish])
            except REFUSED_ERRORS as again:
                self.record_failed([failed], again)
                refused.append(failed)
        return Written(ids, written, refused)

    # -- reporting ----------------------------------------------------------------------------

    def report(self, ended: Ended, written: bool) -> Outcome:
        """Count and log one attempt's end. Not written: recovered by another worker (our
        heartbeat went stale) or cancelled meanwhile; its row was no longer ours to write."""
        outcome = _OUTCOMES[ended.finish.status] if written else "lost"
        self.counted(ended.job, outcome, ended.duration_ms / 1000)
        level = _LEVELS.get(outcome, logging.WARNING)
        if not logger.isEnabledFor(level):
            return outcome
        job = ended.job
        emit(
            logger,
            f"jobs.worker.job-{outcome}",
            level,
            job=job.id,
            name=job.name,
            queue=job.queue,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            duration_ms=ended.duration_ms,
            **ended.log,
        )
        return outcome

    def counted(self, job: ClaimedJob, outcome: Outcome, seconds: float) -> None:
        """One attempt's end in this worker's counters and metrics: ``report``'s, and the
        parent's share of a Django Task a ``--pool process`` child ran and reported."""
        with self._lock:
            self.outcomes[outcome] += 1
        instruments.job_finished(job.name, job.queue, outcome, seconds)

    def report_all(self, written: Written) -> list[Outcome]:
        """``report`` for each attempt of a write, as written."""
        outcomes = [self.report(one, one.job.id in written.ids) for one in written.ended]
        # Django Tasks' ``task_finished``: their rows are written, and committed.
        runs = [
            (one.run, one.finish.finished_at)
            for one in written.ended
            if one.run is not None and one.job.id in written.ids
        ]
        if runs:
            from . import backends

            for run, finished_at in runs:
                backends.finished(run, now=finished_at)
        # Written and over for good (not a retry): these may be an occurrence's last jobs.
        self.checkins.ended(
            (one.job.id, one.job.key)
            for one in written.ended
            if one.job.id in written.ids and one.finish.finished_at is not None
        )
        return outcomes

    def record_failed(self, ended: Sequence[Ended], error: BaseException) -> None:
        emit(
            logger,
            "jobs.worker.record-failed",
            logging.WARNING,
            jobs=[e.job.id for e in ended],
            **failure_fields(error),
        )


#: What to do about a job no worker declares.
UNKNOWN_JOB_FIX = (
    "deploy the code that declares it with @job (its app in INSTALLED_APPS) to the workers, "
    "then retry the job from the admin; a job a release removed stays so: delete it"
)
UNKNOWN_TASK_FIX = (
    "deploy the code that declares the Django Task (its module importable, and the tasks extra "
    "installed) to the workers, then enqueue it again; a task a release removed stays so"
)


def timeout_of(name: str, *, backend: str = "") -> float | None:
    """Seconds an attempt of the job ``name`` may run here, None for no limit: its own
    ``@job(timeout=...)``, else ``JOB_TIMEOUT`` (a Django Task's, always). This code's
    declaration decides, since this code's function is what runs."""
    handle = None if backend else registry.get_job(name)
    if handle is not None and handle.timeout is not None:
        return handle.timeout
    return get_settings().job_timeout


def timed_out(timeout: float) -> JobTimeoutError:
    """The error an attempt that ran past ``timeout`` seconds ends with."""
    return JobTimeoutError(
        f"the job ran past its timeout of {timeout:g}s and was stopped",
        fix="make the job finish in time (a timeout on its socket reads and lock waits, "
        "smaller batches) or raise its @job(timeout=...)",
        cause=timeout,
    )


def died(exit_code: int | None) -> JobProcessDiedError:
    """The error an attempt ends with when the child process running it died."""
    if exit_code is not None and exit_code < 0:
        try:
            how = f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            how = f"killed by signal {-exit_code}"
    else:
        how = f"exited with status {exit_code}"
    return JobProcessDiedError(
        f"the process running the job died: {how}",
        fix="find what crashes the process (a segfault in an extension, os._exit(), the OOM "
        "killer: see the kernel log) or give the job more memory",
        cause=exit_code,
    )


def _since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


__all__ = ["Attempts", "Ended", "Outcome", "Written"]
