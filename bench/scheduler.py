"""Round cost at N tasks: all due at once, and nothing due; against a raw psycopg floor.

Each N runs in its own process so peak RSS belongs to that N. Run: ``python -m bench``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

SIZES = (100, 1_000, 10_000)
T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


def _tasks(n: int) -> list[Any]:
    from ultimat3_jobs.cron import parse
    from ultimat3_jobs.registry import JobHandle, TaskHandle, registry, resolve_zone

    ping = registry.get_job("demo.ping")
    assert ping is not None

    def entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        return [(ping, {"label": occurrence.isoformat()})]

    zone = resolve_zone("Europe/Paris", "bench")
    schedule = parse("* * * * *")
    return [
        TaskHandle(
            entries,
            name=f"bench.{i:05d}",
            schedule=schedule,
            zone=zone,
            catch_up="skip",
            max_catch_up=10,
        )
        for i in range(n)
    ]


def _reset() -> None:
    from ultimat3_jobs.models import Job, Node, Occurrence, Task

    for model in (Job, Occurrence, Task, Node):
        model.objects.all().delete()


def measure_ours(n: int, repeats: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ultimat3_jobs.clock import FrozenClock
    from ultimat3_jobs.models import Job, Occurrence, Task
    from ultimat3_jobs.scheduler import Scheduler
    from ultimat3_jobs.state import DatabaseState

    from .setup import peak_rss_mb

    tasks = _tasks(n)
    due_times, idle_times, due_queries, idle_queries = [], [], 0, 0
    for _ in range(repeats):
        _reset()
        clock = FrozenClock(T0)
        state = DatabaseState(node_id="bench", leader="sole", clock=clock)
        scheduler = Scheduler(state=state, clock=clock, tasks=tasks, drain_on_shutdown=False)
        state.sync(tasks)
        scheduler.tick()  # arm every task
        clock.advance(10)
        scheduler.tick()  # nothing due; writes the heartbeat that falls due every few seconds
        clock.advance(1)  # a steady-state round with nothing due
        with CaptureQueriesContext(connection) as idle:
            start = time.perf_counter()
            scheduler.tick()
            idle_times.append(time.perf_counter() - start)
        idle_queries = len(idle)
        clock.set(T0 + timedelta(seconds=30))  # every task due at 00:01:00
        with CaptureQueriesContext(connection) as due:
            start = time.perf_counter()
            fired = scheduler.tick()
            due_times.append(time.perf_counter() - start)
        due_queries = len(due)
        assert len(fired) == n, (len(fired), n)
        assert Job.objects.count() == n
        assert Occurrence.objects.filter(outcome="fired").count() == n
        assert Task.objects.filter(last_fired_at=clock()).count() == n
    return {
        "n": n,
        "due_s": statistics.median(due_times),
        "due_queries": due_queries,
        "idle_s": statistics.median(idle_times),
        "idle_queries": idle_queries,
        "rss_mb": peak_rss_mb(),
    }


def measure_floor(n: int, repeats: int) -> float:
    """N job rows in one transaction with one INSERT ... ON CONFLICT DO NOTHING, psycopg only."""
    import psycopg
    from django.db import connection

    params = connection.settings_dict
    _reset()
    times = []
    with psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
    ) as conn:
        for r in range(repeats):
            keys = [f"floor:{r}:{i}" for i in range(n)]
            now = datetime.now(UTC)
            start = time.perf_counter()
            with conn.transaction():
                conn.execute(
                    """
                    INSERT INTO ultimat3_jobs_job (name, key, input, status, queue, attempts,
                        max_attempts, run_at, created_at, last_error, task, occurrence, catch_up,
                        enqueued_by, worker)
                    SELECT 'demo.ping', k, '{}'::jsonb, 'queued', 'default', 0, 3, %s, %s, '',
                        'floor', %s, false, 'scheduler', ''
                    FROM unnest(%s::text[]) AS k
                    ON CONFLICT (key) DO NOTHING
                    """,
                    [now, now, now, keys],
                )
            times.append(time.perf_counter() - start)
    _reset()
    return statistics.median(times)


def run_one(n: int, repeats: int) -> dict[str, Any]:
    from .setup import django_ready

    django_ready()
    result = measure_ours(n, repeats)
    result["floor_s"] = measure_floor(n, repeats)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.repeats)))
        return
    rows = []
    for n in args.sizes:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.scheduler",
                "--one",
                str(n),
                "--repeats",
                str(args.repeats),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\nScheduler round cost (median of {args.repeats} runs; PostgreSQL)")
    header = (
        f"{'tasks':>7} | {'all due':>9} | {'queries':>7} | {'floor':>9} | {'ours/floor':>10} | "
        f"{'nothing due':>11} | {'queries':>7} | {'peak RSS':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['n']:>7} | {row['due_s'] * 1000:>7.1f}ms | {row['due_queries']:>7} | "
            f"{row['floor_s'] * 1000:>7.1f}ms | {row['due_s'] / row['floor_s']:>9.1f}x | "
            f"{row['idle_s'] * 1000:>9.2f}ms | {row['idle_queries']:>7} | {row['rss_mb']:>6.0f} MB"
        )
    print(
        "all due: one round enqueueing one job per task, watermarks and occurrence records in the "
        "same transaction; floor: the same N job rows by one psycopg INSERT in one transaction. "
        "nothing due: a steady-state round with the sole leader, whose one statement compares "
        "the clocks; a lease or advisory leader adds one, the heartbeat one every "
        "HEARTBEAT_INTERVAL."
    )


if __name__ == "__main__":
    main()
