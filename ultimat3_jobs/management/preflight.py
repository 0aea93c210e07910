"""What the commands check before they start, and how a user error reaches the terminal."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.recorder import MigrationRecorder

from ultimat3_jobs.errors import UltimateError, UnknownDatabaseError
from ultimat3_jobs.logs import NOT_MIGRATED_FIX, TIMEOUT_FIX, emit, failure_fields
from ultimat3_jobs.store import store_for

logger = logging.getLogger("ultimat3_jobs.commands")


def require_database(using: str) -> None:
    """Refuse an alias that is not in ``DATABASES``, naming the ones that are."""
    if using not in connections.databases:
        aliases = ", ".join(sorted(connections.databases)) or "none"
        raise command_error(
            UnknownDatabaseError(
                f"there is no database {using!r} in DATABASES",
                fix=f"pass --database with one of the aliases in DATABASES ({aliases})",
                cause=using,
            )
        )


def require_migrated(using: str) -> None:
    """Refuse to start on a database without the app's tables.

    A database that cannot be reached is left to the loop, which logs, backs off and retries
    until it comes back; a missing table never comes back by waiting.
    """
    require_database(using)
    try:
        missing = store_for(using).missing_tables()
    except DatabaseError:
        return
    if missing:
        raise CommandError(
            f"the database {using!r} has no {' or '.join(missing)} table "
            f"[jobs.database-not-migrated]\nfix: {not_migrated_fix(using)}"
        )


@functools.cache
def latest_migration() -> str | None:
    """The name of this release's last migration of the app (None where its files cannot be
    listed: an install from a zip)."""
    folder = Path(__file__).resolve().parents[1] / "migrations"
    return max((path.stem for path in folder.glob("[0-9][0-9][0-9][0-9]_*.py")), default=None)


def warn_if_behind(using: str) -> None:
    """Say at start when the database lacks this release's last migration of the app. A role
    runs all the same (a rolling deploy may start it before ``migrate``, and the release
    before this one's schema may serve), but what fails on the older schema then fails with
    its reason said. One small read; nothing when it cannot be read."""
    latest = latest_migration()
    if latest is None:
        return
    recorder = MigrationRecorder(connections[using])
    try:
        behind = not recorder.migration_qs.filter(app="ultimat3_jobs", name=latest).exists()
    except DatabaseError:
        return
    if behind:
        emit(
            logger,
            "jobs.database-behind",
            logging.WARNING,
            database=using,
            migration=f"ultimat3_jobs.{latest}",
            fix=not_migrated_fix(using),
        )


def not_migrated_fix(using: str) -> str:
    """The fix for a database without the app's tables: ``migrate`` on that database."""
    if using == DEFAULT_DB_ALIAS:
        return NOT_MIGRATED_FIX
    return f"{NOT_MIGRATED_FIX} --database {using}"


def command_error(error: UltimateError) -> CommandError:
    """A user error as the command's failure: the message and its code, then the fix on a line
    of its own."""
    return CommandError(f"{error.message} [{error.code}]\nfix: {error.fix}")


def database_error(using: str, error: BaseException) -> CommandError:
    """A database failure (unreachable, unmigrated) as the command's failure, with its fix."""
    fields = failure_fields(error)
    fix = fields["fix"]
    if fields["code"] == "jobs.database-unavailable":
        fix = unavailable_fix(using)
    elif fields["code"] == "jobs.database-timeout":
        fix = f"{TIMEOUT_FIX}, then run the command again"
    return CommandError(
        f"the database {using!r} failed: {fields['error']} [{fields['code']}]\nfix: {fix}"
    )


def unavailable_fix(using: str) -> str:
    """The fix for a database a one-shot command could not reach: no loop retries for it."""
    return (
        f"check that the database {using!r} in DATABASES / DATABASE_URL is running and "
        "reachable from this host, then run the command again"
    )
