"""The commands refuse what they cannot use, with a fix and no traceback, as an operator sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from .helpers import ROOT, process_database_url

pytestmark = [pytest.mark.acceptance]

#: Nothing listens on port 1: every connection is refused at once.
UNREACHABLE = "postgres://postgres@127.0.0.1:1/nowhere"
#: A backfill of the demo's nightly task over two days, without writing.
BACKFILL = [
    "backfill_task",
    "demo.nightly_digest",
    "--start",
    "2026-03-01",
    "--end",
    "2026-03-02",
    "--dry-run",
]


def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *argv],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": process_database_url(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run_scheduler", "--once", "--tick-interval", "inf"], "not a finite number"),
        (["run_scheduler", "--once", "--tick-interval", "1e308"], "at most 86400 seconds"),
        (["run_scheduler", "--once", "--tick-interval", "nan"], "not a finite number"),
        (["run_worker", "--burst", "--poll-interval", "inf"], "not a finite number"),
        (["run_worker", "--burst", "--drain-grace", "inf"], "not a finite number"),
        (["run_worker", "--burst", "--concurrency", "129"], "must be at most 128"),
        (["prune_jobs", "--days", "1000000000"], "must be at most 36500"),
        ([*BACKFILL, "--limit", str(10**26)], "must be at most 100000"),
        (["run_worker", "--burst", "--prefetch", str(10**20)], "must be at most 10000"),
        (["run_worker", "--burst", "--prefetch", "-1"], "must be 0 or more"),
        (["run_relay", "--burst", "--batch", str(10**20)], "must be at most 10000"),
        (["run_worker", "--burst", "--max-jobs-per-child", "5"], "needs --pool process"),
        (["run_jobs", "--max-memory-per-child", "500"], "needs --pool process"),
        (["run_worker", "--burst", "--metrics-addr", "127.0.0.1"], "needs --metrics-port"),
        (["run_scheduler", "--once", "--metrics-addr", "::1"], "needs --metrics-port"),
        (["jobs_status", "--role", "worker"], "--role needs --check"),
    ],
    ids=[
        "tick_inf",
        "tick_1e308",
        "tick_nan",
        "poll_inf",
        "grace_inf",
        "concurrency",
        "days",
        "backfill_limit",
        "prefetch",
        "prefetch_negative",
        "relay_batch",
        "max_jobs_per_child_threads",
        "max_memory_per_child_threads",
        "metrics_addr_without_port",
        "metrics_addr_without_port_once",
        "role_without_check",
    ],
)
def test_commands__out_of_range_flags_are_refused_by_argparse(
    argv: list[str], message: str
) -> None:
    result = run(*argv)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_run_worker__the_concurrency_bound_is_in_its_help() -> None:
    result = run("run_worker", "--help")
    assert result.returncode == 0
    assert "1 to 128" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    "argv",
    [
        ["run_scheduler", "--once"],
        ["run_worker", "--burst"],
        ["prune_jobs"],
        ["jobs_status"],
        BACKFILL,
        ["celery_beat_tasks"],
    ],
    ids=["scheduler", "worker", "prune", "status", "backfill", "celery_beat"],
)
def test_commands__an_unknown_database_alias_is_a_command_error_with_the_fix(
    argv: list[str],
) -> None:
    result = run(*argv, "--database", "nosuch")
    assert result.returncode == 1
    assert "there is no database 'nosuch' in DATABASES" in result.stderr
    assert "fix: pass --database with one of the aliases in DATABASES (default)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["run_scheduler", "--once"],
        ["prune_jobs"],
        ["jobs_status"],
        ["jobs_status", "--json"],
        BACKFILL,
    ],
    ids=["scheduler", "prune", "status", "status_json", "backfill"],
)
def test_one_shot_commands__an_unreachable_database_is_a_command_error_with_the_fix(
    argv: list[str],
) -> None:
    result = run(*argv, DATABASE_URL=UNREACHABLE)
    assert result.returncode == 1, result.stderr
    assert "[jobs.database-unavailable]" in result.stderr
    assert "fix: check that the database 'default'" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_scheduler__a_refused_advisory_connection_is_logged_as_database_unavailable() -> None:
    result = run("run_scheduler", "--once", "--log-format", "json", DATABASE_URL=UNREACHABLE)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    lost = [e for e in events if e["event"] == "jobs.leader.connection-lost"]
    assert lost, result.stdout
    assert {e["code"] for e in lost} == {"jobs.database-unavailable"}
    assert "jobs.unexpected-error" not in result.stdout


def test_run_worker__burst_against_an_unreachable_database_gives_up_non_zero() -> None:
    result = run("run_worker", "--burst", "--poll-interval", "0.05", DATABASE_URL=UNREACHABLE)
    assert result.returncode == 3, result.stderr
    assert "the database 'default' failed: OperationalError" in result.stderr
    assert "[jobs.database-unavailable]\nfix: check that the database" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("argv", [["--burst"], ["--stats"]], ids=["burst", "stats"])
def test_run_relay__an_unreachable_database_is_a_command_error_with_the_fix(
    argv: list[str],
) -> None:
    result = run("run_relay", *argv, "--poll-interval", "0.05", DATABASE_URL=UNREACHABLE)
    assert result.returncode == (3 if argv == ["--burst"] else 1), result.stderr
    assert "the database 'default' failed" in result.stderr
    assert "[jobs.database-unavailable]" in result.stderr
    assert "fix: check that the database 'default'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.django_db(transaction=True)
def test_run_relay__burst_gives_up_on_a_broker_that_is_down_and_keeps_the_row() -> None:
    from django.utils import timezone

    from ultimat3_jobs.models import Job

    row = Job.objects.create(
        name="demo.plain_row",
        key="refusals:broker-down",
        input={"label": "kept"},
        relay="celery",
        status="outbox",
        run_at=timezone.now(),
        created_at=timezone.now(),
    )
    result = run(
        "run_relay",
        "--burst",
        "--poll-interval",
        "0.05",
        CELERY_BROKER_URL="redis://127.0.0.1:1/0",
        ULTIMAT3_ACCEPTANCE="1",
        ULTIMAT3_ACCEPTANCE_RELAY="1",  # The relay imports the demo's Celery tasks.
    )
    assert result.returncode == 3, result.stdout
    assert "[jobs.relay.broker-unavailable]; this burst gave up" in result.stderr
    assert "fix: check CELERY_BROKER_URL" in result.stderr
    assert "Traceback" not in result.stderr
    row.refresh_from_db()
    assert (row.status, row.relayed_at) == ("outbox", None)


def test_prune_jobs__an_unmigrated_database_is_a_command_error_with_the_fix(
    tmp_path: Path,
) -> None:
    result = run("prune_jobs", DATABASE_URL=f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    assert result.returncode == 1
    assert "fix: run: python manage.py migrate" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.postgres
@pytest.mark.django_db
def test_run_scheduler__an_unmigrated_postgres_database_names_both_tables_with_the_fix() -> None:
    import psycopg

    url = process_database_url()
    empty = f"u3j_empty_{os.getpid()}"
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {empty}")
        conn.execute(f"CREATE DATABASE {empty}")
        try:
            result = run(
                "run_scheduler", "--once", DATABASE_URL=url.rsplit("/", 1)[0] + f"/{empty}"
            )
        finally:
            conn.execute(f"DROP DATABASE {empty}")
    assert result.returncode == 1, result.stderr
    assert (
        "has no ultimat3_jobs_task or ultimat3_jobs_job table [jobs.database-not-migrated]"
        in result.stderr
    )
    assert "fix: run: python manage.py migrate" in result.stderr
    assert "Traceback" not in result.stderr


def test_prune_jobs__refusals_reach_call_command_as_command_errors() -> None:
    with pytest.raises(CommandError, match="must be at most 36500"):
        call_command("prune_jobs", "--days", "1000000000")
    with pytest.raises(CommandError, match="there is no database 'nosuch'"):
        call_command("prune_jobs", "--database", "nosuch")


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["run_jobs", "run_scheduler", "run_worker", "run_relay"])
def test_long_running_commands__a_metrics_address_that_does_not_resolve_is_refused_with_the_fix(
    command: str,
) -> None:
    result = run(command, "--metrics-port", "9", "--metrics-addr", "bogus.invalid")
    assert result.returncode == 1, result.stderr
    assert "cannot serve metrics on bogus.invalid:9: " in result.stderr
    assert "fix: pass --metrics-addr an address of this host" in result.stderr


@pytest.mark.parametrize(
    ("start", "end"),
    [("0001-01-01", "0001-01-03"), ("9999-12-30", "9999-12-31T23:59")],
    ids=["year_1", "end_of_year_9999"],
)
def test_backfill_task__a_range_at_the_ends_of_the_calendar_is_a_command_error_with_the_fix(
    start: str, end: str
) -> None:
    result = run("backfill_task", "demo.nightly_digest", "--start", start, "--end", end)
    assert result.returncode == 1, result.stderr
    assert "reaches outside the years 2 to 9899" in result.stderr
    assert "[jobs.backfill.range-invalid]" in result.stderr
    assert "fix: give --start and --end between 0002-01-01 and 9899-12-31" in result.stderr
    assert "Traceback" not in result.stderr
