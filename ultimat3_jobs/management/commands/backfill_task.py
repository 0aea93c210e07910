"""``manage.py backfill_task``: enqueue a task's occurrences over a range (``backfill.py``)."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from django.core.management.base import CommandParser
from django.db import DatabaseError

from ultimat3_jobs import backfill
from ultimat3_jobs.db import app_database
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.management.arguments import MAX_BACKFILL, up_to
from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import command_error, database_error, require_migrated


class Command(JobsCommand):
    help = (
        "Enqueue every occurrence of a task from --start to --end (both included) under the "
        "scheduler's occurrence keys. An occurrence that already fired (a job or a record of "
        "it) is not fired again, whatever its payload is now, unless --again. An occurrence "
        "still ahead is enqueued to run at its own time, and the scheduler's run of it then "
        "creates nothing more. A paused task is refused unless --include-paused. Instants "
        "without an offset are read in the task's zone."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The task's name, as the admin's task list shows it.")
        parser.add_argument("--start", required=True, help="ISO 8601, e.g. 2026-03-01T00:00.")
        parser.add_argument("--end", required=True, help="ISO 8601, e.g. 2026-03-07T23:59.")
        parser.add_argument(
            "--dry-run", action="store_true", help="List what would be enqueued; write nothing."
        )
        parser.add_argument(
            "--limit",
            type=up_to(MAX_BACKFILL),
            default=backfill.DEFAULT_LIMIT,
            help="Refuse a range of more occurrences than this (default %(default)s, at most "
            f"{MAX_BACKFILL}).",
        )
        parser.add_argument(
            "--again",
            action="store_true",
            help="Fire the occurrences that already fired again, with the jobs their payload "
            "gives now (a key already there is still never enqueued twice).",
        )
        parser.add_argument(
            "--include-paused",
            action="store_true",
            help="Backfill a paused task; it stays paused.",
        )
        # The app's database (where DATABASE_ROUTERS send it), else "default".
        parser.add_argument("--database", default=app_database())

    def handle(
        self,
        *,
        name: str,
        start: str,
        end: str,
        dry_run: bool,
        limit: int,
        again: bool,
        include_paused: bool,
        database: str,
        **options: Any,
    ) -> None:
        require_migrated(database)
        try:
            handle = backfill.find_task(name)
            first = backfill.parse_instant(start, handle.zone, "--start")
            last = backfill.parse_instant(end, handle.zone, "--end")
            if dry_run:
                planned = backfill.plan(
                    handle,
                    first,
                    last,
                    limit=limit,
                    using=database,
                    again=again,
                    include_paused=include_paused,
                )
                present = planned.present
            else:
                done = backfill.run(
                    handle,
                    first,
                    last,
                    user=_who(),
                    via="manage.py backfill_task",
                    limit=limit,
                    using=database,
                    again=again,
                    include_paused=include_paused,
                )
                planned = done.plan
                present = {key: pk for key, (pk, new) in done.enqueued.items() if not new}
        except UltimateError as error:
            raise command_error(error) from error
        except (DatabaseError, psycopg.Error) as error:
            # A one-shot command has no loop to retry in: say what failed and how to fix it.
            raise database_error(database, error) from None
        if options["verbosity"] > 0:
            self._list(planned, present, handle.zone, dry_run)
        occurrences = len(planned.occurrences)
        if not occurrences:
            self.stdout.write(
                f"No occurrence of {name} from {first.isoformat()} to {last.isoformat()}: "
                "nothing to enqueue."
            )
        elif dry_run:
            self.stdout.write(
                f"Would enqueue {occurrences} occurrence(s) of {name}: {planned.new} new job(s), "
                f"{planned.already_present} already present.{_notes(planned)} Nothing was "
                "written (--dry-run)."
            )
        else:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Backfilled {occurrences} occurrence(s) of {name}: {done.created} job(s) "
                    f"created, {done.existing} already present.{_notes(planned)}"
                )
            )

    def _list(
        self, planned: backfill.BackfillPlan, present: dict[str, int], zone: ZoneInfo, dry: bool
    ) -> None:
        for occurrence in planned.occurrences:
            at = occurrence.occurrence
            line = f"{_stamp(at.astimezone(zone))}  ({_stamp(at.astimezone(UTC))})"
            if occurrence.occurrence in planned.fired:
                line += "  already fired" + (", fired again" if planned.again else "")
            elif planned.ahead(occurrence):
                line += "  ahead: due at its own time"
            self.stdout.write(line)
            if not occurrence.jobs:
                self.stdout.write("    no jobs for this occurrence")
            for job in occurrence.jobs:
                pk = present.get(job.key)
                if pk:
                    state = f"already present #{pk}"
                elif planned.withheld(occurrence):
                    state = "left out: the occurrence already fired"
                else:
                    state = "new" if dry else "created"
                self.stdout.write(f"    {job.job.name}  {job.key}  {state}")


def _notes(planned: backfill.BackfillPlan) -> str:
    """What the counts leave out: occurrences that already fired, and those still ahead."""
    notes = ""
    fired = len(planned.already_fired)
    if fired and planned.again:
        notes += f" {fired} occurrence(s) already fired: fired again (--again)."
    elif fired:
        notes += (
            f" {fired} occurrence(s) already fired: not fired again, {planned.left_out} job(s) "
            "of their payload now left out (--again fires them again)."
        )
    ahead = sum(1 for o in planned.due if planned.ahead(o))
    if ahead:
        notes += f" {ahead} occurrence(s) still ahead: due at their own time."
    return notes


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S %Z")


def _who() -> str:
    """The operator's login, for the history: the command has no Django user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
