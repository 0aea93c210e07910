"""Several ``run_scheduler`` processes on one PostgreSQL: kills, signals, lost connections.

Each test runs a per-second run-all task and ends by checking the job table: every occurrence
in the window exactly once, and no second missing, whatever was done to the leaders.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import cast

import psycopg
import pytest
from django.db import close_old_connections, connection
from django.db.models import Count

from ultimat3_jobs.models import Job, Node, Task

from .helpers import (
    Process,
    processes,
    restart_throwaway_postgres,
    spawn,
    stop_all,
    throwaway_cluster,
    wait_for,
    waiting_on,
)

__all__ = ["processes"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]

TASK = "acceptance.every_second"
DJANGO_TASK = "acceptance.django_task_every_second"
FAST = {"TICK_INTERVAL": 0.2, "LEASE_TTL": 2, "HEARTBEAT_INTERVAL": 1}


def occurrences(task: str = TASK) -> list[datetime]:
    close_old_connections()
    rows = Job.objects.filter(task=task).order_by("occurrence")
    return cast(list[datetime], list(rows.values_list("occurrence", flat=True)))


def assert_every_occurrence_exactly_once(task: str = TASK) -> list[datetime]:
    seen = occurrences(task)
    assert seen, "nothing was dispatched"
    duplicates = (
        Job.objects.filter(task=task).values("occurrence").annotate(n=Count("id")).filter(n__gt=1)
    )
    assert list(duplicates) == []
    expected = int((seen[-1] - seen[0]).total_seconds()) + 1
    missing = expected - len(set(seen))
    assert missing == 0, f"{missing} occurrences missing between {seen[0]} and {seen[-1]}"
    return seen


def current_leader(procs: list[Process]) -> Process | None:
    """The live process whose latest leadership event is an acquisition."""
    for process in procs:
        if not process.alive():
            continue
        events = [
            e["event"]
            for e in process.events()
            if e["event"]
            in ("jobs.scheduler.leadership-acquired", "jobs.scheduler.leadership-lost")
        ]
        if events and events[-1] == "jobs.scheduler.leadership-acquired":
            return process
    return None


def progress_after(moment: float, seconds: int = 2) -> Callable[[], bool]:
    """A condition: dispatching reached ``seconds`` past ``moment``."""

    def reached() -> bool:
        seen = occurrences()
        return bool(seen) and seen[-1].timestamp() >= moment + seconds

    return reached


def start_schedulers(
    tmp_path: Path, processes: list[Process], leader: str, count: int, **env: str
) -> None:
    for _ in range(count):
        processes.append(
            spawn(
                tmp_path,
                f"{leader}-{len(processes)}",
                "run_scheduler",
                "--leader",
                leader,
                settings_overrides=FAST,
                env=env,
            )
        )


@pytest.mark.parametrize("leader", ["advisory", "lease"])
def test_schedulers__leader_killed_repeatedly__every_occurrence_once(
    tmp_path: Path, processes: list[Process], leader: str
) -> None:
    start_schedulers(tmp_path, processes, leader, 3)
    wait_for(lambda: len(occurrences()) >= 2, 30, "the first dispatches")
    for _ in range(3):
        victim = wait_for(lambda: current_leader(processes), 15, "a leader")
        killed_at = time.time()
        victim.signal(signal.SIGKILL)
        victim.wait(5)
        # Keep three nodes: a replacement joins as the survivors take over.
        start_schedulers(tmp_path, processes, leader, 1)
        wait_for(progress_after(killed_at), 20, "dispatching to resume after a kill")
    stop_all(processes)
    assert all(p.popen.returncode in (0, -signal.SIGKILL) for p in processes)
    seen = assert_every_occurrence_exactly_once()
    assert len(seen) >= 8
    # The same rounds enqueue a Django Task (JobsBackend) beside the @job.
    assert len(assert_every_occurrence_exactly_once(DJANGO_TASK)) >= 8


@pytest.mark.parametrize(
    ("leader", "takeover_bound"), [("advisory", 0.2 + 1.5), ("lease", 2 + 1.5)]
)
def test_schedulers__sigterm_mid_round_drains_exits_0_and_another_node_takes_over(
    tmp_path: Path, processes: list[Process], leader: str, takeover_bound: float
) -> None:
    marker = tmp_path / "rounds.txt"
    marker.touch()
    start_schedulers(
        tmp_path,
        processes,
        leader,
        2,
        ULTIMAT3_ACCEPTANCE_SLOW="0.6",
        ULTIMAT3_ACCEPTANCE_MARKER=str(marker),
    )
    victim = wait_for(lambda: current_leader(processes), 30, "a leader")
    wait_for(lambda: victim.named("jobs.scheduler.dispatched"), 30, "a first round")

    def rounds_begun_by_victim() -> int:
        return sum(line.split()[0] == str(victim.pid) for line in marker.read_text().splitlines())

    # Land the signal inside a round: just after the leader began a slow task's entries.
    begun = rounds_begun_by_victim()
    wait_for(lambda: rounds_begun_by_victim() > begun, 10, "a round to begin", step=0.01)
    victim.signal(signal.SIGTERM)
    assert victim.wait(20) == 0
    events = [e["event"] for e in victim.events()]
    draining = events.index("jobs.scheduler.draining")
    assert victim.named("jobs.scheduler.draining")[0]["dispatching"] is True
    # The round in flight finished, then the node stopped.
    assert "jobs.scheduler.dispatched" in events[draining:]
    assert events[-1] == "jobs.scheduler.stopped"
    # Leadership is handed back right after the round in flight ends, before "stopped" is
    # logged: measure the takeover from the end of that round.
    stopped_at = datetime.fromisoformat(victim.named("jobs.scheduler.dispatched")[-1]["ts"])
    [survivor] = [p for p in processes if p is not victim]
    acquired = wait_for(
        lambda: [
            e
            for e in survivor.named("jobs.scheduler.leadership-acquired")
            if datetime.fromisoformat(e["ts"]) >= stopped_at
        ],
        15,
        "the other node to take over",
    )
    took = (datetime.fromisoformat(acquired[0]["ts"]) - stopped_at).total_seconds()
    assert took <= takeover_bound
    stop_all(processes)
    assert_every_occurrence_exactly_once()
    assert_every_occurrence_exactly_once("acceptance.slow")


def leader_backends() -> list[int]:
    close_old_connections()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
            WHERE a.application_name LIKE 'ultimat3_jobs scheduler leader %'
              AND l.locktype = 'advisory' AND l.granted
            """
        )
        return [row[0] for row in cursor.fetchall()]


