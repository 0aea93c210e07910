"""Errors a user can cause. Each carries a stable ``code`` to search on and a ``fix`` to act on.

The same ``fix`` text becomes the ``hint`` of the matching ``manage.py check`` message, so an
operator sees one wording whether the problem surfaced at import, at enqueue or in a check.
"""

from __future__ import annotations

import pickle
from typing import Any, ClassVar


class UltimateError(Exception):
    """Base of every error the app raises for a user mistake.

    ``code`` is stable across releases; ``fix`` says what to change; ``cause`` names the
    offending value or the lower-level error behind this one.
    """

    code: ClassVar[str] = "jobs.error"

    def __init__(self, message: str, *, fix: str, cause: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.cause = cause

    def __str__(self) -> str:
        return f"{self.message} [{self.code}] fix: {self.fix}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled where it crosses processes (a Celery prefork pool, our process pool): an
        # exception is rebuilt from its args alone, and ``fix`` is keyword-only. A cause that
        # does not pickle travels as its text.
        try:
            cause = pickle.loads(pickle.dumps(self.cause))
        except Exception:
            cause = readable(self.cause)
        return (_remade, (type(self), self.message, self.fix, cause))

    def as_fields(self) -> dict[str, Any]:
        """The log fields of this failure: the message alone would drop the code and the fix."""
        return {
            "error": self.message,
            "code": self.code,
            "cause": None if self.cause is None else readable(self.cause),
            "fix": self.fix,
        }


class JobNameTakenError(UltimateError):
    """A different task or job already holds this name, or one handle was given two names."""

    code = "jobs.name-taken"


class MissingTimezoneError(UltimateError):
    """A task was declared without ``tz``."""

    code = "jobs.task.tz-missing"


class InvalidTimezoneError(UltimateError):
    """``tz`` is not a zone of the IANA database (``Bogota`` rather than ``America/Bogota``)."""

    code = "jobs.task.tz-invalid"


class InvalidCronError(UltimateError):
    """A cron expression that does not parse, or that can never match."""

    code = "jobs.task.cron-invalid"


class InvalidCatchUpError(UltimateError):
    """``catch_up`` is not one of skip, run-once, run-all, or ``max_catch_up`` is not positive."""

    code = "jobs.task.catch-up-invalid"


class InvalidDstOptionError(UltimateError):
    """``dst_gap`` is not end-of-gap or skip, or ``dst_repeat`` is not first or both."""

    code = "jobs.task.dst-option-invalid"


class InvalidMonitorError(UltimateError):
    """``monitor=`` is not True, False or a dict of Sentry monitor options, or asks Sentry to
    watch a schedule it cannot express (more than one run a minute)."""

    code = "jobs.task.monitor-invalid"


class InvalidJobInputError(UltimateError):
    """Job input that is not a JSON-serialisable dict of keyword arguments."""

    code = "jobs.job.input-invalid"


class ResultUnstorableError(UltimateError):
    """What a job's run ended with cannot be stored: a return value that is not JSON the job
    row can hold (NUL, an unpaired surrogate, too deep, too large), or an outcome the database
    refused. The job ends failed with this error rather than staying ``running``."""

    code = "jobs.job.result-unstorable"


class JobTimeoutError(UltimateError):
    """A job ran past its ``timeout`` (``@job(timeout=...)``, else ``JOB_TIMEOUT``): its
    attempt ends with this error, retried or failed by its ``max_attempts``, and its worker
    slot goes on to the next job without it."""

    code = "jobs.job.timeout"


class InvalidTimeoutError(UltimateError):
    """A ``timeout`` that is not a positive number of seconds (at most a day), nor None."""

    code = "jobs.job.timeout-invalid"


class JobProcessDiedError(UltimateError):
    """The child process running a job (``run_worker --pool process``) died under it: a
    segfault, ``os._exit()``, the kernel's OOM killer. The attempt fails; the child is
    replaced."""

    code = "jobs.job.process-died"


class WorkerLostError(UltimateError):
    """The worker running a job stopped before the job's outcome was written: it was killed
    (SIGKILL, the OOM killer, a lost host), or its drain grace ran out. Another worker's
    recovery, or its own drain, ends the attempt: retried by ``max_attempts``, else failed;
    a failed Django Task keeps this class as its ``TaskError``."""

    code = "jobs.job.worker-lost"
    #: What a row it ends says to do (the worker that wrote it is gone: nothing raises it).
    FIX: ClassVar[str] = (
        "find why the worker died (its exit, the kernel's log): give it memory or a longer "
        "--drain-grace; a job that kills its process fails alone with --pool process"
    )


class JobRowUnreadableError(UltimateError):
    """A claimed job row holds a value this worker cannot read, written around the app (by
    SQL): an instant that is infinite or past Python's years 1 to 9999, JSON nested past
    Python's recursion limit. The job fails alone, unrun and not retried; its batch goes on."""

    code = "jobs.job.row-unreadable"


class InvalidDeclarationError(UltimateError):
    """A ``@job`` or ``@task`` used on something it cannot wrap, or with a bad option."""

    code = "jobs.declaration-invalid"


class InvalidOverlapError(UltimateError):
    """``overlap`` is not one of allow, skip."""

    code = "jobs.task.overlap-invalid"


class UnknownTaskError(UltimateError):
    """A task name that no ``@task`` declares."""

    code = "jobs.task.unknown"


class BackfillRangeError(UltimateError):
    """A backfill range that cannot be read, starts after its end, or reaches outside the years
    2 to 9899 (``backfill.EARLIEST``, ``backfill.LATEST``)."""

    code = "jobs.backfill.range-invalid"


class BackfillTooLargeError(UltimateError):
    """A backfill range holding more occurrences than the limit allows."""

    code = "jobs.backfill.too-many"


class BackfillPausedError(UltimateError):
    """A backfill of a paused task, without ``--include-paused``: the scheduler fires none of a
    paused task's occurrences, and a backfill does not either unless told to."""

    code = "jobs.backfill.task-paused"


class BackfillHistoryPrunedError(UltimateError):
    """A backfill of occurrences older than a prune's cutoff with no trace of firing: the jobs
    and records that would say whether they fired may be gone, and firing them again is
    what ``--again`` asks for."""

    code = "jobs.backfill.history-pruned"


class SentryBehindError(UltimateError):
    """Sentry took longer than ``checkins.PACE_TIMEOUT`` to take the check-ins handed over:
    the client drops what its queue cannot hold."""

    code = "jobs.checkins.sentry-behind"


class TaskEntriesError(UltimateError):
    """A task's function raised, or returned something that is not a list of (job, input)."""

    code = "jobs.task.entries-failed"


class RoundLockWaitError(UltimateError):
    """A task function, called while its round was being written, waited on a lock that round
    holds: its statement was cancelled (``db.OwnLockWaits``)."""

    code = "jobs.task.waits-on-round"


class ConfigurationError(UltimateError):
    """A ``ULTIMAT3_JOBS`` setting with a bad value."""

    code = "jobs.config-invalid"


class LeaderUnavailableError(UltimateError):
    """The configured leader election cannot run on this database."""

    code = "jobs.scheduler.leader-unavailable"


class MetricsPortError(UltimateError):
    """``--metrics-port`` names a port this process cannot listen on."""

    code = "jobs.metrics.port-unavailable"


class MetricsAddressError(UltimateError):
    """``--metrics-addr`` names an address this host cannot listen on, or that does not resolve."""

    code = "jobs.metrics.address-invalid"


class InvalidJobKeyError(UltimateError):
    """A job key that cannot be stored: too long, not text, holding NUL, or not buildable.

    Raised at declaration for a ``key=`` that can never work (``key=5``, a template naming an
    argument the job does not take) and at enqueue for a key that does not fit the table.
    """

    code = "jobs.job.key-invalid"


class InvalidRunAtError(UltimateError):
    """``run_at`` that is not an aware ``datetime`` (a number, a string, a naive datetime)."""

    code = "jobs.job.run-at-invalid"


class TaskSyncError(UltimateError):
    """The database refused to store one task's declaration; the other tasks still run."""

    code = "jobs.task.sync-failed"


class UnknownDatabaseError(UltimateError):
    """A ``--database`` alias that is not a key of ``DATABASES``."""

    code = "jobs.database-unknown"


class AppNotReadyError(UltimateError):
    """A job was enqueued before the app connected its store: ``ultimat3_jobs`` is not in
    ``INSTALLED_APPS``, or ``django.setup()`` has not run."""

    code = "jobs.app.not-ready"


def class_path(kind: type) -> str:
    """Where a class is imported from, as a ``TaskError`` names an exception's:
    ``ultimat3_jobs.errors.JobTimeoutError``."""
    return f"{kind.__module__}.{kind.__qualname__}"


def readable(value: object) -> str:
    """``str(value)``, or a placeholder when even that raises: reporting a failure never fails."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__qualname__} whose str() raised>"


class TaskBackendError(UltimateError):
    """A scheduler entry names a Django Task whose backend cannot take it in the round."""

    code = "jobs.task.backend-unsupported"


class JobUnknownError(UltimateError):
    """A claimed job's name is no ``@job`` this worker declares: one of another release (a
    rolling deploy), or removed from the code. It waits ``UNKNOWN_JOB_GRACE`` for a worker
    that declares it, then fails."""

    code = "jobs.job.unknown"


class TaskReceiverError(UltimateError):
    """A receiver of a Django Tasks signal (``task_enqueued``, ``task_finished``) raised. The
    row it told of was committed as it ended; the other receivers, and the rest of the batch,
    are told all the same."""

    code = "jobs.task.receiver-failed"


class JobTransactionLeftOpenError(UltimateError):
    """A job's function returned with a transaction of its own still open on its thread's
    connection (autocommit turned off and never back on): nothing it wrote there was
    committed, and the connection was closed, so no later job writes into it."""

    code = "jobs.job.transaction-left-open"


class RelayTargetError(UltimateError):
    """An outbox row names a Celery task or Django Task this relay cannot find."""

    code = "jobs.relay.target-unknown"


class BrokerUnavailableError(UltimateError):
    """The engine an outbox row goes to (a Celery broker, a Tasks backend) cannot be reached:
    a connection or transport error, for every row alike until it is back."""

    code = "jobs.relay.broker-unavailable"


class RelaySendFailedError(UltimateError):
    """One outbox row failed as an outage would (its connection broken, a transport error)
    while the engine took a row after it: the row's own fault (a message larger than the
    broker takes, say), which it waits out of the way of, as a row whose task is unknown."""

    code = "jobs.relay.send-failed"


class RelayRefusedError(UltimateError):
    """The engine refused this one outbox row (its arguments, its options, its message): the
    row fails with the engine's error, and the rows behind it are sent."""

    code = "jobs.relay.refused"


class CeleryBeatReadError(UltimateError):
    """The django-celery-beat tables could not be read."""

    code = "jobs.celery-beat.unreadable"


def _remade(kind: type[UltimateError], message: str, fix: str, cause: Any) -> UltimateError:
    """An ``UltimateError`` as ``__reduce__`` gave it."""
    return kind(message, fix=fix, cause=cause)
