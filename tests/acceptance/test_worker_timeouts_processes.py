"""Real ``run_worker`` processes meeting jobs that hang past their timeout or crash their
process, in the thread pool and the process pool (``--pool process``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from testproject.demo.models import Ping
from testproject.demo.tasks import (
    exit_hard,
    grow,
    hang,
    hang_in_subprocess,
    hold_the_gil,
    kill_own_process,
    ping,
    ping_pid,
)
from ultimat3_jobs.models import Job, JobStatus

from .helpers import Process, processes, spawn, wait_for
from .test_worker_processes import job_row, node_of, start_worker

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

POOLS = ["thread", "process"]


def _pids(label: str) -> list[int]:
    """The processes that ran the ``ping_pid``/``grow`` jobs labelled ``label``, in order."""
    rows = Ping.objects.filter(label__startswith=f"{label} ").order_by("id")
    return [int(row.label.rsplit(" ", 1)[1]) for row in rows]


@pytest.mark.parametrize("pool", POOLS)
def test_a_job_past_its_timeout__ends_within_seconds_and_the_slot_runs_the_next(
    tmp_path: Path, processes: list[Process], pool: str
) -> None:
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "1", "--pool", pool)
    node = node_of(worker)
    started = tmp_path / "started"
    stuck = hang.enqueue({"label": "stuck", "seconds": 600, "started": str(started)})
    after = ping.enqueue({"label": "after"})
    wait_for(started.exists, 30, "the hanging job to start")
    began = time.monotonic()
    wait_for(lambda: job_row(stuck.job_id).status == JobStatus.FAILED, 10, "the timeout")
    assert time.monotonic() - began < 5
    row = job_row(stuck.job_id)
    assert "jobs.job.timeout" in row.last_error
    assert "timeout of 2s" in row.last_error
    assert (row.attempts, row.worker) == (1, node)
    wait_for(lambda: job_row(after.job_id).status == JobStatus.SUCCEEDED, 15, "the next job")
    assert job_row(after.job_id).worker == node
    assert worker.alive()
    (failed,) = worker.named("jobs.worker.job-failed")
    assert failed["code"] == "jobs.job.timeout"
    if pool == "thread":
        (abandoned,) = worker.named("jobs.worker.thread-abandoned")
        assert (abandoned["job"], abandoned["stuck"]) == (stuck.job_id, 1)
    else:
        (replaced,) = worker.named("jobs.worker.child-replaced")
        assert replaced["code"] == "jobs.job.timeout"


def test_a_child_still_starting__neither_runs_down_a_timeout_nor_marks_its_job_started(
    tmp_path: Path, processes: list[Process]
) -> None:
    # Queued before the worker starts: each slot's first job meets a child still setting
    # Django up, and six children starting at once on a small machine take seconds.
    started = [tmp_path / f"started-{n}" for n in range(6)]
    stuck = [
        hang.enqueue({"label": f"s{n}", "seconds": 600, "started": str(path)})
        for n, path in enumerate(started)
    ]
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "6", "--pool", "process")
    node_of(worker)
    ids = [made.job_id for made in stuck]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.FAILED).count() == 6,
        90,
        "every job to time out",
    )
    # Each timed out in its function, not in its child's start-up.
    assert [path.exists() for path in started] == [True] * 6
    rows = Job.objects.filter(pk__in=ids)
    assert all("jobs.job.timeout" in row.last_error and row.attempts == 1 for row in rows)


@pytest.mark.parametrize("pool", POOLS)
def test_what_a_timed_out_job_does_afterwards__never_changes_its_row(
    tmp_path: Path, processes: list[Process], pool: str
) -> None:
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "1", "--pool", pool)
    node_of(worker)
    started = tmp_path / "started"
    late = hang.enqueue({"label": "woke", "seconds": 3.5, "started": str(started)})
    wait_for(started.exists, 30, "the job to start")
    wait_for(lambda: job_row(late.job_id).status == JobStatus.FAILED, 10, "the timeout")
    failed = job_row(late.job_id)
    # Past the moment the job's own code would have returned and reported success.
    time.sleep(3)
    marker = ping.enqueue({"label": "marker"})
    wait_for(lambda: job_row(marker.job_id).status == JobStatus.SUCCEEDED, 15, "the marker")
    row = job_row(late.job_id)
    assert (row.status, row.attempts, row.finished_at, row.last_error) == (
        JobStatus.FAILED,
        1,
        failed.finished_at,
        failed.last_error,
    )
    woke = list(Ping.objects.filter(label="woke"))
    if pool == "thread":
        # The thread cannot be killed: its code went on, but its outcome was dropped.
        wait_for(lambda: worker.named("jobs.worker.thread-returned"), 5, "the thread's return")
        assert len(woke) == 1
    else:
        assert woke == []  # Killed: it never got there.


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no reaper took is as good as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_process_pool__a_timed_out_job_is_ended_with_the_processes_it_started(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "1", "--pool", "process")
    node_of(worker)
    pids = tmp_path / "pids"
    stuck = hang_in_subprocess.enqueue({"label": "stuck", "pids": str(pids)})
    wait_for(lambda: pids.exists() and pids.read_text(), 30, "the job's processes to start")
    started = [int(pid) for pid in pids.read_text().split()]
    try:
        assert all(_running(pid) for pid in started)
        wait_for(lambda: job_row(stuck.job_id).status == JobStatus.FAILED, 10, "the timeout")
        # The one that ignores SIGTERM is killed once the child's grace is over.
        wait_for(lambda: not any(_running(pid) for pid in started), 10, "its processes to end")
    finally:
        for pid in started:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)  # Left behind: not this test's to keep.
    assert "jobs.job.timeout" in job_row(stuck.job_id).last_error
    after = ping.enqueue({"label": "after"})
    wait_for(lambda: job_row(after.job_id).status == JobStatus.SUCCEEDED, 30, "the next job")
    assert worker.alive()


@pytest.mark.parametrize("crash", [exit_hard, kill_own_process], ids=["os_exit", "sigkill"])
def test_process_pool__a_job_that_kills_its_process_fails_alone_and_the_child_is_replaced(
    tmp_path: Path, processes: list[Process], crash: object
) -> None:
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "1", "--pool", "process")
    node = node_of(worker)
    before = ping_pid.enqueue({"label": "pid"})
    wait_for(lambda: job_row(before.job_id).status == JobStatus.SUCCEEDED, 30, "the first job")
    crashed = crash.enqueue({"label": "crash"})  # type: ignore[attr-defined]
    after = ping_pid.enqueue({"label": "pid"})
    wait_for(lambda: job_row(after.job_id).status == JobStatus.SUCCEEDED, 30, "the next job")
    row = job_row(crashed.job_id)
    assert (row.status, row.attempts, row.worker) == (JobStatus.FAILED, 1, node)
    assert "jobs.job.process-died" in row.last_error
    first, second = _pids("pid")
    assert first != second, "the child was not replaced"
    assert worker.pid not in (first, second)
    assert worker.alive()


def test_process_pool__a_worker_killed_outright_takes_its_children_with_it_whatever_they_hold(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(tmp_path, processes, "worker", "--concurrency", "1", "--pool", "process")
    started = tmp_path / "started"
    hold_the_gil.enqueue({"label": "hog", "started": str(started)})
    wait_for(started.exists, 30, "the job to hold the GIL")
    [child] = _pids("hog")
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    # A thread of the child that looks for its worker every second never gets the GIL: the
    # kernel ends the child as its worker dies, rather than leaving it to run beside a retry.
    wait_for(lambda: not _alive(child), 5, "the child to end with its worker")


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process still running (not a zombie awaiting its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_process_pool__a_worker_stopped_while_its_children_start_exits_at_once_and_cleanly(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = spawn(
        tmp_path,
        "worker",
        *("run_worker", "--concurrency", "4", "--pool", "process"),
        env={"DJANGO_SETTINGS_MODULE": "tests.slow_child_settings"},  # Its children: a minute.
    )
    processes.append(worker)
    node_of(worker)  # Its children are spawned now.
    worker.signal(signal.SIGTERM)
    began = time.monotonic()
    assert worker.wait(30) == 0
    # Their starts are given up: not the five seconds its threads are waited for, nor the two
    # minutes a child gets to be ready.
    assert time.monotonic() - began < 4
    (stopped,) = worker.named("jobs.worker.stopped")
    assert stopped["exit_code"] == 0
    log = worker.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log


def test_process_pool__max_jobs_per_child_recycles_children(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(
        tmp_path,
        processes,
        "worker",
        "--concurrency",
        "1",
        "--pool",
        "process",
        "--max-jobs-per-child",
        "2",
    )
    node_of(worker)
    made = [ping_pid.enqueue({"label": f"pid-{n}"}).job_id for n in range(6)]

    def all_ran() -> bool:
        return Job.objects.filter(pk__in=made, status=JobStatus.SUCCEEDED).count() == 6

    wait_for(all_ran, 60, "the six jobs")
    pids = [_pids(f"pid-{n}")[0] for n in range(6)]
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]
    assert len(set(pids)) == 3
    assert worker.pid not in pids


def test_process_pool__max_memory_per_child_recycles_a_child_that_grew_past_it(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(
        tmp_path,
        processes,
        "worker",
        "--concurrency",
        "1",
        "--pool",
        "process",
        "--max-memory-per-child",
        "250",
    )
    node_of(worker)
    small = grow.enqueue({"label": "small", "megabytes": 1})
    wait_for(lambda: job_row(small.job_id).status == JobStatus.SUCCEEDED, 30, "a small job")
    same = ping_pid.enqueue({"label": "same"})
    wait_for(lambda: job_row(same.job_id).status == JobStatus.SUCCEEDED, 30, "the next job")
    big = grow.enqueue({"label": "big", "megabytes": 300})
    wait_for(lambda: job_row(big.job_id).status == JobStatus.SUCCEEDED, 30, "the big job")
    fresh = ping_pid.enqueue({"label": "fresh"})
    wait_for(lambda: job_row(fresh.job_id).status == JobStatus.SUCCEEDED, 30, "the last job")
    assert _pids("small") == _pids("same") == _pids("big")
    assert _pids("fresh") != _pids("big")


def test_thread_pool__too_many_abandoned_threads__the_worker_drains_and_exits_0(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(
        tmp_path, processes, "worker", "--concurrency", "2", MAX_ABANDONED_THREADS=2
    )
    node_of(worker)
    slow = [hang.enqueue({"label": f"stuck-{n}", "seconds": 600}) for n in range(2)]
    wait_for(lambda: worker.named("jobs.worker.recycling"), 20, "the worker to recycle")
    assert worker.wait(15) == 0
    for made in slow:
        row = job_row(made.job_id)
        assert (row.status, row.attempts) == (JobStatus.FAILED, 1)
        assert "jobs.job.timeout" in row.last_error
    (stopped,) = worker.named("jobs.worker.stopped")
    assert (stopped["reason"], stopped["exit_code"]) == ("abandoned-threads", 0)
    (recycling,) = worker.named("jobs.worker.recycling")
    assert recycling["stuck"] == 2


def test_a_process_pool_drain_that_runs_out_of_grace__ends_its_children_before_its_last_line(
    tmp_path: Path, processes: list[Process]
) -> None:
    worker = start_worker(
        tmp_path, processes, "worker", "--concurrency", "2", "--pool", "process",
        "--drain-grace", "0.5",
    )  # fmt: skip
    node_of(worker)
    started = [tmp_path / f"started-{n}" for n in range(2)]
    jobs = [
        hang.enqueue({"label": f"held-{n}", "seconds": 30, "started": str(path)}).job_id
        for n, path in enumerate(started)
    ]
    wait_for(lambda: all(path.exists() for path in started), 30, "both jobs to start")

    worker.signal(signal.SIGTERM)

    assert worker.wait(30) == 1
    log = worker.log_path.read_text(errors="replace")
    events = [event["event"] for event in worker.events()]
    assert "jobs.worker.drain-timeout" in events
    assert events[-1] == "jobs.worker.stopped", events[events.index("jobs.worker.drain-timeout") :]
    assert "Exception ignored" not in log
    assert "process object is closed" not in log
    for job_id in jobs:  # One attempt each: given back failed, saying why.
        row = job_row(job_id)
        assert row.status == JobStatus.FAILED
        assert "stopped before this attempt finished" in row.last_error
    assert not Ping.objects.filter(label__startswith="held-").exists()
