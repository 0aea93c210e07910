"""``overlap="skip"`` with a real scheduler and a real worker whose job outlives its period."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import close_old_connections

from ultimat3_jobs.models import Job, JobStatus, Occurrence

from .helpers import Process, processes, spawn, stop_all, wait_for

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

TASK = "acceptance.exclusive"
FAST = {
    "TICK_INTERVAL": 0.2,
    "WORKER_POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 0.3,
}


def jobs() -> list[Job]:
    close_old_connections()
    return list(Job.objects.filter(task=TASK).order_by("occurrence"))


def skipped() -> list[Occurrence]:
    close_old_connections()
    return list(Occurrence.objects.filter(task=TASK, outcome="overlap").order_by("occurrence"))


def seconds_of(record: Occurrence) -> list[datetime]:
    assert record.occurrence is not None
    return [record.occurrence + timedelta(seconds=n) for n in range(record.count)]


def test_overlap_skip__a_running_job_holds_back_later_occurrences(
    tmp_path: Path, processes: list[Process]
) -> None:
    gate = tmp_path / "gate"
    env = {"ULTIMAT3_ACCEPTANCE_GATE": str(gate)}
    for name, command in (("scheduler", "run_scheduler"), ("worker", "run_worker")):
        processes.append(spawn(tmp_path, name, command, settings_overrides=FAST, env=env))
    scheduler = processes[0]
    try:
        wait_for(
            lambda: [j for j in jobs() if j.status == JobStatus.RUNNING],
            60,
            "the first job of the task to be running",
        )
        [first] = jobs()
        # The scheduler keeps deciding every second while the job runs: each occurrence is
        # recorded as skipped, and no second job is enqueued.
        wait_for(lambda: len(skipped()) >= 3, 60, "three occurrences skipped for overlap")
        assert [(j.pk, j.status) for j in jobs()] == [(first.pk, JobStatus.RUNNING)]
        assert {r.detail for r in skipped()} == {
            f"overlap=skip: {first.occurrence.isoformat().replace('+00:00', 'Z')} "  # type: ignore[union-attr]
            "not done yet"
        }
        assert scheduler.named("jobs.scheduler.overlap-skipped")
    finally:
        gate.touch()
    # Released: the job ends and a later occurrence fires again.
    wait_for(
        lambda: len([j for j in jobs() if j.status == JobStatus.SUCCEEDED]) >= 3,
        60,
        "later occurrences to fire and succeed once the first job ended",
    )
    stop_all(processes)

    fired = [j.occurrence for j in jobs()]
    assert len(fired) == len(set(fired)), "an occurrence fired twice"
    skipped_at = [at for record in skipped() for at in seconds_of(record)]
    assert len(skipped_at) == len(set(skipped_at))
    assert set(fired).isdisjoint(skipped_at), "an occurrence both fired and skipped"
    assert first.occurrence is not None
    assert min(skipped_at) > first.occurrence
    # Every second from the first occurrence on was decided exactly once: fired, skipped for
    # overlap, or (on a machine too slow for the grace) dropped. None left behind, none twice.
    close_old_connections()
    dropped_at = [
        at
        for record in Occurrence.objects.filter(task=TASK, outcome="dropped")
        for at in seconds_of(record)
    ]
    decided = sorted([*fired, *skipped_at, *dropped_at])  # type: ignore[type-var]
    assert len(decided) == len(set(decided))
    assert decided[0] == first.occurrence
    span = int((decided[-1] - decided[0]).total_seconds()) + 1  # type: ignore[operator]
    assert len(decided) == span, "an occurrence was neither fired nor recorded"


def test_overlap_skip__a_celery_entry_s_outbox_row_holds_back_later_occurrences(
    tmp_path: Path, processes: list[Process]
) -> None:
    # No relay runs: the first occurrence's row waits in the outbox, and counts as busy.
    task = "acceptance.relay_exclusive"
    env = {"ULTIMAT3_ACCEPTANCE_RELAY": "1", "ULTIMAT3_ACCEPTANCE_RELAY_EXCLUSIVE": "1"}
    scheduler = spawn(tmp_path, "scheduler", "run_scheduler", settings_overrides=FAST, env=env)
    processes.append(scheduler)

    def rows() -> list[Job]:
        close_old_connections()
        return list(Job.objects.filter(task=task))

    def held() -> list[Occurrence]:
        close_old_connections()
        return list(Occurrence.objects.filter(task=task, outcome="overlap"))

    wait_for(lambda: sum(r.count for r in held()) >= 2, 60, "two occurrences skipped")
    [row] = rows()
    assert (row.status, row.relay, row.name) == (JobStatus.OUTBOX, "celery", "demo.plain_row")
    assert row.occurrence is not None
    assert {r.detail for r in held()} == {
        f"overlap=skip: {row.occurrence.isoformat().replace('+00:00', 'Z')} not done yet"
    }
    stop_all(processes)
    assert len(rows()) == 1
