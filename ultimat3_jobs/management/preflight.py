"""What the commands check before they start, and how a user error reaches the terminal."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from ultimat3_jobs.errors import UltimateError, UnknownDatabaseError
from ultimat3_jobs.logs import NOT_MIGRATED_FIX, TIMEOUT_FIX, failure_fields
from ultimat3_jobs.store import store_for


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
