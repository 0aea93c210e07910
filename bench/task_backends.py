"""Django Tasks: enqueue-and-run throughput of ``JobsBackend`` next to django-tasks-db.

Both backends get the same no-op task, the same PostgreSQL and the same shape of run: the
workers are started and idle first, then N tasks are enqueued one by one (each its own
transaction, as a view would), and the clock stops at the last task's finish as its row
records it. ``run_worker`` runs with ``--concurrency`` threads; ``db_worker`` runs one task
at a time per process, so it is measured with one and with as many processes as we have
threads. The enqueues alone, with no worker running, next to the peer's. Then a backlog (5,000
by default) drained by one worker process from its start to its exit: Django Tasks and the
same no-op as a @job with ``run_worker --burst``, and django-tasks-db with ``db_worker
--batch``. Run: ``python -m bench`` (needs the ``bench`` extra: ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = "bench.tasks_settings"


def _ready() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def _clean() -> None:
    from django_tasks_db.models import DBTaskResult

    from ultimat3_jobs.models import Job, Node

    Job.objects.filter(queue="bench").delete()
    DBTaskResult.objects.filter(queue_name="bench").delete()
    Node.objects.filter(role="worker").delete()


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def _start(argv: list[str], count: int) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS}
    return [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)


def _measure(
    task: Any, n: int, workers: list[subprocess.Popen[bytes]], done: Callable[[], datetime | None]
) -> tuple[float, float]:
    """(tasks enqueued per second, tasks enqueued and run per second)."""
    from django.db import close_old_connections

    try:
        began = datetime.now(UTC)
        start = time.perf_counter()
        for i in range(n):
            task.enqueue(i)
        enqueue_rate = n / (time.perf_counter() - start)
        finished: list[datetime] = []

        def all_done() -> bool:
            close_old_connections()
            last = done()
            if last is not None:
                finished.append(last)
            return last is not None

        _wait_until(all_done, 600, f"{n} tasks to succeed")
        return enqueue_rate, n / (finished[-1] - began).total_seconds()
    finally:
        _stop(workers)


def _backlog(
    task: Any, n: int, start: Callable[[], list[subprocess.Popen[bytes]]], rows: Any
) -> float:
    """Tasks per second a backlog of ``n`` drains at: first start to last finish, from rows."""
    from django.db import close_old_connections
    from django.db.models import Max, Min

    for i in range(n):
        task.enqueue(i)
    workers = start()
    try:

        def all_done() -> bool:
            close_old_connections()
            return bool(rows().filter(finished_at__isnull=False).count() >= n)

        _wait_until(all_done, 600, f"a backlog of {n} tasks to drain")
        span = rows().aggregate(first=Min("started_at"), last=Max("finished_at"))
        return float(n / (span["last"] - span["first"]).total_seconds())
    finally:
        _stop(workers)
        _clean()


def backlog_jobs_backend(n: int, concurrency: int) -> float:
    from ultimat3_jobs.models import Job

    from .tasks import noop_jobs

    argv = ["run_worker", "--queues", "bench", "--concurrency", str(concurrency)]
    return _backlog(
        noop_jobs, n, lambda: _start(argv, 1), lambda: Job.objects.filter(queue="bench")
    )


def backlog_db_worker(n: int, processes: int) -> float:
    from django_tasks_db.models import DBTaskResult

    from .tasks import noop_db

    return _backlog(
        noop_db,
        n,
        lambda: _start(DB_WORKER, processes),
        lambda: DBTaskResult.objects.filter(queue_name="bench"),
    )


DB_WORKER = [
    "db_worker",
    "--backend",
    "db",
    "--queue-name",
    "bench",
    "--interval",
    "0.05",
    "--no-startup-delay",
]


def measure_jobs_backend(n: int, concurrency: int) -> tuple[float, float]:
    from ultimat3_jobs.models import Job, Node

    from .tasks import noop_jobs

    argv = ["run_worker", "--queues", "bench", "--concurrency", str(concurrency)]
    workers = _start(argv, 1)
    _wait_until(
        lambda: Node.objects.filter(role="worker", stopped_at__isnull=True).exists(),
        60,
        "run_worker to start",
    )
    time.sleep(0.5)  # Let it settle into LISTEN.

    def done() -> datetime | None:
        rows = Job.objects.filter(queue="bench")
        if rows.filter(status="succeeded").count() < n:
            return None
        return max(at for at in rows.values_list("finished_at", flat=True) if at is not None)

    try:
        return _measure(noop_jobs, n, workers, done)
    finally:
        _clean()


def measure_db_worker(n: int, processes: int) -> tuple[float, float]:
    from django_tasks_db.models import DBTaskResult

    from .tasks import noop_db

    workers = _start(DB_WORKER, processes)
    time.sleep(3)  # No heartbeat to wait for: give the processes time to import and poll.

    def done() -> datetime | None:
        rows = DBTaskResult.objects.filter(queue_name="bench")
        if rows.filter(status="SUCCESSFUL").count() < n:
            return None
        return max(at for at in rows.values_list("finished_at", flat=True) if at is not None)

    try:
        return _measure(noop_db, n, workers, done)
    finally:
        _clean()


def _burst(argv: list[str], enqueue: Callable[[], None], n: int) -> float:
    """Tasks per second a backlog of ``n`` (enqueued first by ``enqueue``) drains at, one worker
    process that exits once nothing is left: its start to its exit, as a user's clock sees it."""
    enqueue()
    start = time.perf_counter()
    [worker] = _start(argv, 1)
    if worker.wait(600) != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with status {worker.returncode}")
    return n / (time.perf_counter() - start)


