"""Sentry Crons check-ins across real processes: ``run_scheduler`` sends each monitored
occurrence's ``in_progress`` with its monitor's config, ``run_worker`` its ``ok`` or ``error``
once its last job ended; skipped, dropped and paused occurrences send nothing. Both write the
envelopes to one file through the test project's transport (``ULTIMAT3_SENTRY_ENVELOPES``)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from testproject.sentry_envelopes import read
from ultimat3_jobs.models import Job, JobStatus, Occurrence, Task

from ..sentry_support import by_check_in, occurrence_check_in
from .helpers import Process, processes, spawn

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

SETTINGS = {
    "SENTRY_CRONS": True,
    # Missed by more than a second is missed: catch_up="skip" drops the three minutes moved back.
    "MISFIRE_GRACE": 1.0,
    "TICK_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 1,
    "WORKER_POLL_INTERVAL": 0.2,
}
MONITORED = [
    "acceptance.monitored",
    "acceptance.monitored_fails",
    "acceptance.monitored_overlap",
    "acceptance.monitored_dropped",
    "acceptance.monitored_paused",
    "acceptance.unmonitored",
    "acceptance.monitored_django_task",
]


def run(
    tmp_path: Path, processes: list[Process], name: str, env: dict[str, str], *argv: str
) -> None:
    process = spawn(tmp_path, name, *argv, settings_overrides=SETTINGS, env=env)
    processes.append(process)
    assert process.wait(60) == 0, process.log_path.read_text()


def away_from_a_minute_boundary() -> None:
    """A round that ran within a second of a minute's start would find that minute's
    occurrence on time, and fire it under catch_up="skip"."""
    while not 3 <= timezone.now().second <= 50:
        time.sleep(0.5)


def occurrences(task: str) -> list[datetime]:
    found = Job.objects.filter(task=task).values_list("occurrence", flat=True).distinct()
    return sorted(at for at in found if at is not None)


@pytest.mark.parametrize(
    "pool",
    [[], ["--pool", "process", "--max-jobs-per-child", "1"]],
    ids=["threads", "recycled_children"],
)
def test_checkins__in_progress_from_the_scheduler_then_ok_or_error_from_the_worker(
    tmp_path: Path, processes: list[Process], pool: list[str]
) -> None:
    envelopes = tmp_path / "envelopes.jsonl"
    env = {"ULTIMAT3_ACCEPTANCE_MONITORS": "1", "ULTIMAT3_SENTRY_ENVELOPES": str(envelopes)}
    run(tmp_path, processes, "scheduler-arms", env, "run_scheduler", "--once")
    assert read(str(envelopes)) == []  # arming fires nothing

    away_from_a_minute_boundary()
    back = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    Task.objects.filter(name__in=MONITORED).update(last_fired_at=back)
    Task.objects.filter(name="acceptance.monitored_paused").update(paused=True)
    run(tmp_path, processes, "scheduler-fires", env, "run_scheduler", "--once")
    run(tmp_path, processes, "worker", env, "run_worker", "--burst", "--concurrency", "2", *pool)

    items = [item for item in read(str(envelopes)) if item["type"] == "check_in"]
    for task, final in (
        ("acceptance.monitored", "ok"),
        ("acceptance.monitored_fails", "error"),
        # Closed by the Django Task's run: in the child, which a recycle ends right after.
        ("acceptance.monitored_django_task", "ok"),
    ):
        fired = occurrences(task)
        assert len(fired) >= 3, fired  # run-all: every minute moved back
        monitor = task.replace(".", "-")
        assert by_check_in(envelopes, monitor) == {
            occurrence_check_in(task, at): ["in_progress", final] for at in fired
        }
    # In one process and closed in another: the check-in id is the occurrence's own.
    pids = {
        item["payload"]["status"]: item["pid"]
        for item in items
        if item["payload"]["monitor_slug"] == "acceptance-monitored"
    }
    assert pids["in_progress"] != pids["ok"]

    config = next(
        item["payload"]["monitor_config"]
        for item in items
        if item["payload"]["monitor_slug"] == "acceptance-monitored"
    )
    assert config == {
        "schedule": {"type": "crontab", "value": "* * * * *"},
        "timezone": "Europe/Paris",
        "checkin_margin": 1,
        "max_runtime": 30,
    }
    failing = next(
        item["payload"]["monitor_config"]
        for item in items
        if item["payload"]["monitor_slug"] == "acceptance-monitored_fails"
    )
    assert (failing["timezone"], failing["checkin_margin"], failing["max_runtime"]) == ("UTC", 2, 5)
    assert Job.objects.filter(task="acceptance.monitored_fails", status=JobStatus.FAILED).exists()

    # Skipped for overlap: only the first occurrence of the round fired, the others say nothing.
    [first] = occurrences("acceptance.monitored_overlap")
    assert by_check_in(envelopes, "acceptance-monitored_overlap") == {
        occurrence_check_in("acceptance.monitored_overlap", first): ["in_progress", "ok"]
    }
    records = Occurrence.objects.filter(task="acceptance.monitored_overlap", outcome="overlap")
    assert records.exists()
    # Dropped by catch-up, paused, not a monitor: nothing sent, so Sentry sees them missed.
    for task, outcome in (
        ("acceptance.monitored_dropped", "dropped"),
        ("acceptance.monitored_paused", "paused"),
    ):
        assert Occurrence.objects.filter(task=task, outcome=outcome).exists()
        assert occurrences(task) == []
        assert by_check_in(envelopes, task.replace(".", "-")) == {}
    assert len(occurrences("acceptance.unmonitored")) >= 3
    assert by_check_in(envelopes, "acceptance-unmonitored") == {}
