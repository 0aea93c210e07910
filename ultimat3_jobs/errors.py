"""Errors a user can cause. Each carries a stable ``code`` to search on and a ``fix`` to act on.

The same ``fix`` text becomes the ``hint`` of the matching ``manage.py check`` message, so an
operator sees one wording whether the problem surfaced at import, at enqueue or in a check.
"""

from __future__ import annotations

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

    def as_fields(self) -> dict[str, Any]:
        """The log fields of this failure: the message alone would drop the code and the fix."""
        return {
            "error": self.message,
            "code": self.code,
            "cause": None if self.cause is None else str(self.cause),
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


class InvalidJobInputError(UltimateError):
    """Job input that is not a JSON-serialisable dict of keyword arguments."""

    code = "jobs.job.input-invalid"


class InvalidDeclarationError(UltimateError):
    """A ``@job`` or ``@task`` used on something it cannot wrap, or with a bad option."""

    code = "jobs.declaration-invalid"


class TaskEntriesError(UltimateError):
    """A task's function raised, or returned something that is not a list of (job, input)."""

    code = "jobs.task.entries-failed"


class ConfigurationError(UltimateError):
    """A ``ULTIMAT3_JOBS`` setting with a bad value."""

    code = "jobs.config-invalid"


class LeaderUnavailableError(UltimateError):
    """The configured leader election cannot run on this database."""

    code = "jobs.scheduler.leader-unavailable"


class TaskBackendError(UltimateError):
    """A scheduler entry names a Django Task whose backend cannot take it in the round."""

    code = "jobs.task.backend-unsupported"


class RelayTargetError(UltimateError):
    """An outbox row names a Celery task or Django Task this relay cannot find."""

    code = "jobs.relay.target-unknown"


class BrokerUnavailableError(UltimateError):
    """The engine an outbox row goes to (a Celery broker, a Tasks backend) refused it for now."""

    code = "jobs.relay.broker-unavailable"


class CeleryBeatReadError(UltimateError):
    """The django-celery-beat tables could not be read."""

    code = "jobs.celery-beat.unreadable"