def test_schedulers__terminated_leader_connection_never_double_dispatches(
    tmp_path: Path, processes: list[Process]
) -> None:
    start_schedulers(tmp_path, processes, "advisory", 2)
    wait_for(lambda: len(occurrences()) >= 2, 30, "the first dispatches")
    for _ in range(3):
        [backend] = wait_for(leader_backends, 15, "a lock holder")
        cut_at = time.time()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
        wait_for(progress_after(cut_at), 20, "dispatching to resume after the cut")
    noticed = [e for p in processes for e in p.named("jobs.leader.connection-lost")]
    assert noticed, "no node noticed that its lock connection was gone"
    stop_all(processes)
    assert all(p.popen.returncode == 0 for p in processes)
    assert_every_occurrence_exactly_once()


def test_scheduler__postgres_restart_underneath__keeps_going_and_loses_nothing(
    tmp_path: Path, processes: list[Process]
) -> None:
    if throwaway_cluster() is None:
        pytest.skip("restarting PostgreSQL needs the throwaway cluster `make test` starts")
    start_schedulers(tmp_path, processes, "advisory", 2)
    wait_for(lambda: len(occurrences()) >= 2, 30, "the first dispatches")
    assert restart_throwaway_postgres()
    restarted_at = time.time()
    wait_for(progress_after(restarted_at, 3), 45, "dispatching to resume after restart")
    assert all(p.alive() for p in processes), "a scheduler died with the database"
    failures = [e for p in processes for e in p.named("jobs.scheduler.tick-failed")]
    assert all("error" in e for e in failures)
    stop_all(processes)
    assert all(p.popen.returncode == 0 for p in processes)
    assert_every_occurrence_exactly_once()


def test_scheduler__a_second_signal_exits_at_once(tmp_path: Path, processes: list[Process]) -> None:
    marker = tmp_path / "rounds.txt"
    marker.touch()
    start_schedulers(
        tmp_path,
        processes,
        "advisory",
        1,
        ULTIMAT3_ACCEPTANCE_SLOW="30",
        ULTIMAT3_ACCEPTANCE_MARKER=str(marker),
    )
    [node] = processes
    wait_for(lambda: marker.read_text().strip(), 30, "a slow round to begin", step=0.05)
    node.signal(signal.SIGTERM)
    wait_for(lambda: node.named("jobs.scheduler.draining"), 10, "the drain to begin", step=0.05)
    sent = time.monotonic()
    node.signal(signal.SIGTERM)
    assert node.wait(10) == 1
    assert time.monotonic() - sent < 5  # not after the 30-second round
    assert node.named("jobs.scheduler.stopped") == []


