"""What the commands check before they start, and how a user error reaches the terminal."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DatabaseError, connections

from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.logs import NOT_MIGRATED_FIX
from ultimat3_jobs.models import Job, Task


def require_migrated(using: str) -> None:
    """Refuse to start on a database without the app's tables.

    A database that cannot be reached is left to the loop, which logs, backs off and retries
    until it comes back; a missing table never comes back by waiting.
    """
    try:
        tables = set(connections[using].introspection.table_names())
    except DatabaseError:
        return
    missing = [model._meta.db_table for model in (Task, Job) if model._meta.db_table not in tables]
    if missing:
        raise CommandError(
            f"the database {using!r} has no {' or '.join(missing)} table\nfix: {NOT_MIGRATED_FIX}"
        )


def command_error(error: UltimateError) -> CommandError:
    """A user error as the command's failure: the message, then the fix on a line of its own."""
    return CommandError(f"{error.message}\nfix: {error.fix}")
