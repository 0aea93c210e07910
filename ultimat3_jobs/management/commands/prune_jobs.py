"""``manage.py prune_jobs``: delete finished jobs and occurrence records past retention."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
from django.core.management.base import CommandParser
from django.db import DatabaseError

from ultimat3_jobs.db import app_database
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.management.arguments import MAX_DAYS, up_to
from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import command_error, database_error, require_migrated
from ultimat3_jobs.retention import prune
from ultimat3_jobs.store import Progress

#: Seconds between two progress lines of a long prune.
PROGRESS_EVERY = 5.0


class Command(JobsCommand):
    help = (
        "Delete finished jobs, occurrence records and silent nodes older than the retention "
        "period. Queued and running jobs are never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=up_to(MAX_DAYS),
            help=f"Keep this many days, at most {MAX_DAYS} (default: the RETENTION_DAYS setting).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would go; delete nothing."
        )
        # The app's database (where DATABASE_ROUTERS send it), else "default".
        parser.add_argument("--database", default=app_database())

    def handle(self, *, days: int | None, dry_run: bool, database: str, **options: Any) -> None:
        require_migrated(database)
        try:
            result = prune(
                older_than=None if days is None else timedelta(days=days),
                dry_run=dry_run,
                using=database,
                progress=self._progress(),
            )
        except UltimateError as error:
            raise command_error(error) from error
        except (DatabaseError, psycopg.Error) as error:
            # A one-shot command has no loop to retry in: say what failed and how to fix it.
            raise database_error(database, error) from None
        verb = "Would delete" if dry_run else "Deleted"
        self.stdout.write(
            f"{verb} {result.jobs} finished job(s), {result.occurrences} occurrence record(s) "
            f"and {result.nodes} silent node(s) older than {result.cutoff.isoformat()}."
        )

    def _progress(self) -> Progress:
        """A line on stderr every ``PROGRESS_EVERY`` seconds while rows are being deleted: a
        first prune of a large table takes minutes. A short prune prints none."""
        last = time.monotonic()

        def report(what: str, deleted: int) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY:
                last = now
                self.stderr.write(f"… {deleted:,} {what} deleted so far")

        return report