def measure_enqueues(n: int, rounds: int) -> dict[str, list[float]]:
    """Tasks per second ``enqueue()`` takes one by one (a transaction each, as a view would)
    with no worker running, so that no worker's CPU is taken from it: ``JobsBackend`` and
    django-tasks-db, ``rounds`` times each, interleaved."""
    from .tasks import noop_db, noop_jobs

    rates: dict[str, list[float]] = {"task": [], "db": []}
    for _ in range(rounds):
        for key, task in (("task", noop_jobs), ("db", noop_db)):
            start = time.perf_counter()
            for i in range(n):
                task.enqueue(i)
            rates[key].append(n / (time.perf_counter() - start))
            _clean()
    return rates


def measure_bursts(n: int, concurrency: int, rounds: int) -> dict[str, list[float]]:
    """The same backlog of ``n`` no-op Django Tasks and @jobs, each drained by
    ``run_worker --burst``, and the tasks by ``db_worker --batch``: ``rounds`` times each,
    interleaved (the peer's rate, bound by a commit per task, moves with the disk's)."""
    from django.db import transaction
    from django_tasks_db.models import DBTaskResult

    from ultimat3_jobs.models import Job

    from . import worker as jobs_bench
    from .tasks import noop_db, noop_jobs

    burst = ["run_worker", "--burst", "--concurrency", str(concurrency)]
    rates: dict[str, list[float]] = {"task": [], "job": [], "db": []}

    def tasks(task: Any) -> Callable[[], None]:
        def enqueue() -> None:
            with transaction.atomic():
                for i in range(n):
                    task.enqueue(i)

        return enqueue

    for _ in range(rounds):
        rates["task"].append(_burst([*burst, "--queues", "bench"], tasks(noop_jobs), n))
        assert Job.objects.filter(queue="bench", status="succeeded").count() == n
        _clean()
        rates["job"].append(
            _burst(
                [*burst, "--queues", jobs_bench.QUEUE],
                lambda: jobs_bench._enqueue(n, "demo.noop"),
                n,
            )
        )
        assert jobs_bench._succeeded() == n
        jobs_bench._clean()
        rates["db"].append(_burst([*DB_WORKER, "--batch"], tasks(noop_db), n))
        assert DBTaskResult.objects.filter(queue_name="bench", status="SUCCESSFUL").count() == n
        _clean()
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1000, help="no-op tasks per measurement")
    parser.add_argument("--concurrency", type=int, default=4, help="run_worker threads")
    parser.add_argument("--backlog", type=int, default=5000, help="tasks in the burst backlog")
    parser.add_argument("--rounds", type=int, default=3, help="burst rounds of each")
    args = parser.parse_args(argv)
    try:
        import django_tasks_db  # noqa: F401
    except ImportError:
        print("Django Tasks benchmark: needs the bench extra (pip install -e '.[bench]')")
        return
    _ready()
    from django.db import connection

    if connection.vendor != "postgresql":
        print("Django Tasks benchmark: needs PostgreSQL (make bench starts a throwaway cluster)")
        return
    _clean()
    n, c = args.tasks, args.concurrency
    rows = [
        (
            "JobsBackend, run_worker --concurrency 1",
            *measure_jobs_backend(n, 1),
            backlog_jobs_backend(n, 1),
        ),
        (
            f"JobsBackend, run_worker --concurrency {c}",
            *measure_jobs_backend(n, c),
            backlog_jobs_backend(n, c),
        ),
        ("django-tasks-db, 1 db_worker process", *measure_db_worker(n, 1), backlog_db_worker(n, 1)),
        (
            f"django-tasks-db, {c} db_worker processes",
            *measure_db_worker(n, c),
            backlog_db_worker(n, c),
        ),
    ]
    floor, backlog_floor = rows[2][2], rows[2][3]
    print(f"\nDjango Tasks backends (no-op task, {n} per run; PostgreSQL)")
    header = (
        f"{'':<42} | {'enqueue/s':>9} | {'enqueue+run/s':>13} | {'vs db':>6} | "
        f"{'backlog/s':>9} | {'vs db':>6}"
    )
    print(header)
    print("-" * len(header))
    for label, enqueue_rate, rate, backlog in rows:
        print(
            f"{label:<42} | {enqueue_rate:>9.0f} | {rate:>13.0f} | {rate / floor:>5.1f}x | "
            f"{backlog:>9.0f} | {backlog / backlog_floor:>5.1f}x"
        )
    print(
        "enqueue+run: tasks enqueued one by one (a transaction each) to idle workers, first "
        "enqueue to last finish; enqueue/s: those enqueues alone, the workers running the "
        "tasks meanwhile. backlog: the same tasks enqueued first, then the workers started; "
        "first start to last finish. vs db: against one db_worker process."
    )
    enqueues = measure_enqueues(n, args.rounds)
    ours, theirs = (statistics.median(enqueues[k]) for k in ("task", "db"))
    print(
        f"enqueue alone, no worker running ({n} tasks one by one, a transaction each; median of "
        f"{args.rounds} interleaved rounds): JobsBackend {ours:.0f}/s, django-tasks-db "
        f"{theirs:.0f}/s, {ours / theirs:.2f}x"
    )
    for key in ("task", "db"):
        print(f"  {key} rounds: {', '.join(f'{rate:.0f}' for rate in enqueues[key])}")
    rates = measure_bursts(args.backlog, c, args.rounds)
    task, job, db = (statistics.median(rates[k]) for k in ("task", "job", "db"))
    print(
        f"\nA backlog of {args.backlog:,} no-op tasks, one worker process from its start to its "
        f"exit (run_worker --burst --concurrency {c} and db_worker --batch, median of "
        f"{args.rounds} interleaved rounds)"
    )
    header = f"{'':<44} | {'tasks/s':>8} | {'vs @job':>7} | {'vs db':>7} | goal"
    print(header)
    print("-" * len(header))
    for label, rate, goal in (
        ("Django Tasks on JobsBackend, run_worker", task, ">= 0.8x @job, >= 20x db"),
        ("@job (the same no-op), run_worker", job, ""),
        ("django-tasks-db, db_worker --batch", db, ""),
    ):
        print(f"{label:<44} | {rate:>8.0f} | {rate / job:>6.2f}x | {rate / db:>6.1f}x | {goal}")
    for key in ("task", "job", "db"):
        print(f"  {key} rounds: {', '.join(f'{rate:.0f}' for rate in rates[key])}")


if __name__ == "__main__":
    main(sys.argv[1:])
