"""Behind a transaction-pooling PgBouncer, as the README says to run there: ``run_worker
--no-listen`` runs every job once and ``run_scheduler --leader lease`` dispatches every
occurrence once; with Django's ``prepare_threshold`` set (which such a pooler, before 1.21,
cannot honour) they say so by a code and a fix, and still do."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from testproject.demo.models import Ping
from testproject.demo.tasks import ping
from ultimat3_jobs.models import Job, JobStatus

from ..pgbouncer_server import PgBouncer
from .helpers import Process, process_database_url, processes, spawn, stop_all, wait_for
from .test_scheduler_processes import FAST as SCHEDULER_FAST
from .test_scheduler_processes import assert_every_occurrence_exactly_once, occurrences
from .test_worker_processes import FAST

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

JOBS = 300


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    """One server connection for every client: each transaction runs on a backend other
    clients' transactions ran on, which is what transaction pooling may do at any time."""
    pooler = PgBouncer(process_database_url(), pool_size=1)
    try:
        yield pooler
    finally:
        pooler.stop()


@pytest.fixture
def bouncer_of_four() -> Iterator[PgBouncer]:
    """Four server connections: a client's transactions land on whichever is free, one after
    the other, so a session-level statement prepared on one backend is missing on the next."""
    pooler = PgBouncer(process_database_url(), pool_size=4)
    try:
        yield pooler
    finally:
        pooler.stop()


def _drain(
    tmp_path: Path, processes: list[Process], name: str, url: str, workers: int = 1
) -> list[Process]:
    """``JOBS`` pings drained by ``workers`` processes of ``run_worker --burst --no-listen``
    connected at ``url``."""
    with transaction.atomic():
        for n in range(JOBS):
            ping.enqueue({"label": f"{name}-{n:03d}"})
    argv = ["run_worker", "--burst", "--no-listen", "--concurrency", "4"]
    started = [
        spawn(tmp_path, f"{name}-{n}", *argv, settings_overrides=FAST, env={"DATABASE_URL": url})
        for n in range(workers)
    ]
    processes.extend(started)
    for worker in started:
        assert worker.wait(120) == 0, worker.log_path.read_text()[-3000:]
    return started


def _ran_once(name: str) -> None:
    states = Counter(Job.objects.values_list("status", "attempts"))
    assert states == {(JobStatus.SUCCEEDED, 1): JOBS}
    ran = Counter(Ping.objects.values_list("label", flat=True))
    assert ran == {f"{name}-{n:03d}": 1 for n in range(JOBS)}


def _failures(process: Process) -> list[dict[str, Any]]:
    """The lines of what failed: each carries a code."""
    return [event for event in process.events() if "code" in event]


def test_no_listen__runs_every_job_once_with_nothing_failing(
    tmp_path: Path, processes: list[Process], bouncer: PgBouncer
) -> None:
    [worker] = _drain(tmp_path, processes, "pooled", bouncer.url())
    _ran_once("pooled")
    assert _failures(worker) == []


def test_no_listen__backends_that_change_under_each_client__every_job_once_nothing_failing(
    tmp_path: Path, processes: list[Process], bouncer_of_four: PgBouncer
) -> None:
    """The start marks, prepared by name, may meet backends that lack them (prepared again
    there) or a client moved between its ``PREPARE`` and its ``EXECUTE`` (run unprepared from
    then on), as the pooler hands them out: no failure either way, and every job runs once,
    started once."""
    workers = _drain(tmp_path, processes, "rotated", bouncer_of_four.url(), 2)
    _ran_once("rotated")
    assert [event for worker in workers for event in _failures(worker)] == []


def test_prepare_threshold_set__the_failure_names_the_pooler_and_every_job_runs_once(
    tmp_path: Path, processes: list[Process], bouncer: PgBouncer
) -> None:
    workers = _drain(tmp_path, processes, "prepared", bouncer.url("?prepare_threshold=0"), 2)
    _ran_once("prepared")
    failures = [event for worker in workers for event in _failures(worker)]
    # The two dispatchers each name their first prepared statement "_pg3_0", on the one
    # backend they share: the second to prepare it is refused.
    assert failures, "no statement failed: the pooler did not share its backend"
    assert {event["code"] for event in failures} == {"jobs.prepared-statement-lost"}
    assert all("prepare_threshold" in event["fix"] for event in failures)
    # A statement fails, and its process then prepares nothing more: a handful of failures,
    # not one for every job.
    assert len(failures) <= JOBS // 10


def _scheduler(tmp_path: Path, name: str, url: str) -> Process:
    return spawn(
        tmp_path,
        name,
        "run_scheduler", "--leader", "lease",
        settings_overrides=SCHEDULER_FAST,
        env={"DATABASE_URL": url},
    )  # fmt: skip


@pytest.mark.parametrize("query", ["", "?prepare_threshold=0"], ids=["default", "prepared"])
def test_lease_schedulers__every_occurrence_once(
    tmp_path: Path, processes: list[Process], bouncer: PgBouncer, query: str
) -> None:
    url = bouncer.url(query)
    schedulers = [_scheduler(tmp_path, f"scheduler-{n}", url) for n in range(2)]
    processes.extend(schedulers)
    wait_for(lambda: len(occurrences()) >= 2, 30, "the first dispatches")
    started = time.time()
    wait_for(lambda: occurrences()[-1].timestamp() >= started + 3, 30, "three more seconds")
    stop_all(processes)
    assert [scheduler.popen.returncode for scheduler in schedulers] == [0, 0]
    assert len(assert_every_occurrence_exactly_once()) >= 5
    failures = [event for scheduler in schedulers for event in _failures(scheduler)]
    if not query:
        assert failures == []
    # The leader reconnects between rounds, and a new connection would prepare again: each
    # process fails once, then prepares nothing more on that database.
    assert {event["code"] for event in failures} <= {"jobs.prepared-statement-lost"}
    assert len(failures) <= len(schedulers)
