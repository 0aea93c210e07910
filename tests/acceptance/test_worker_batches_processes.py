"""``run_worker`` processes with batched claims and finishes: drain, SIGKILL, LISTEN lost."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction

from testproject.demo.models import Ping
from testproject.demo.tasks import ping
from ultimat3_jobs.models import Job, JobStatus

from .helpers import Process, processes, wait_for
from .test_worker_processes import job_row, node_of, start_worker

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]


def _enqueue_pings(count: int, prefix: str) -> list[str]:
    labels = [f"{prefix}-{n:04d}" for n in range(count)]
    with transaction.atomic():
        for label in labels:
            ping.enqueue({"label": label})
    return labels


def test_sigterm_while_busy__writes_every_outcome_before_exiting(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "4")
    node_of(worker)
    _enqueue_pings(1500, "busy")
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() >= 50,
        30,
        "the worker to get going",
        step=0.02,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    # Nothing is left running: every job that ran has its outcome written, and the jobs
    # claimed ahead but never started went back to the queue with no attempt used.
    states = Counter(Job.objects.values_list("status", "attempts", "worker"))
    assert set(states) <= {(JobStatus.SUCCEEDED, 1, job_worker(worker)), (JobStatus.QUEUED, 0, "")}
    succeeded = set(
        Job.objects.filter(status=JobStatus.SUCCEEDED).values_list("input__label", flat=True)
    )
    ran = Counter(Ping.objects.values_list("label", flat=True))
    assert set(ran) == succeeded
    assert set(ran.values()) == {1}
    (stopped,) = worker.named("jobs.worker.stopped")
    assert (stopped["exit_code"], stopped["succeeded"]) == (0, len(succeeded))


def job_worker(process: Process) -> str:
    return str(process.named("jobs.worker.started")[0]["node"])


def test_sigkill_while_busy__every_job_ends_succeeded_with_one_run_per_attempt_at_most(
    tmp_path: Path, processes: list[Process]
) -> None:
    workers = [start_worker(tmp_path, processes, f"worker-{n}", "--concurrency", "4") for n in "ab"]
    nodes = {node_of(worker): worker for worker in workers}
    labels = _enqueue_pings(1000, "kill")
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() >= 100,
        30,
        "the workers to get going",
        step=0.02,
    )
    # The victim holds jobs: some running, some claimed ahead, some run but not recorded.
    victim_node = wait_for(
        lambda: (
            Job.objects.filter(status=JobStatus.RUNNING, worker__in=list(nodes))
            .values_list("worker", flat=True)
            .first()
        ),
        30,
        "a worker holding jobs",
        step=0.01,
    )
    victim = nodes.pop(victim_node)
    victim.signal(signal.SIGKILL)
    assert victim.wait(5) == -signal.SIGKILL
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == len(labels),
        60,
        "the survivor to finish everything, the victim's jobs included",
    )
    attempts = dict(Job.objects.values_list("input__label", "attempts"))
    ran = Counter(Ping.objects.values_list("label", flat=True))
    assert set(ran) == set(labels)
    # A job the victim ran but had not recorded runs again, on an attempt of its own.
    assert all(ran[label] <= attempts[label] for label in labels)
    ((survivor,),) = [list(nodes.values())]
    assert survivor.named("jobs.worker.recovered")


def test_listen_lost__the_worker_listens_again_and_a_notify_wakes_it(
    tmp_path: Path, processes: list[Process]
) -> None:
    # Polls and heartbeats far apart: within the test only a NOTIFY can get a job claimed.
    worker = start_worker(
        tmp_path,
        processes,
        "worker",
        WORKER_POLL_INTERVAL=120,
        HEARTBEAT_INTERVAL=60,
        WORKER_STALE_AFTER=180,
    )
    node_of(worker)
    wait_for(lambda: worker.named("jobs.worker.listening"), 20, "LISTEN")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'ultimat3_jobs worker listen' "
            "AND datname = current_database()"
        )
        assert cursor.fetchall() == [(True,)]
    wait_for(lambda: worker.named("jobs.worker.listen-lost"), 20, "the loss to be noticed")
    (again,) = wait_for(
        lambda: [e for e in worker.named("jobs.worker.listening") if e["regained"]],
        20,
        "LISTEN to come back",
    )
    time.sleep(0.5)  # Let the claim its return wakes pass, so it cannot find the job below.
    made = ping.enqueue({"label": "after the loss"})
    wait_for(lambda: job_row(made.job_id).status == JobStatus.SUCCEEDED, 30, "the job to run")
    assert list(Ping.objects.values_list("label", flat=True)) == ["after the loss"]
    assert again["regained"] is True
