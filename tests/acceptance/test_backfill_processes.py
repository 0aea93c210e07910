"""``backfill_task`` as an operator runs it, and while a real ``run_scheduler`` dispatches."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import close_old_connections
from django.db.models import Count

from ultimat3_jobs.models import Job, Occurrence

from .helpers import ROOT, Process, process_database_url, processes, spawn, stop_all, wait_for

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

TASK = "acceptance.every_second"
FAST = {"TICK_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 1}


def backfill_task(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "backfill_task", *argv],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": process_database_url(), "ULTIMAT3_ACCEPTANCE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_backfill_task__an_error_is_one_clear_line_without_a_traceback() -> None:
    process = backfill_task("acceptance.nope", "--start", "2026-06-01", "--end", "2026-06-02")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert 'CommandError: no task "acceptance.nope" is declared in code' in err
    assert "fix: pass the name of a @task (did you mean acceptance.every_second" in err
    assert "Traceback" not in err


def latest_fired() -> datetime | None:
    close_old_connections()
    return (
        Job.objects.filter(task=TASK, enqueued_by="scheduler")
        .order_by("-occurrence")
        .values_list("occurrence", flat=True)
        .first()
    )


@pytest.mark.postgres
def test_backfill__while_a_scheduler_runs_no_occurrence_is_enqueued_twice(
    tmp_path: Path, processes: list[Process]
) -> None:
    processes.append(spawn(tmp_path, "scheduler", "run_scheduler", settings_overrides=FAST))
    wait_for(lambda: Job.objects.filter(task=TASK).count() >= 2, 60, "the scheduler to fire")
    now = latest_fired()
    assert now is not None
    # From before the scheduler armed (only a backfill enqueues those) to seconds ahead of it
    # (the scheduler reaches them while, or after, the backfills write them; 20 s leaves room
    # for the commands to start on a loaded machine).
    start, end = now - timedelta(seconds=10), now + timedelta(seconds=20)
    count = 31
    argv = ("--start", start.isoformat(), "--end", end.isoformat())
    backfills = [backfill_task(TASK, *argv) for _ in range(2)]
    results = [b.communicate(timeout=120) for b in backfills]
    assert [b.returncode for b in backfills] == [0, 0], [err for _, err in results]
    wait_for(
        lambda: (latest_fired() or start) >= end + timedelta(seconds=2),
        60,
        "the scheduler to pass the end of the backfilled range",
    )
    stop_all(processes)

    close_old_connections()
    twice = Job.objects.filter(task=TASK).values("occurrence").annotate(n=Count("id"))
    assert list(twice.filter(n__gt=1)) == []
    seconds = [start + timedelta(seconds=n) for n in range(count)]
    in_range = Job.objects.filter(task=TASK, occurrence__gte=start, occurrence__lte=end)
    assert sorted(at for at in in_range.values_list("occurrence", flat=True) if at) == seconds
    # Each occurrence in the range was created by exactly one writer: the two backfills and the
    # scheduler's rounds together created one job per second, each reporting the others' jobs
    # as already present.
    backfilled = Occurrence.objects.filter(task=TASK, outcome="backfill")
    assert backfilled.count() == 2
    fired = Occurrence.objects.filter(
        task=TASK, outcome="fired", occurrence__gte=start, occurrence__lte=end
    )
    created = sum(
        1 for record in [*backfilled, *fired] for entry in record.jobs if entry["created"]
    )
    assert created == count
    assert all(record.count == count for record in backfilled)
    assert any(not entry["created"] for record in fired for entry in record.jobs), (
        "the scheduler never met a backfilled occurrence"
    )
