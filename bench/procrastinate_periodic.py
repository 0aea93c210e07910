"""procrastinate's periodic deferrer at N periodic tasks, for the scheduler table.

procrastinate 3.x with its psycopg connector, on the cluster of $DATABASE_URL in a database of
its own (dropped and made again each run). One minute's worth: every task deferred once for the
same cron tick, which is what its deferrer does each minute (one statement per task). Timed for
``REPEATS`` minutes in a row, one after the other, and the median reported, as our rounds are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DATABASE = "ultimat3_bench_procrastinate"
REPEATS = 5


def _conninfo(dbname: str) -> str:
    url = urlsplit(os.environ["DATABASE_URL"])
    scheme = "postgresql" if url.scheme.startswith("postgres") else url.scheme
    return urlunsplit((scheme, url.netloc, f"/{dbname}", url.query, ""))


def _fresh_database() -> None:
    import psycopg

    url = urlsplit(os.environ["DATABASE_URL"])
    with psycopg.connect(_conninfo(url.path.lstrip("/") or "postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        conn.execute(f"CREATE DATABASE {DATABASE}")


async def _run(n: int, repeats: int) -> list[float]:
    import procrastinate
    from procrastinate.periodic import PeriodicDeferrer

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=_conninfo(DATABASE)))
    for i in range(n):

        def ping(timestamp: int) -> None:
            """A no-op periodic task."""

        app.periodic(cron="* * * * *", periodic_id=f"p{i}")(app.task(name=f"bench.p{i:05d}")(ping))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        deferrer = PeriodicDeferrer(registry=app.periodic_registry)
        first = (time.time() // 60) * 60 + 1  # one second after a minute's tick
        elapsed = []
        for minute in range(repeats):
            at = first + 60 * minute
            start = time.perf_counter()
            await deferrer.defer_jobs(jobs_to_defer=deferrer.get_previous_tasks(at=at))
            elapsed.append(time.perf_counter() - start)
        async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined, unused-ignore]
            row = await (await conn.execute("SELECT count(*) FROM procrastinate_jobs")).fetchone()
        assert row is not None and row[0] == n * repeats, (row, n, repeats)
    return elapsed


def measure(n: int) -> dict[str, Any] | None:
    """Run in a process of its own; None when procrastinate is not installed."""
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return None
    out = subprocess.run(
        [sys.executable, "-m", "bench.procrastinate_periodic", "--n", str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from importlib.metadata import version

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    _fresh_database()
    runs = asyncio.run(_run(args.n, args.repeats))
    print(
        json.dumps(
            {
                "n": args.n,
                "s": statistics.median(runs),
                "runs": runs,
                "version": version("procrastinate"),
            }
        )
    )


if __name__ == "__main__":
    main()