def copying_task_rows() -> bool:
    """Whether a backend is in the COPY that writes new task rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE 'COPY ultimat3_jobs_task %%'"
        )
        [(count,)] = cursor.fetchall()
    return bool(count)


def test_scheduler__killed_while_copying_new_task_rows__none_stay_and_the_next_start_stores_all(
    tmp_path: Path, processes: list[Process]
) -> None:
    many = {"ULTIMAT3_ACCEPTANCE_MANY": "1500"}
    stalled = tmp_path / "stalled.txt"
    start_schedulers(
        tmp_path, processes, "advisory", 1, **many, ULTIMAT3_ACCEPTANCE_STALL=str(stalled)
    )
    [node] = processes
    # The last task's row is made by the thread that makes rows ahead, and it hangs there: the
    # COPY has taken the slices before it and waits for the rest.
    wait_for(stalled.exists, 60, "the last new task's row to be made")
    wait_for(copying_task_rows, 15, "the COPY of new task rows")
    node.signal(signal.SIGKILL)
    assert node.wait(10) == -signal.SIGKILL
    close_old_connections()
    mine = Task.objects.filter(name__startswith="acceptance.many.")
    assert not mine.exists()
    again = spawn(tmp_path, "again", "run_scheduler", "--once", settings_overrides=FAST, env=many)
    processes.append(again)
    assert again.wait(120) == 0
    close_old_connections()
    assert mine.count() == 1500
    assert {tuple(jobs) for jobs in mine.values_list("jobs", flat=True)} == {("acceptance.mark",)}


def test_scheduler__a_task_function_that_holds_its_round_is_named_while_it_does(
    tmp_path: Path, processes: list[Process]
) -> None:
    # Nothing can interrupt a task's function: the round waits for it, and so does a drain.
    # What the scheduler can do is say which task holds it, past STALE_ROUND_WARNING.
    marker = tmp_path / "rounds.txt"
    marker.touch()
    node = spawn(
        tmp_path,
        "slow",
        "run_scheduler",
        "--leader",
        "advisory",
        settings_overrides={**FAST, "STALE_ROUND_WARNING": 2},
        env={"ULTIMAT3_ACCEPTANCE_SLOW": "30", "ULTIMAT3_ACCEPTANCE_MARKER": str(marker)},
    )
    processes.append(node)
    wait_for(lambda: marker.read_text().strip(), 30, "a slow round to begin", step=0.05)

    [slow] = wait_for(lambda: node.named("jobs.scheduler.task-slow"), 10, "the task named")
    node.signal(signal.SIGTERM)
    wait_for(lambda: node.named("jobs.scheduler.draining"), 10, "the drain to begin", step=0.05)

    assert slow["task"] == "acceptance.slow"
    assert slow["running_s"] >= 2
    assert slow["draining"] is False
    assert 'make the function of task "acceptance.slow" return promptly' in slow["fix"]
    time.sleep(3)
    assert len(node.named("jobs.scheduler.task-slow")) == 1  # once a call
    node.signal(signal.SIGTERM)
    assert node.wait(10) == 1


def test_run_scheduler_once__killed_before_its_node_row_its_round_stands_and_no_live_row_is_left(
    tmp_path: Path, processes: list[Process]
) -> None:
    # A --once run writes its node row once, at its stop, after its round committed. Held up
    # there (the node table locked) and SIGKILLed, its round stands, nothing of it fires again,
    # and no row says a dead process is alive: a heartbeat written after the round and before
    # the stop, as a --once run wrote it, landed once the lock went, a live row for a dead node.
    arm = spawn(tmp_path, "arm", "run_scheduler", "--once", settings_overrides=FAST)
    processes.append(arm)
    assert arm.wait(60) == 0
    time.sleep(1.5)  # Due: the per-second task's occurrences since the arming.
    with psycopg.connect(**connection.get_connection_params()) as locker:
        locker.execute("LOCK TABLE ultimat3_jobs_node IN ACCESS EXCLUSIVE MODE")
        killed = spawn(tmp_path, "killed", "run_scheduler", "--once", settings_overrides=FAST)
        processes.append(killed)
        fired = wait_for(occurrences, 30, "the round's jobs to commit")
        wait_for(
            lambda: waiting_on(locker.info.backend_pid), 30, "its node row to wait on the lock"
        )
        killed.signal(signal.SIGKILL)
        assert killed.wait(5) == -signal.SIGKILL
        locker.rollback()
    again = spawn(tmp_path, "again", "run_scheduler", "--once", settings_overrides=FAST)
    processes.append(again)
    assert again.wait(60) == 0
    after = assert_every_occurrence_exactly_once()
    assert set(fired) <= set(after)
    close_old_connections()
    assert not Node.objects.filter(role="scheduler", stopped_at__isnull=True).exists()
