"""Worker throughput: no-op jobs per second for one and two ``run_worker`` processes.

Measured against a floor: the worker's own claim and finish statements run by psycopg alone,
on one and on two connections. Everything happens in a queue of its own, so the benchmark
neither runs nor deletes anybody else's jobs. Run: ``python -m bench`` (PostgreSQL only).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "ultimat3-bench"

# The ORM statement a worker runs when a job succeeds, spelled out for psycopg.
FINISH = """
UPDATE ultimat3_jobs_job SET status = 'succeeded', finished_at = %s, last_error = ''
WHERE id = %s AND status = 'running' AND worker = %s
"""
INSERT = """
INSERT INTO ultimat3_jobs_job (name, key, input, status, queue, attempts, max_attempts, run_at,
    created_at, last_error, task, catch_up, enqueued_by, worker)
SELECT 'demo.noop', %(prefix)s || g, '{}'::jsonb, 'queued', %(queue)s, 0, 1, %(now)s, %(now)s,
    '', '', false, 'code', ''
FROM generate_series(1, %(n)s) AS g
"""


def _connect() -> Any:
    import psycopg
    from django.db import connection

    params = connection.settings_dict
    return psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        autocommit=True,
    )


def _enqueue(n: int) -> None:
    with _connect() as conn, conn.transaction():
        now = datetime.now(UTC)
        conn.execute(
            INSERT, {"prefix": f"bench:{uuid.uuid4().hex}:", "queue": QUEUE, "now": now, "n": n}
        )
        conn.execute("SELECT pg_notify('ultimat3_jobs', %s)", [QUEUE])


def _clean() -> None:
    with _connect() as conn:
        conn.execute("DELETE FROM ultimat3_jobs_job WHERE queue = %s", [QUEUE])


def _window_rate(n: int) -> float:
    """Jobs per second from the first start to the last finish, as the job rows record them."""
    with _connect() as conn:
        row = conn.execute(
            "SELECT count(*), min(started_at), max(finished_at) FROM ultimat3_jobs_job "
            "WHERE queue = %s AND status = 'succeeded'",
            [QUEUE],
        ).fetchone()
    count, first, last = row
    if count != n:
        raise RuntimeError(f"{count} of {n} jobs succeeded")
    return float(n / (last - first).total_seconds())


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def measure_raw(n: int, connections: int, batch: int) -> float:
    """The worker's claim (batches of ``batch``) and finish statements, psycopg alone."""
    from ultimat3_jobs.sql import CLAIM_QUEUES

    _enqueue(n)

    def drain(name: str) -> None:
        with _connect() as conn:
            while True:
                params = {
                    "now": datetime.now(UTC),
                    "limit": batch,
                    "worker": name,
                    "queues": [QUEUE],
                }
                rows = conn.execute(CLAIM_QUEUES, params).fetchall()
                if not rows:
                    return
                for row in rows:
                    conn.execute(FINISH, [datetime.now(UTC), row[0], name])

    threads = [threading.Thread(target=drain, args=(f"raw-{i}",)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = _window_rate(n)
    _clean()
    return rate


def measure_workers(n: int, processes: int, concurrency: int, conn_max_age: int | None) -> float:
    """``processes`` real ``run_worker`` processes, started and listening before the jobs land."""
    url = os.environ["DATABASE_URL"]
    if conn_max_age is not None:
        url += ("&" if "?" in url else "?") + f"conn_max_age={conn_max_age}"
    env = {**os.environ, "DATABASE_URL": url}
    argv = [
        sys.executable,
        str(ROOT / "manage.py"),
        "run_worker",
        "--queues",
        QUEUE,
        "--concurrency",
        str(concurrency),
    ]
    workers = [
        subprocess.Popen(
            argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        for _ in range(processes)
    ]
    pids = [worker.pid for worker in workers]
    try:

        def all_up() -> bool:
            with _connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM ultimat3_jobs_node WHERE role = 'worker' "
                    "AND stopped_at IS NULL AND pid = ANY(%s)",
                    [pids],
                ).fetchone()
            return bool(row and row[0] == processes)

        _wait_until(all_up, 60, "the workers to start")
        time.sleep(0.5)  # Let them settle into LISTEN.
        _enqueue(n)

        def all_done() -> bool:
            with _connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM ultimat3_jobs_job "
                    "WHERE queue = %s AND status = 'succeeded'",
                    [QUEUE],
                ).fetchone()
            return bool(row and row[0] == n)

        _wait_until(all_done, 600, f"{n} jobs to succeed")
        return _window_rate(n)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(60)
        _clean()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000, help="no-op jobs per measurement")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    args = parser.parse_args(argv)

    from .setup import django_ready

    django_ready()
    from django.db import connection

    if connection.vendor != "postgresql":
        print("worker benchmark: needs PostgreSQL (make bench starts a throwaway cluster)")
        return
    _clean()
    n, c = args.jobs, args.concurrency
    raw = {k: measure_raw(n, k, c) for k in (1, 2)}
    rows = []
    for conn_max_age in (None, 600):
        for k in (1, 2):
            rate = measure_workers(n, k, c, conn_max_age)
            label = f"{k} worker process{'es' if k > 1 else ''}"
            if conn_max_age is not None:
                label += f", CONN_MAX_AGE={conn_max_age}"
            rows.append((label, rate, raw[k]))

    print(f"\nWorker throughput (no-op jobs, {n} per run, --concurrency {c}; PostgreSQL)")
    header = f"{'':<40} | {'jobs/s':>8} | {'of raw':>7}"
    print(header)
    print("-" * len(header))
    for k in (1, 2):
        label = f"raw psycopg, {k} connection{'s' if k > 1 else ''}"
        print(f"{label:<40} | {raw[k]:>8.0f} | {'':>7}")
    for label, rate, floor in rows:
        print(f"{label:<40} | {rate:>8.0f} | {rate / floor:>6.0%}")
    print(
        f"raw: the worker's claim statement (batches of {c}) and its finish update, run by psycopg "
        "on N connections. Workers: first start to last finish, from the job rows; a busy "
        "worker thread keeps its connection whatever CONN_MAX_AGE says."
    )


if __name__ == "__main__":
    main(sys.argv[1:])
