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

from ultimat3_jobs.models import Job, Occurrence, Task

from .helpers import ROOT, Process, process_database_url, processes, spawn, stop_all, wait_for

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

TASK = "acceptance.every_second"
FAST = {"TICK_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 1}


def backfill_task(*argv: str, release: str = "") -> subprocess.Popen[str]:
    """``manage.py backfill_task`` as an operator runs it; ``release`` declares
    ``acceptance.released`` with that payload."""
    env = {**os.environ, "DATABASE_URL": process_database_url(), "ULTIMAT3_ACCEPTANCE": "1"}
    if release:
        env["ULTIMAT3_ACCEPTANCE_RELEASE"] = release
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "backfill_task", *argv],
        cwd=ROOT,
        env=env,
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


RELEASED = "acceptance.released"


def released_jobs() -> list[tuple[datetime, str, datetime]]:
    """(occurrence, release, run_at) of every job of ``acceptance.released``, in order."""
    close_old_connections()
    jobs = Job.objects.filter(task=RELEASED).order_by("occurrence", "id")
    return [(j.occurrence, j.input["release"], j.run_at) for j in jobs if j.occurrence]


def test_backfill_task__after_a_deploy_an_occurrence_that_fired_gets_nothing_new(
    tmp_path: Path, processes: list[Process]
) -> None:
    scheduler = spawn(
        tmp_path,
        "scheduler",
        "run_scheduler",
        settings_overrides=FAST,
        env={"ULTIMAT3_ACCEPTANCE_RELEASE": "r1"},
    )
    processes.append(scheduler)
    wait_for(lambda: len(released_jobs()) >= 3, 60, "the scheduler to fire three occurrences")
    stop_all(processes)
    fired = released_jobs()
    first, last = fired[0][0], fired[-1][0]
    argv = (RELEASED, "--start", first.isoformat(), "--end", last.isoformat())

    # The next release's payload: every occurrence's key is a new one.
    deployed = backfill_task(*argv, release="r2")
    out, err = deployed.communicate(timeout=120)

    assert deployed.returncode == 0, err
    count = len(fired)
    assert (
        f"{count} occurrence(s) already fired: not fired again, {count} job(s) of their payload "
        "now left out (--again fires them again)." in out
    )
    assert f"Backfilled {count} occurrence(s) of {RELEASED}: 0 job(s) created" in out
    assert released_jobs() == fired

    again = backfill_task(*argv, "--again", release="r2")
    out, err = again.communicate(timeout=120)

    assert again.returncode == 0, err
    assert f"{count} job(s) created" in out
    by_occurrence: dict[datetime, list[str]] = {}
    for occurrence, release, _ in released_jobs():
        by_occurrence.setdefault(occurrence, []).append(release)
    assert by_occurrence == {occurrence: ["r1", "r2"] for occurrence, _, _ in fired}


@pytest.mark.postgres
def test_backfill_task__ahead_of_a_running_scheduler_after_a_deploy_its_rounds_add_nothing(
    tmp_path: Path, processes: list[Process]
) -> None:
    processes.append(
        spawn(
            tmp_path,
            "scheduler",
            "run_scheduler",
            settings_overrides=FAST,
            env={"ULTIMAT3_ACCEPTANCE_RELEASE": "r1"},
        )
    )
    wait_for(released_jobs, 60, "the scheduler to fire")
    now = released_jobs()[-1][0]
    # Seconds ahead of the scheduler, from a later release whose keys are not the scheduler's.
    start, end = now + timedelta(seconds=15), now + timedelta(seconds=20)
    ahead = backfill_task(
        RELEASED, "--start", start.isoformat(), "--end", end.isoformat(), release="r2"
    )
    out, err = ahead.communicate(timeout=120)
    assert ahead.returncode == 0, err
    wait_for(
        lambda: released_jobs()[-1][0] >= end + timedelta(seconds=2),
        60,
        "the scheduler to pass the end of the backfilled range",
    )
    stop_all(processes)

    in_range = [job for job in released_jobs() if start <= job[0] <= end]
    seconds = [start + timedelta(seconds=n) for n in range(6)]
    # One job per occurrence: the rounds that reached the backfilled ones created none.
    assert [occurrence for occurrence, _, _ in in_range] == seconds
    backfilled = [job for job in in_range if job[1] == "r2"]
    assert backfilled, f"the backfill came too late to run ahead:\n{out}"
    # Enqueued to run at their own time, not at once.
    assert all(run_at == occurrence for occurrence, _, run_at in backfilled)
    close_old_connections()
    rounds = Occurrence.objects.filter(
        task=RELEASED, outcome="fired", occurrence__in=[job[0] for job in backfilled]
    )
    assert rounds.count() == len(backfilled)
    assert all(not any(entry["created"] for entry in record.jobs) for record in rounds)


def test_backfill_task__a_paused_task_is_one_clear_line_and_include_paused_runs_it() -> None:
    Task.objects.create(
        name="acceptance.every_second", cron="* * * * * *", tz="UTC", paused=True, paused_by="ops"
    )
    argv = (TASK, "--start", "2026-06-01T00:00:00Z", "--end", "2026-06-01T00:00:02Z")

    refused = backfill_task(*argv)
    _, err = refused.communicate(timeout=60)

    assert refused.returncode == 1
    assert 'CommandError: task "acceptance.every_second" is paused' in err
    assert "[jobs.backfill.task-paused]" in err
    assert "fix: resume the task on its page in the admin first, or pass --include-paused" in err
    assert "Traceback" not in err
    close_old_connections()
    assert not Job.objects.filter(task=TASK).exists()

    included = backfill_task(*argv, "--include-paused")
    out, err = included.communicate(timeout=60)

    assert included.returncode == 0, err
    assert "Backfilled 3 occurrence(s) of acceptance.every_second: 3 job(s) created" in out
    close_old_connections()
    assert Job.objects.filter(task=TASK).count() == 3
