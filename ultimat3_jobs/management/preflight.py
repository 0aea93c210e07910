"""What a long-running command checks before it starts its loop."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DatabaseError, connections

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
