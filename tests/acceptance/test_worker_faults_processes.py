"""Real ``run_worker`` processes meeting the faults a fleet meets: a worker SIGKILLed with jobs
claimed ahead, a job that kills its own worker, a result the database refuses."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django_tasks import TaskResultStatus

from testproject.demo import background
from testproject.demo.models import Ping
from testproject.demo.tasks import kill_own_worker, ping, ping_once, slow_ping
from ultimat3_jobs.models import Job, JobStatus

from .helpers import Process, processes, restart_throwaway_postgres, wait_for, waiting_on
from .test_worker_processes import job_row, node_of, start_worker

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

#: Jobs claimed ahead stay claimed: only a death (or a drain) gives them back.
HOLD = {"WORKER_POLL_INTERVAL": 30}


def _claimed_ahead(node: str) -> list[int]:
    """Jobs ``node`` holds that no thread of it started."""
    rows = Job.objects.filter(status=JobStatus.RUNNING, worker=node, started_at__isnull=True)
    return sorted(rows.values_list("pk", flat=True))


def _claimed_behind_a_slow_job(
    tmp_path: Path, processes: list[Process], seconds: float, count: int
) -> tuple[Process, str, Any, list[Any]]:
    """A one-thread worker running a slow job, ``count`` one-attempt jobs enqueued beside it:
    the worker, its node, the slow job and the others, once the slow one started."""
    victim = start_worker(tmp_path, processes, "victim", "--concurrency", "1", **HOLD)
    victim_node = node_of(victim)
    started = tmp_path / "started"
    with transaction.atomic():  # One commit, one NOTIFY: one claim takes them all.
        slow = slow_ping.enqueue({"label": "slow", "seconds": seconds, "started": str(started)})
        once = [ping_once.enqueue({"label": f"once-{n}"}) for n in range(count)]
    wait_for(started.exists, 15, "the slow job to start")
    return victim, victim_node, slow, once


def _kill(process: Process) -> None:
    process.signal(signal.SIGKILL)
    assert process.wait(5) == -signal.SIGKILL


def test_sigkill_with_jobs_claimed_ahead__each_runs_exactly_once_none_failed(
    tmp_path: Path, processes: list[Process]
) -> None:
    victim, victim_node, slow, once = _claimed_behind_a_slow_job(tmp_path, processes, 2, 5)
    ahead = wait_for(lambda: _claimed_ahead(victim_node), 5, "the jobs claimed ahead")
    assert ahead == sorted(made.job_id for made in once)
    _kill(victim)

    survivor = start_worker(tmp_path, processes, "survivor", "--concurrency", "2")
    node_of(survivor)
    every = [slow.job_id, *(made.job_id for made in once)]
    wait_for(
        lambda: Job.objects.filter(pk__in=every, status=JobStatus.SUCCEEDED).count() == 6,
        30,
        "every job to succeed",
    )
    attempts = dict(Job.objects.filter(pk__in=every).values_list("pk", "attempts"))
    # The slow one had started: its attempt counted. The five never had: one attempt each.
    assert attempts == {slow.job_id: 2, **{made.job_id: 1 for made in once}}
    assert Counter(Ping.objects.values_list("label", flat=True)) == {
        "slow": 1,
        **{f"once-{n}": 1 for n in range(5)},
    }
    (recovered,) = survivor.named("jobs.worker.recovered")
    assert (recovered["requeued"], recovered["released"], recovered["failed"]) == (1, 5, 0)


def test_sigkill_while_a_start_mark_waits_on_a_lock__it_never_lands_the_jobs_run_once(
    tmp_path: Path, processes: list[Process]
) -> None:
    # A deploy's migration locks the job table; the worker is SIGKILLed meanwhile. Its start
    # mark, left waiting, must not land once the lock goes: the jobs never ran.
    victim, victim_node, _, once = _claimed_behind_a_slow_job(tmp_path, processes, 1, 3)
    ids = sorted(made.job_id for made in once)
    assert wait_for(lambda: _claimed_ahead(victim_node), 5, "the jobs claimed ahead") == ids
    with psycopg.connect(**connection.get_connection_params()) as locker:
        locker.execute(
            "SELECT id FROM ultimat3_jobs_job WHERE id = ANY(%s) FOR UPDATE", [ids]
        ).fetchall()
        marks = wait_for(
            lambda: waiting_on(locker.info.backend_pid), 15, "a start mark to wait on the lock"
        )
        assert all("UPDATE" in mark or "EXECUTE" in mark for mark in marks), marks
        _kill(victim)
        time.sleep(1)  # The server's look for its client gone (db.CLIENT_CHECK_INTERVAL).
        locker.rollback()
    assert _claimed_ahead(victim_node) == ids  # None marked started after the death.

    survivor = start_worker(tmp_path, processes, "survivor", "--concurrency", "2")
    node_of(survivor)
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 3,
        30,
        "the jobs claimed ahead to succeed, each on its one attempt",
    )
    assert Counter(Ping.objects.values_list("label", flat=True)) == {
        "slow": 1, **{f"once-{n}": 1 for n in range(3)},
    }  # fmt: skip


def test_a_job_that_kills_its_worker__ends_failed_after_its_attempts_the_others_run(
    tmp_path: Path, processes: list[Process]
) -> None:
    first = start_worker(tmp_path, processes, "first", "--concurrency", "1", **HOLD)
    first_node = node_of(first)
    with transaction.atomic():
        # Due first: it is what the worker starts, the others wait claimed beside it.
        killer = kill_own_worker.enqueue({"label": "poison"})
        others = [ping.enqueue({"label": f"beside-{n}"}) for n in range(5)]
    assert first.wait(15) == -signal.SIGKILL
    assert _claimed_ahead(first_node) == sorted(made.job_id for made in others)
    assert job_row(killer.job_id).attempts == 1

    second = start_worker(tmp_path, processes, "second", "--concurrency", "1", **HOLD)
    assert second.wait(20) == -signal.SIGKILL  # Recovered the poison and ran it again.
    assert job_row(killer.job_id).attempts == 2

    third = start_worker(tmp_path, processes, "third", "--concurrency", "1")
    node_of(third)
    wait_for(
        lambda: job_row(killer.job_id).status == JobStatus.FAILED, 20, "the poison job to fail"
    )
    row = job_row(killer.job_id)
    assert row.attempts == 2
    assert "; no attempts left: its worker died during each of them" in row.last_error
    assert "[jobs.job.worker-lost]\nfix: find why the worker died" in row.last_error
    ids = [made.job_id for made in others]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == 5,
        20,
        "the jobs claimed beside it to succeed",
    )
    ran = Counter(Ping.objects.values_list("label", flat=True))
    assert set(ran) == {f"beside-{n}" for n in range(5)}
    # Each ran on an attempt of its own: one whose outcome was still unwritten when the poison
    # struck ran again, counted; none was failed for the poison's deaths.
    attempts = dict(Job.objects.filter(pk__in=ids).values_list("input__label", "attempts"))
    assert all(ran[label] <= attempts[label] for label in ran)
    assert third.alive()


def test_a_django_task_returning_a_nul__fails_within_seconds_and_the_next_job_runs(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(tmp_path, processes, "worker")
    node = node_of(worker)
    bad = background.unstorable.enqueue("text")
    began = time.monotonic()
    wait_for(lambda: job_row(int(bad.id)).status == JobStatus.FAILED, 10, "the task to end failed")
    assert time.monotonic() - began < 10
    bad.refresh()
    assert bad.status == TaskResultStatus.FAILED
    [error] = bad.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.ResultUnstorableError"
    assert "jobs.job.result-unstorable" in error.traceback
    good = background.add.enqueue(2, 3)
    wait_for(
        lambda: job_row(int(good.id)).status == JobStatus.SUCCEEDED, 10, "the next task to run"
    )
    good.refresh()
    assert good.return_value == 5
    assert {job_row(int(bad.id)).worker, job_row(int(good.id)).worker} == {node}
    assert worker.alive()


def test_a_database_outage_longer_than_the_stale_time__no_live_workers_job_is_taken(
    tmp_path: Path, processes: list[Process]
) -> None:
    # Nobody could heartbeat while the database was away: the worker that reaches it first
    # (here one started just then, as a supervisor restarts one) must not take the nap the
    # first worker is still running for a dead worker's.
    quick = {"WORKER_POLL_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "WORKER_STALE_AFTER": 3}
    first = start_worker(tmp_path, processes, "first", "--concurrency", "1", **quick)
    first_node = node_of(first)
    nap = background.nap.enqueue(12)
    job_id = int(nap.id)
    wait_for(lambda: job_row(job_id).started_at is not None, 15, "the nap to start")

    if not restart_throwaway_postgres(down_for=5):
        pytest.skip("stops and starts the suite's own throwaway cluster")
    second = start_worker(tmp_path, processes, "second", "--concurrency", "1", **quick)
    node_of(second)
    wait_for(lambda: job_row(job_id).status != JobStatus.RUNNING, 40, "the nap to end")

    row = job_row(job_id)
    assert (row.status, row.worker, row.attempts) == (JobStatus.SUCCEEDED, first_node, 1)
    assert not second.named("jobs.worker.recovered")
    assert not first.named("jobs.worker.job-lost")
