"""``manage.py jobs_status``: the scheduler's health, the job table and each task's next run;
``--check``: whether each role is alive and ready, as an exec probe's exit status."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ultimat3_jobs.db import app_database
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.health import ROLES, RoleHealth, database_health
from ultimat3_jobs.humanize import duration
from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import command_error, database_error, require_migrated
from ultimat3_jobs.overview import overview


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


class Command(JobsCommand):
    # A probe runs this every few seconds: it reads the node rows and no more. The system
    # checks would call every task's function; `manage.py check` is where they run.
    requires_system_checks: list[str] = []
    help = (
        "Print the scheduler's leader and last round, dispatch lateness, jobs by status and "
        "each task's next run (--json for machines). --check exits 1 unless every role is "
        "alive and ready: an exec probe."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="One JSON object.")
        # The app's database (where DATABASE_ROUTERS send it), else "default".
        parser.add_argument("--database", default=app_database())
        parser.add_argument(
            "--check",
            action="store_true",
            help="Only say whether each role is alive and ready (a leader whose round is "
            "recent, a worker heard from, a relay whose broker takes its rows); exit 1 if one "
            "is not.",
        )
        parser.add_argument(
            "--role",
            choices=ROLES,
            action="append",
            dest="roles",
            help="With --check: the role to check (repeatable; default: the scheduler and the "
            "worker, and the relay where one runs).",
        )

    def handle(
        self,
        *,
        json: bool,
        database: str,
        check: bool,
        roles: list[str] | None,
        **options: Any,
    ) -> None:
        if roles and not check:
            # Said at once, as argparse says a bad value: without --check no role is judged.
            raise CommandError("--role needs --check", returncode=2)
        require_migrated(database)
        try:
            if check:
                self._check(database, roles, as_json=json)
                return
            report = overview(using=database)
        except (DatabaseError, psycopg.Error) as error:
            # A one-shot command has no loop to retry in: say what failed and how to fix it.
            raise database_error(database, error) from None
        except UltimateError as error:  # a bad setting, which no system check ran before
            raise command_error(error) from None
        if json:
            self.stdout.write(_dumps(report))
        else:
            self.stdout.write(self._text(report))

    def _check(self, database: str, roles: list[str] | None, *, as_json: bool) -> None:
        found = database_health(database, roles=roles)
        healthy = all(role.ready for role in found)
        if as_json:
            self.stdout.write(
                _dumps({"healthy": healthy, "roles": [role.as_dict() for role in found]})
            )
        else:
            self.stdout.write("\n".join(_check_line(role) for role in found))
        if not healthy:
            failing = ", ".join(role.role for role in found if not role.ready)
            raise CommandError(f"not healthy: {failing}", returncode=1)

    def _text(self, report: dict[str, Any]) -> str:
        leader = report["leader"]
        lines = [
            "Leader:      "
            + (
                f"{leader['host']}:{leader['pid']} ({leader['leader']}, node {leader['node']})"
                if leader
                else "none"
            ),
            f"Last round:  {_when(report['last_round_at'])}"
            + (
                ""
                if report["last_round_age_s"] is None
                else f" ({report['last_round_age_s']:.1f} s ago)"
            ),
            f"Nodes:       {report['schedulers']} scheduler(s), {report['workers']} worker(s) live",
        ]
        late = report["lateness"]
        window = duration_text(late["window_s"])
        if late["fired"]:
            lines.append(
                f"Lateness:    last {_seconds(late['last_s'])} ({late['last_task']}); "
                f"over the last {window}: max {_seconds(late['max_s'])}, "
                f"mean {_seconds(late['mean_s'])}, {late['fired']} fired"
            )
        else:
            lines.append(f"Lateness:    nothing fired in the last {window}")
        by_status = report["jobs"]["by_status"]
        lines.append("Jobs:        " + ", ".join(f"{s} {n}" for s, n in by_status.items()))
        for queue, counts in sorted(report["jobs"]["by_queue"].items()):
            lines.append(f"  {queue}: " + ", ".join(f"{s} {n}" for s, n in counts.items() if n))
        for warning in report["warnings"]:
            lines.append(f"WARNING: {warning['message']}\n  fix: {warning['fix']}")
        lines.append("")
        rows = [("TASK", "CRON", "TZ", "STATE", "NEXT RUN", "LAST FIRED")]
        # Tasks of one schedule share their instants: each written once.
        when = functools.lru_cache(maxsize=4096)(_when)
        for t in report["tasks"]:
            next_run, last_fired = when(t["next_run"]), when(t["last_fired"])
            rows.append((t["name"], t["cron"], t["tz"], t["state"], next_run, last_fired))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        return "\n".join(lines)


def _check_line(role: RoleHealth) -> str:
    state = "ok" if role.ready else "alive, not ready" if role.live else "FAILED"
    line = f"{role.role}: {state}: {role.detail}"
    return line if role.ready else f"{line}\n  fix: {role.fix}"


def duration_text(seconds: float) -> str:
    return duration(timedelta(seconds=seconds))


def _dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, default=_json_default, indent=2)
