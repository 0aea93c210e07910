"""Worker throughput and latency, next to a floor and to procrastinate's worker, in one run.

- throughput: 5,000 no-op jobs, for one and two ``run_worker`` processes (default flags but
  ``--concurrency``, DEBUG off as in production), started and listening before the jobs land;
  then again with Django's ``prepare_threshold`` option at 5, so PostgreSQL keeps the plans of
  the worker's statements (Django's default never prepares: a transaction-pooling PgBouncer
  before 1.21 cannot hold prepared statements);
- floor: psycopg alone claims 100 rows (the worker's claim statement, FOR UPDATE SKIP LOCKED)
  and finishes them in one UPDATE, on one and two connections; and the same floor keeping the
  rule that an attempt counts only once its job started (SPEC section 11): the claim marks
  nothing started, and a job's start is committed before it may run, by the worker's mark
  statement, the threads starting jobs at one moment sharing one; in one process and in two,
  as the worker runs;
- procrastinate's worker (the ``bench`` extra), same no-op as a sync task, same concurrency,
  in a database of its own on the same server;
- latency at low load: a job committed (NOTIFY with it) -> its function started, p50/p99;
- latency from a per-second task's occurrence to its job (scheduler and worker processes, in
  a throwaway cluster only, since they run the demo's tasks);
- the claim's cost with 1,000,000 finished jobs in the table against an empty one, in a
  schema of its own (``--history 0`` skips it: building it takes a minute).

Everything of ours happens in a queue of its own, so the benchmark neither runs nor deletes
anybody else's jobs. Run: ``python -m bench.worker`` (PostgreSQL only).
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import statistics
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
PROCRASTINATE_DB = "ultimat3_bench_procrastinate"
HISTORY_SCHEMA = "ultimat3_bench_history"
RUN_PROCRASTINATE = "import sys; from bench.procrastinate_worker import main; main(sys.argv[1:])"
RUN_MARKED_FLOOR = "import sys; from bench.worker import marked_floor_process as m; m(sys.argv[1:])"

INSERT = """
INSERT INTO ultimat3_jobs_job (name, key, input, status, queue, attempts, max_attempts, run_at,
    created_at, last_error, task, catch_up, enqueued_by, worker)
SELECT %(name)s, %(prefix)s || g, %(input)s::jsonb, 'queued', %(queue)s, 0, 1, %(now)s, %(now)s,
    '', '', false, 'code', ''
FROM generate_series(1, %(n)s) AS g
"""
#: The floor's finish: a whole claimed batch in one statement, still conditional on the claimer.
FINISH_BATCH = """
UPDATE ultimat3_jobs_job SET status = 'succeeded', finished_at = %s, last_error = ''
WHERE id = ANY(%s) AND status = 'running' AND worker = %s
"""
FLOOR_BATCH = 100


def _params(dbname: str | None = None) -> dict[str, Any]:
    from django.db import connection

    settings = connection.settings_dict
    return {
        "dbname": dbname or settings["NAME"],
        "user": settings["USER"] or None,
        "password": settings["PASSWORD"] or None,
        "host": settings["HOST"] or None,
        "port": settings["PORT"] or None,
    }


def _connect(dbname: str | None = None) -> Any:
    import psycopg

    return psycopg.connect(**_params(dbname), autocommit=True)


def _enqueue(n: int, name: str = "demo.noop", data: str = "{}") -> None:
    with _connect() as conn, conn.transaction():
        conn.execute(
            INSERT,
            {
                "name": name,
                "input": data,
                "prefix": f"bench:{uuid.uuid4().hex}:",
                "queue": QUEUE,
                "now": datetime.now(UTC),
                "n": n,
            },
        )
        conn.execute("SELECT pg_notify('ultimat3_jobs', %s)", [QUEUE])


def _clean() -> None:
    with _connect() as conn:
        conn.execute("DELETE FROM ultimat3_jobs_job WHERE queue = %s", [QUEUE])
        conn.execute("DELETE FROM demo_ping WHERE label LIKE 'bench:%%'")


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


def _wait_until(
    condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def _succeeded() -> int:
    with _connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM ultimat3_jobs_job WHERE queue = %s AND status = 'succeeded'",
            [QUEUE],
        ).fetchone()
    return int(row[0])


# -- the floor ------------------------------------------------------------------------------------


def measure_floor(n: int, connections: int) -> float:
    """Claim 100 rows with the worker's claim statement, finish them in one UPDATE: psycopg."""
    from ultimat3_jobs.store.sql import CLAIM_PLANNER, CLAIM_QUEUES

    _enqueue(n)

    def drain(name: str) -> None:
        with _connect() as conn:
            while True:
                params = {
                    "now": datetime.now(UTC),
                    "limit": FLOOR_BATCH,
                    "start": FLOOR_BATCH,
                    "worker": name,
                    "queues": [QUEUE],
                }
                with conn.transaction():
                    conn.execute(CLAIM_PLANNER)  # The worker's plan, whatever the statistics say.
                    ids = [row[0] for row in conn.execute(CLAIM_QUEUES, params).fetchall()]
                if not ids:
                    return
                conn.execute(FINISH_BATCH, [datetime.now(UTC), ids, name])

    threads = [threading.Thread(target=drain, args=(f"floor-{i}",)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = _window_rate(n)
    _clean()
    return rate


class _GroupedMarks:
    """Start marks as SPEC section 11 wants them, with nothing else: a job's start is committed
    before it runs, and the threads that start jobs while a mark is being written share the
    next one (the worker's statement, ``sql.MARK_STARTED``). Written here rather than taken
    from ``attempts.StartMarks``, so the floor holds none of the worker's own code but its SQL.
    """

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.ready = threading.Condition()
        self.asked: list[tuple[int, int]] = []
        self.marked: set[int] = set()
        self.writing = False
        self.failed: BaseException | None = None

    def mark(self, conn: Any, job: tuple[int, int]) -> None:
        from ultimat3_jobs.store.sql import MARK_STARTED

        with self.ready:
            self.asked.append(job)
            while self.writing and job[0] not in self.marked and self.failed is None:
                self.ready.wait()
            if self.failed is not None:
                raise self.failed  # The floor is void: its measurement stops.
            if job[0] in self.marked:
                self.marked.discard(job[0])
                return
            self.writing = True
            group, self.asked = self.asked, []
        params = {
            "now": datetime.now(UTC),
            "ids": [pk for pk, _ in group],
            "attempts": [attempts for _, attempts in group],
            "worker": self.worker,
        }
        try:
            # Autocommit: one round trip, as the worker's.
            marked = conn.execute(MARK_STARTED, params).fetchall()
            if len(marked) != len(group):
                raise RuntimeError(f"the floor marked {len(marked)} of {len(group)} starts")
            with self.ready:
                self.marked.update(pk for pk, _ in group if pk != job[0])
        except BaseException as error:
            with self.ready:
                self.failed = error
            raise
        finally:
            with self.ready:
                self.writing = False
                self.ready.notify_all()


def _drain_marked(name: str, concurrency: int, ready: Callable[[], None]) -> None:
    """The floor of a worker that keeps SPEC section 11 (an attempt counts only once its job
    started): psycopg claims 100 rows without marking them started, ``concurrency`` threads
    each mark a job's start (``_GroupedMarks``) before taking the next, on connections of their
    own, and the batch is finished in one UPDATE once they are all through, until the queue is
    empty. No job runs; a thread that fails stops the measurement with its error. ``ready`` is
    called once the connections are open, before the first claim."""
    from ultimat3_jobs.store.sql import CLAIM_PLANNER, CLAIM_QUEUES

    marks = _GroupedMarks(name)
    inbox: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
    through: queue.SimpleQueue[int | BaseException] = queue.SimpleQueue()
    connected = threading.Barrier(concurrency + 1)

    def starter() -> None:
        try:
            with _connect() as conn:
                connected.wait()
                while (job := inbox.get()) is not None:
                    marks.mark(conn, job)
                    through.put(job[0])
        except BaseException as error:
            connected.abort()
            through.put(error)

    def passed() -> int:
        one = through.get()
        if isinstance(one, BaseException):
            raise one
        return one

    threads = [threading.Thread(target=starter) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        with _connect() as conn:
            connected.wait()
            ready()
            while True:
                params = {
                    "now": datetime.now(UTC),
                    "limit": FLOOR_BATCH,
                    "start": 0,
                    "worker": name,
                    "queues": [QUEUE],
                }
                with conn.transaction():
                    conn.execute(CLAIM_PLANNER)
                    rows = conn.execute(CLAIM_QUEUES, params).fetchall()
                if not rows:
                    break
                for row in rows:
                    inbox.put((row[0], row[5]))  # id, attempts (``CLAIMED_COLUMNS``)
                ids = [passed() for _ in rows]
                conn.execute(FINISH_BATCH, [datetime.now(UTC), ids, name])
    finally:
        connected.abort()  # Frees starters still waiting, should this thread not connect.
        for _ in threads:
            inbox.put(None)
        for thread in threads:
            thread.join()


def marked_floor_process(argv: list[str]) -> None:
    """One process of ``measure_marked_floor``: says ``ready`` once connected, drains the queue
    once told to go (a line on its standard input)."""
    from .setup import django_ready

    django_ready(migrate=False)  # For the database's parameters alone.

    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    _drain_marked(argv[0], int(argv[1]), ready)


def measure_marked_floor(n: int, concurrency: int, processes: int) -> float:
    """``_drain_marked`` in ``processes`` processes of their own on one queue of ``n`` jobs, as
    ``run_worker`` runs: each a claimer and ``concurrency`` marking threads, all connected
    before any claims."""
    _enqueue(n)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RUN_MARKED_FLOOR, f"floor-marked-{i}", str(concurrency)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a floor process exited with {child.wait()}")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            if code := child.wait(600):
                raise RuntimeError(f"a floor process exited with {code}")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    rate = _window_rate(n)
    _clean()
    return rate


# -- ours -----------------------------------------------------------------------------------------


class Workers:
    """``processes`` real ``run_worker`` processes on the bench queue, started and listening."""

    def __init__(
        self, processes: int, concurrency: int, pool: str = "thread", prepared: bool = False
    ) -> None:
        env = {**os.environ, "DEBUG": "false"}
        if prepared:
            # Django's option (its default: never), as a DATABASE_URL query puts it in OPTIONS.
            url = env["DATABASE_URL"]
            env["DATABASE_URL"] = f"{url}{'&' if '?' in url else '?'}prepare_threshold=5"
        argv = [
            sys.executable,
            str(ROOT / "manage.py"),
            "run_worker",
            "--queues",
            QUEUE,
            "--concurrency",
            str(concurrency),
            "--pool",
            pool,
        ]
        self.popens = [
            subprocess.Popen(
                argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            for _ in range(processes)
        ]

    def __enter__(self) -> Workers:
        pids = [popen.pid for popen in self.popens]

        def all_up() -> bool:
            with _connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM ultimat3_jobs_node WHERE role = 'worker' "
                    "AND stopped_at IS NULL AND pid = ANY(%s)",
                    [pids],
                ).fetchone()
            return bool(row and row[0] == len(pids))

        _wait_until(all_up, 60, "the workers to start")
        time.sleep(0.5)  # Let them settle into LISTEN.
        return self

    def __exit__(self, *exc: object) -> None:
        for popen in self.popens:
            popen.send_signal(signal.SIGTERM)
        for popen in self.popens:
            popen.wait(60)
        _clean()


def measure_workers(
    n: int, processes: int, concurrency: int, pool: str = "thread", prepared: bool = False
) -> float:
    with Workers(processes, concurrency, pool, prepared):
        _enqueue(n)
        # Counting scans the job table: often enough, it would take the database's time from
        # the workers measured. Rates come from the rows' times, not from when this returns.
        _wait_until(lambda: _succeeded() == n, 600, f"{n} jobs to succeed", every=0.5)
        return _window_rate(n)


def measure_latency(samples: int, gap: float, concurrency: int) -> tuple[float, float]:
    """Milliseconds from a job's commit (NOTIFY in its transaction) to its function starting."""
    committed: dict[str, float] = {}
    with Workers(1, concurrency), _connect() as conn:
        for i in range(samples):
            label = f"bench:{i}"
            with conn.transaction():
                conn.execute(
                    INSERT,
                    {
                        "name": "demo.stamp",
                        "input": f'{{"label": "{label}"}}',
                        "prefix": f"bench:{uuid.uuid4().hex}:",
                        "queue": QUEUE,
                        "now": datetime.now(UTC),
                        "n": 1,
                    },
                )
                conn.execute("SELECT pg_notify('ultimat3_jobs', %s)", [QUEUE])
            committed[label] = time.time()
            time.sleep(gap)
        _wait_until(lambda: _succeeded() == samples, 60, "the latency jobs to run")
        rows = conn.execute("SELECT label FROM demo_ping WHERE label LIKE 'bench:%%'").fetchall()
    delays = []
    for (text,) in rows:
        label, started = text.rsplit(" ", 1)
        delays.append((float(started) - committed[label]) * 1000)
    if len(delays) != samples:
        raise RuntimeError(f"{len(delays)} of {samples} latency jobs left their stamp")
    cuts = statistics.quantiles(delays, n=100)
    return statistics.median(delays), cuts[98]


def measure_occurrence_latency(seconds: float, concurrency: int) -> tuple[float, float, float]:
    """Milliseconds from a per-second task's occurrence to its job's side effect (written just
    after the job started): a scheduler (default tick) and a worker on the default queue.

    Returns (tick in ms, p50, p99). Only in a throwaway cluster: it runs the demo's tasks.
    """
    from ultimat3_jobs.conf import get_settings

    env = {**os.environ, "DEBUG": "false", "ULTIMAT3_DEMO_PER_SECOND": "1"}
    manage = [sys.executable, str(ROOT / "manage.py")]
    popens = [
        subprocess.Popen(
            [*manage, *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for argv in (["run_worker", "--concurrency", str(concurrency)], ["run_scheduler"])
    ]
    try:
        pids = [popen.pid for popen in popens]

        def both_up() -> bool:
            with _connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM ultimat3_jobs_node WHERE stopped_at IS NULL "
                    "AND pid = ANY(%s)",
                    [pids],
                ).fetchone()
            return bool(row and row[0] == len(pids))

        _wait_until(both_up, 60, "the scheduler and the worker to start")
        # Occurrences from before both ran (a first round's catch-up) are left out.
        since = datetime.now(UTC)
        time.sleep(seconds)
    finally:
        for popen in popens:
            popen.send_signal(signal.SIGTERM)
        for popen in popens:
            popen.wait(60)
    with _connect() as conn:
        rows = conn.execute(
            "SELECT label, created_at FROM demo_ping WHERE label LIKE 'every-second %%' "
            "ORDER BY created_at"
        ).fetchall()
        conn.execute("DELETE FROM demo_ping WHERE label LIKE 'every-second %%'")
        conn.execute("DELETE FROM ultimat3_jobs_job WHERE task = 'demo.every_second'")
    occurred = [
        (datetime.fromisoformat(label.removeprefix("every-second ")), c) for label, c in rows
    ]
    delays = [(c - at).total_seconds() * 1000 for at, c in occurred if at > since]
    if len(delays) < 5:
        raise RuntimeError(f"only {len(delays)} per-second jobs ran in {seconds:g}s")
    tick = get_settings().tick_interval.total_seconds() * 1000
    return tick, statistics.median(delays), statistics.quantiles(delays, n=100)[98]


# -- procrastinate --------------------------------------------------------------------------------


def measure_procrastinate(n: int, concurrency: int) -> float | None:
    """procrastinate's worker on the same no-op (sync task), in a database of its own."""
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return None
    with _connect() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PROCRASTINATE_DB}")
        conn.execute(f"CREATE DATABASE {PROCRASTINATE_DB}")
    import psycopg.conninfo

    params = {k: v for k, v in _params(PROCRASTINATE_DB).items() if v is not None}
    conninfo = psycopg.conninfo.make_conninfo(**params)

    def step(*argv: str) -> None:
        subprocess.run(
            # Imported rather than run as __main__, where procrastinate warns about its app.
            [sys.executable, "-c", RUN_PROCRASTINATE, conninfo, *argv],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    try:
        step("schema")
        step("defer", str(n))
        step("work", str(concurrency))
        with _connect(PROCRASTINATE_DB) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE type = 'succeeded'), "
                "min(at) FILTER (WHERE type = 'started'), "
                "max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
            ).fetchone()
        count, first, last = row
        if count != n:
            raise RuntimeError(f"procrastinate: {count} of {n} jobs succeeded")
        return float(n / (last - first).total_seconds())
    finally:
        with _connect() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {PROCRASTINATE_DB}")


# -- the claim as history grows -------------------------------------------------------------------


def measure_claim_cost(history: int, repeats: int = 300, batch: int = 10) -> tuple[float, float]:
    """Median milliseconds of one claim of ``batch`` among 1,000 queued jobs, in a copy of the
    job table (same indexes) without history and in one with ``history`` finished jobs.

    Each copy lives in a schema of its own. Claims alternate between the two, so both see the
    same load on a shared machine, and each is rolled back, so every one sees the same table.
    """
    from ultimat3_jobs.store.sql import CLAIM_ANY_QUEUE, CLAIM_PLANNER

    schemas = [f"{HISTORY_SCHEMA}_empty", f"{HISTORY_SCHEMA}_full"]
    conns = [_connect() for _ in schemas]
    now = datetime.now(UTC)
    try:
        for conn, schema, rows in zip(conns, schemas, (0, history), strict=True):
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(
                f"CREATE TABLE {schema}.ultimat3_jobs_job "
                "(LIKE public.ultimat3_jobs_job INCLUDING ALL)"
            )
            conn.execute(f"SET search_path TO {schema}")
            queued = {"name": "demo.noop", "input": "{}", "prefix": "queued:", "queue": QUEUE}
            conn.execute(INSERT, {**queued, "now": now, "n": 1000})
            conn.execute(
                """
                INSERT INTO ultimat3_jobs_job (name, key, input, status, queue, attempts,
                    max_attempts, run_at, created_at, started_at, finished_at, last_error, task,
                    catch_up, enqueued_by, worker)
                SELECT 'demo.noop', 'done:' || g, '{}'::jsonb, 'succeeded', %(queue)s, 1, 1,
                    %(at)s, %(at)s, %(at)s, %(at)s, '', '', false, 'code', 'gone'
                FROM generate_series(1, %(n)s) AS g
                """,
                {"queue": QUEUE, "at": now, "n": rows},
            )
            conn.execute("VACUUM ANALYZE ultimat3_jobs_job")
        spent: list[list[float]] = [[], []]
        for _ in range(repeats):
            for conn, times in zip(conns, spent, strict=True):
                params = {
                    "now": datetime.now(UTC),
                    "limit": batch,
                    "start": batch,
                    "worker": "bench",
                }
                with conn.transaction(force_rollback=True):
                    conn.execute(CLAIM_PLANNER)  # As the worker claims.
                    start = time.perf_counter()
                    conn.execute(CLAIM_ANY_QUEUE, params).fetchall()
                    times.append(time.perf_counter() - start)
        empty, full = (statistics.median(times) * 1000 for times in spent)
    finally:
        for conn, schema in zip(conns, schemas, strict=True):
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.close()
    return empty, full


# -- the table ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000, help="no-op jobs per measurement")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of throughput runs")
    parser.add_argument(
        "--occurrence-seconds",
        type=float,
        default=20,
        help="how long a scheduler and a worker run a per-second task (0: skip)",
    )
    parser.add_argument(
        "--history", type=int, default=1_000_000, help="finished jobs for the claim cost (0: skip)"
    )
    args = parser.parse_args(argv)

    from .setup import django_ready

    django_ready()
    from django.db import connection

    if connection.vendor != "postgresql":
        print("worker benchmark: needs PostgreSQL (make bench starts a throwaway cluster)")
        return
    _clean()
    n, c = args.jobs, args.concurrency
    # Rounds of every measurement in turn, so each sees the same share of a noisy machine.
    floors: dict[int, list[float]] = {1: [], 2: []}
    runs: dict[int, list[float]] = {1: [], 2: []}
    prepared_runs: dict[int, list[float]] = {1: [], 2: []}
    children: list[float] = []
    marked_floors: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for k in (1, 2):
            floors[k].append(measure_floor(n, k))
            runs[k].append(measure_workers(n, k, c))
            prepared_runs[k].append(measure_workers(n, k, c, prepared=True))
            marked_floors[k].append(measure_marked_floor(n, c, k))
        children.append(measure_workers(n, 1, c, pool="process"))
    floor = {k: statistics.median(rates) for k, rates in floors.items()}
    marked = {k: statistics.median(rates) for k, rates in marked_floors.items()}
    ours = {k: statistics.median(rates) for k, rates in runs.items()}
    prepared = {k: statistics.median(rates) for k, rates in prepared_runs.items()}
    process_pool = statistics.median(children)
    theirs = measure_procrastinate(n, c)
    p50, p99 = measure_latency(args.latency_samples, 0.02, c)
    claim = measure_claim_cost(args.history) if args.history else None
    # It runs the demo's tasks and a worker on every queue: a throwaway cluster only.
    scheduled = (
        measure_occurrence_latency(args.occurrence_seconds, c)
        if os.environ.get("ULTIMAT3_TEST_PGDATA") and args.occurrence_seconds
        else None
    )

    print(
        f"\nWorker throughput (no-op jobs, {n} per run, --concurrency {c}; median of "
        f"{args.repeats} interleaved rounds, procrastinate one run; PostgreSQL)"
    )
    header = f"{'':<52} | {'jobs/s':>8} | {'vs procrastinate':>16}"
    print(header)
    print("-" * len(header))

    def line(label: str, rate: float) -> None:
        versus = f"{rate / theirs:.1f}x" if theirs else "-"
        print(f"{label:<52} | {rate:>8.0f} | {versus:>16}")

    for k in (1, 2):
        line(f"floor: psycopg, claim {FLOOR_BATCH} + 1 UPDATE, {k} conn", floor[k])
    line(f"floor with start marks: 1 process, {c} conns marking", marked[1])
    line(f"floor with start marks: 2 processes, {c} conns each", marked[2])
    if theirs is not None:
        line("procrastinate worker, sync task, 1 process", theirs)
    else:
        print(f"{'procrastinate worker':<52} | {'-':>8} | (pip install -e '.[bench]')")
    for k in (1, 2):
        line(f"run_worker, {k} process{'es' if k > 1 else ''}", ours[k])
    for k in (1, 2):
        line(f"the same, prepare_threshold=5: {k} process{'es' if k > 1 else ''}", prepared[k])
    line(f"run_worker --pool process, 1 process ({c} children)", process_pool)
    print(
        f"two processes / one: {ours[2] / ours[1]:.2f}x (the floor with start marks': "
        f"{marked[2] / marked[1]:.2f}x); one process / floor (1 conn): "
        f"{ours[1] / floor[1]:.0%}; / floor with start marks: {ours[1] / marked[1]:.0%}; two "
        f"processes / floor with start marks (2 processes): {ours[2] / marked[2]:.0%}"
    )
    print(
        f"with prepare_threshold=5: two processes / one: {prepared[2] / prepared[1]:.2f}x; "
        f"one process / floor (1 conn): {prepared[1] / floor[1]:.0%}; / floor with start "
        f"marks: {prepared[1] / marked[1]:.0%}; / Django's default: "
        f"{prepared[1] / ours[1]:.2f}x"
    )
    print(
        "  floor with start marks x1 rounds: "
        + ", ".join(f"{rate:.0f}" for rate in marked_floors[1])
        + "; x2: "
        + ", ".join(f"{rate:.0f}" for rate in marked_floors[2])
    )
    for k in (1, 2):
        each = ", ".join(f"{rate:.0f}" for rate in runs[k])
        print(
            f"  run_worker x{k} rounds: {each}; prepared: "
            + ", ".join(f"{rate:.0f}" for rate in prepared_runs[k])
            + f"; floor x{k}: "
            + ", ".join(f"{rate:.0f}" for rate in floors[k])
        )
    print(
        f"latency, job committed -> function started (LISTEN/NOTIFY, 1 process, "
        f"{args.latency_samples} jobs {20} ms apart): p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )
    if scheduled is not None:
        tick, s50, s99 = scheduled
        print(
            f"latency, per-second task's occurrence -> its job's side effect (scheduler tick "
            f"{tick:.0f} ms, 1 worker): p50 {s50:.1f} ms, p99 {s99:.1f} ms "
            f"(goal: p99 <= tick + 50 ms)"
        )
    else:
        print("occurrence latency: skipped (only in a throwaway cluster: make bench)")
    if claim is not None:
        empty, full = claim
        print(
            f"claim of 10 among 1,000 queued: {empty:.3f} ms on an empty table, {full:.3f} ms "
            f"with {args.history:,} finished jobs ({full / empty:.2f}x; median of 300)"
        )
    print(
        "Rates: first start to last finish (our job rows; procrastinate's events table). "
        "Workers run with DEBUG off; procrastinate in a database of its own on the same server. "
        "The floors run psycopg's default, statements prepared from their sixth run; "
        "run_worker Django's (OPTIONS prepare_threshold: never), then 5."
    )


if __name__ == "__main__":
    main(sys.argv[1:])
