"""Scheduler rounds at scale, against a floor and against procrastinate's periodic deferrer.

- floor: one psycopg transaction that COPYs N job rows and updates N watermark rows;
- ours: the round ``run_scheduler --once`` runs with all N tasks due (after arming), timed
  inside the process with the JSON log lines written (to /dev/null), its statements counted;
- the whole command: ``run_scheduler --once`` as a user runs it (``call_command`` in the
  process, from its start to its return: task sync, leader election, round, commit) with N
  tasks declared by ``@task`` and all due on the real clock, against the floor measured after
  each run; its first start (nothing stored yet) and the process's peak RSS;
- procrastinate: its periodic deferrer deferring one minute of N periodic tasks (procrastinate
  3.x, psycopg connector), on the same cluster in a database of its own, the median of five
  minutes in a row;
- running loop: ``--tick-interval 0.1`` at N tasks due at one instant, from that instant until
  the round holding all N jobs has committed;
- 100,000 tasks: start (first and warm) until the loop dispatches, an idle round, an all-due
  round and its floor, peak RSS;
- memory: the peak RSS of a fresh process that arms N tasks and runs one all-due round, as
  ``run_scheduler --once`` does, in the example project, again without Celery, and again with
  the tasks declared with ``@task``, a function each;
- tracing on: the same all-due round with an OpenTelemetry SDK provider set (a batch span
  processor whose exporter drops what it is given), against the round above, without one.

Each measurement runs in its own process so peak RSS belongs to it. Run: ``python -m bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

SIZES = (1_000, 10_000)
LOOP_SIZE = 10_000
ROOT = Path(__file__).resolve().parents[1]
COMMAND_SIZE = 10_000
BIG_SIZE = 100_000
PROCRASTINATE_SIZE = 1_000
TICK = 0.1
T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


def _tasks(n: int, cron: str = "* * * * *", tz: str = "Europe/Paris") -> list[Any]:
    from ultimat3_jobs.cron import parse
    from ultimat3_jobs.handles import JobHandle, TaskHandle
    from ultimat3_jobs.registry import registry
    from ultimat3_jobs.zones import resolve_zone

    ping = registry.get_job("demo.ping")
    assert ping is not None

    def entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        return [(ping, {"label": occurrence.isoformat()})]

    zone = resolve_zone(tz, "bench")
    schedule = parse(cron)
    return [
        TaskHandle(
            entries,
            name=f"bench.{i:06d}",
            schedule=schedule,
            zone=zone,
            catch_up="skip",
            max_catch_up=10,
        )
        for i in range(n)
    ]


def _declared(n: int) -> list[Any]:
    """``_tasks(n)`` as a project declares them: ``@task`` on a function of its own each, in a
    loop, so the registry and the functions are in the process too."""
    from .declared.tasks import declare

    return declare(n)


def _reset() -> None:
    from django.db import connection

    from ultimat3_jobs.models import Job, Node, Occurrence, Task

    with connection.cursor() as cursor:
        for model in (Job, Occurrence, Task, Node):
            cursor.execute(f"TRUNCATE {model._meta.db_table}")


def _json_logs_to_devnull() -> None:
    """The logging ``run_scheduler --log-format json`` sets up, writing to /dev/null."""
    from ultimat3_jobs import logs

    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    logs.configure("json")


def _print_result(result: dict[str, Any]) -> None:
    sys.__stdout__.write(json.dumps(result) + "\n")  # type: ignore[union-attr]


def _traces_dropped() -> None:
    """A tracer provider as a project sets one (the SDK, a batch span processor) whose
    exporter drops what it gets: the round's cost of making its spans, without a collector's.

    Its queue holds a 10,000-occurrence round's spans; the SDK's default (2,048) would drop
    most of them, logging that it does.
    """
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped(), max_queue_size=32_768))
    trace.set_tracer_provider(provider)


def _tracing_sdk() -> bool:
    from importlib.util import find_spec

    return find_spec("opentelemetry") is not None and find_spec("opentelemetry.sdk") is not None


def _pg_params() -> dict[str, Any]:
    from django.db import connection

    params = connection.settings_dict
    return {
        "dbname": params["NAME"],
        "user": params["USER"] or None,
        "password": params["PASSWORD"] or None,
        "host": params["HOST"] or None,
        "port": params["PORT"] or None,
    }


# -- ours -----------------------------------------------------------------------------------------


def _armed(n: int, clock: Any, tasks: list[Any] | None = None) -> Any:
    from ultimat3_jobs.scheduler import Scheduler
    from ultimat3_jobs.state import DatabaseState

    state = DatabaseState(node_id="bench", leader="sole", clock=clock)
    return Scheduler(state=state, clock=clock, tasks=tasks or _tasks(n), drain_on_shutdown=False)


#: Process CPU time of each timed round (this process's share: planning, encoding, logging).
_cpu: list[float] = []


def _timed_round(scheduler: Any, count: bool = False) -> tuple[float, int, list[Any]]:
    """One round, timed; with ``count``, its statements counted instead (Django then renders
    every statement with its parameters, which costs time and memory of its own)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if count:
        with CaptureQueriesContext(connection) as queries:
            fired = scheduler.tick()
        return 0.0, len(queries), fired
    start, cpu = time.perf_counter(), time.process_time()
    fired = scheduler.tick()
    _cpu.append(time.process_time() - cpu)
    return time.perf_counter() - start, 0, fired


def measure_ours(
    n: int, repeats: int, after_round: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """``after_round`` runs after each timed round: the floor, so both see the same load."""
    from ultimat3_jobs.clock import FrozenClock
    from ultimat3_jobs.models import Job, Occurrence, Task

    from .setup import peak_rss_mb

    tasks = _tasks(n)
    due_times, idle_times, due_queries, idle_queries = [], [], 0, 0
    due_cpu: list[float] = []
    for repeat in range(repeats + 1):
        # The last pass counts statements, the others are timed. Peak RSS is read before it:
        # counting makes Django keep every statement rendered with its parameters.
        counting = repeat == repeats
        if counting:
            rss_mb = peak_rss_mb()
        _reset()
        clock = FrozenClock(T0)
        scheduler = _armed(n, clock, tasks)
        scheduler.tick()  # sync and arm every task
        clock.advance(10)
        scheduler.tick()  # nothing due; writes the heartbeat that falls due every few seconds
        clock.advance(1)  # a steady-state round with nothing due
        idle, queries, _ = _timed_round(scheduler, counting)
        idle_queries = queries if counting else idle_queries
        clock.set(T0 + timedelta(seconds=30))  # every task due at 00:01:00
        due, queries, fired = _timed_round(scheduler, counting)
        due_queries = queries if counting else due_queries
        if not counting:
            idle_times.append(idle)
            due_times.append(due)
            due_cpu.append(_cpu[-1])
        assert len(fired) == n, (len(fired), n)
        assert Job.objects.count() == n
        assert Occurrence.objects.filter(outcome="fired").count() == n
        assert Task.objects.filter(last_fired_at=clock()).count() == n
        if not counting:
            after_round()
    return {
        "rss_mb": rss_mb,
        "due_s": statistics.median(due_times),
        "due_cpu_s": statistics.median(due_cpu),
        "due_queries": due_queries,
        "idle_s": statistics.median(idle_times),
        "idle_queries": idle_queries,
    }


def measure_floor(n: int, repeats: int) -> float:
    """COPY N job rows and UPDATE N watermarks in one transaction, psycopg alone."""
    import psycopg

    from ultimat3_jobs.models import Task

    names = list(Task.objects.order_by().values_list("name", flat=True)[:n])
    assert len(names) == n, "the floor moves the watermarks of the round just measured"
    times = []
    with psycopg.connect(**_pg_params()) as conn:
        for r in range(repeats):
            now = datetime.now(UTC)
            start = time.perf_counter()
            with conn.transaction():
                with conn.cursor().copy(
                    "COPY ultimat3_jobs_job (name, key, input, status, queue, attempts, "
                    "max_attempts, run_at, created_at, last_error, task, occurrence, catch_up, "
                    "enqueued_by, worker) FROM STDIN"
                ) as copy:
                    for i, name in enumerate(names):
                        copy.write_row(
                            ("demo.ping", f"floor:{r}:{i}", '{"label": "x"}', "queued",
                             "default", 0, 3, now, now, "", name, now, False, "scheduler", "")
                        )  # fmt: skip
                conn.execute(
                    "UPDATE ultimat3_jobs_task AS t SET last_fired_at = v.watermark "
                    "FROM unnest(%s::text[], %s::timestamptz[]) AS v(name, watermark) "
                    "WHERE t.name = v.name",
                    [names, [now] * n],
                )
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _repeats(n: int) -> int:
    """Small rounds are cheap and noisier: more of them."""
    return 9 if n <= 1_000 else 5


def run_round(n: int, repeats: int) -> dict[str, Any]:
    floors: list[float] = []
    result = {
        "n": n,
        "repeats": repeats,
        **measure_ours(n, repeats, lambda: floors.append(measure_floor(n, 1))),
    }
    result["floor_s"] = statistics.median(floors)
    return result


# -- the whole command ----------------------------------------------------------------------------


def _once() -> float:
    """``run_scheduler --once`` as a user runs it, in this process: start to return."""
    from django.core.management import call_command

    start = time.perf_counter()
    call_command("run_scheduler", "--once", "--log-format", "json")
    return time.perf_counter() - start


def _all_due() -> None:
    """Every benchmark task's watermark a minute back: its last minute's occurrence is due now,
    on the real clock, and only that one. Waits out a minute's last seconds first, so the
    command's round does not reach the next one."""
    from django.db import connection

    while datetime.now(UTC).second >= 45:
        time.sleep(0.5)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ultimat3_jobs_task SET last_fired_at = now() - interval '59.9 seconds' "
            "WHERE name LIKE 'bench.%%'"
        )
        cursor.execute("TRUNCATE ultimat3_jobs_job, ultimat3_jobs_occurrence")
    connection.close()  # The command opens its own, as a fresh process would.


def run_command(n: int, repeats: int) -> dict[str, Any]:
    """``run_scheduler --once`` with N tasks declared by ``@task``: the first start (every
    row written, every task armed), then ``repeats`` runs with all N due, each followed by
    its floor. Peak RSS is read before the floors."""
    from ultimat3_jobs.models import Job

    from .setup import peak_rss_mb

    _declared(n)
    _reset()
    first = _once()
    times: list[float] = []
    floors: list[float] = []
    for _ in range(repeats):
        _all_due()
        times.append(_once())
        jobs = Job.objects.filter(task__startswith="bench.").count()
        assert jobs == n, (jobs, n)
        if not floors:
            rss_mb = peak_rss_mb()
        floors.append(measure_floor(n, 1))
    _reset()  # Its queued jobs would otherwise be the next benchmark's workers' backlog.
    return {
        "n": n,
        "repeats": repeats,
        "first_s": first,
        "due_s": statistics.median(times),
        "due_runs": times,
        "floor_s": statistics.median(floors),
        "rss_mb": rss_mb,
    }


# -- the running loop -----------------------------------------------------------------------------


def run_loop(n: int) -> dict[str, Any]:
    """The loop at ``--tick-interval 0.1`` with N tasks all due at one instant, on real time."""
    from ultimat3_jobs.scheduler import Scheduler
    from ultimat3_jobs.state import DatabaseState

    _reset()
    target = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=12)
    tasks = _tasks(n, cron=f"{target.second} {target.minute} {target.hour} * * *", tz="UTC")
    state = DatabaseState(node_id="bench-loop", leader="sole")
    committed: list[tuple[float, int]] = []
    commits: list[tuple[float, float]] = []

    def timed(write: Callable[..., Any]) -> Callable[..., Any]:
        def commit(*args: Any) -> Any:
            begun = time.time()
            enqueued = write(*args)
            committed.append((time.time(), len(enqueued)))
            commits.append((begun, time.time()))
            return enqueued

        return commit

    # Either way a round is written: after planning, or while its task functions run.
    state.commit = timed(state.commit)  # type: ignore[method-assign]
    state.commit_streamed = timed(state.commit_streamed)  # type: ignore[method-assign]
    scheduler = Scheduler(
        state=state, tasks=tasks, tick_interval=timedelta(seconds=TICK), drain_on_shutdown=False
    )
    started = time.time()
    scheduler.start()
    deadline = target.timestamp() + 30
    while time.time() < deadline and not any(count for _, count in committed):
        time.sleep(0.01)
    scheduler.stop()
    jobs = [(at, count) for at, count in committed if count]
    assert jobs and jobs[0][1] == n, jobs
    return {
        "n": n,
        "armed_s": committed[0][0] - started,
        "latency_s": jobs[0][0] - target.timestamp(),
        "commit_s": [b - a for a, b in commits][-1],
        "commit_start_s": commits[-1][0] - target.timestamp(),
        "floor_s": measure_floor(n, 3),
    }


# -- 100,000 tasks --------------------------------------------------------------------------------


def run_big(n: int) -> dict[str, Any]:
    from ultimat3_jobs.clock import FrozenClock

    from .setup import peak_rss_mb

    tasks = _tasks(n)
    _reset()
    clock = FrozenClock(T0)
    start = time.perf_counter()
    _armed(n, clock, tasks).tick()  # first start: every row written, every task armed
    cold = time.perf_counter() - start
    clock.advance(5)
    start = time.perf_counter()
    scheduler = _armed(n, clock, tasks)  # a restart: the rows are there
    scheduler.tick()
    warm = time.perf_counter() - start
    clock.advance(10)
    scheduler.tick()  # writes the heartbeat due every few seconds
    idle_times = []
    for _ in range(5):
        clock.advance(0.1)
        idle_times.append(_timed_round(scheduler)[0])
    clock.advance(0.1)
    idle_queries = _timed_round(scheduler, count=True)[1]
    clock.set(T0 + timedelta(seconds=30))
    due, _, fired = _timed_round(scheduler)
    assert len(fired) == n
    del fired
    # Before the counting pass, in which Django keeps every statement with its parameters.
    rss_mb = peak_rss_mb()
    clock.set(T0 + timedelta(seconds=90))
    due_queries = _timed_round(scheduler, count=True)[1]
    # Last: the floor moves the watermarks to the real clock, after which no task is due.
    floor = measure_floor(n, 1)
    # Its 200,000 queued jobs would otherwise be the next benchmark's workers' backlog.
    _reset()
    return {
        "n": n,
        "cold_s": cold,
        "warm_s": warm,
        "idle_s": statistics.median(idle_times),
        "idle_queries": idle_queries,
        "due_s": due,
        "due_queries": due_queries,
        "floor_s": floor,
        "rss_mb": rss_mb,
    }


# -- run_scheduler as its own process ------------------------------------------------------------


def _process_once(n: int) -> tuple[float, float]:
    """``manage.py run_scheduler --once`` in a process of its own, N tasks in a ``tasks.py``:
    seconds from its start to its exit, and its peak RSS in MB."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.process_settings",
        "BENCH_DECLARED_TASKS": str(n),
    }
    start = time.perf_counter()
    # Its log (a line a task at a first start) goes nowhere: what is timed is the command.
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_scheduler", "--once"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"run_scheduler --once exited with status {child.returncode}")
    return elapsed, usage.ru_maxrss / 1024


def run_process(n: int) -> dict[str, Any]:
    """``run_scheduler --once`` as a user's shell or cron runs it, N tasks declared in a
    ``tasks.py``: Python's start, Django's setup (the tasks discovered), the system checks, the
    round and the interpreter's exit. A first start (nothing stored), then all due."""
    from ultimat3_jobs.models import Job

    _reset()
    first_s, first_mb = _process_once(n)
    _all_due()
    due_s, due_mb = _process_once(n)
    jobs = Job.objects.filter(task__startswith="bench.").count()
    assert jobs == n, (jobs, n)
    _reset()
    return {"n": n, "first_s": first_s, "first_mb": first_mb, "due_s": due_s, "due_mb": due_mb}


# -- a scheduler process's memory -----------------------------------------------------------------


def run_fresh(n: int, declared: bool = False) -> dict[str, Any]:
    """Peak RSS of a process that does what ``run_scheduler --once`` does for N tasks, on a
    migrated database: Django set up, the tasks declared, armed (first start), one all-due
    round. The timing process's own peak also holds its repeats, floors and counting pass.
    ``declared``: the tasks declared with ``@task``, a function each (``_declared``)."""
    from ultimat3_jobs.clock import FrozenClock

    from .setup import peak_rss_mb

    base = peak_rss_mb()
    tasks = _declared(n) if declared else _tasks(n)
    _reset()
    clock = FrozenClock(T0)
    scheduler = _armed(n, clock, tasks)
    scheduler.tick()  # first start: every row written, every task armed
    armed = peak_rss_mb()
    clock.set(T0 + timedelta(seconds=30))
    assert len(scheduler.tick()) == n
    return {"n": n, "base_mb": base, "armed_mb": armed, "rss_mb": peak_rss_mb()}


# -- the table ------------------------------------------------------------------------------------


def _child(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.scheduler", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--repeats", type=int, help="timed rounds per size (default: 9 up to 1,000 tasks, else 5)"
    )
    parser.add_argument("--big", type=int, default=BIG_SIZE)
    parser.add_argument(
        "--child",
        choices=("round", "command", "fresh", "loop", "big", "process"),
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--without-celery", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--declared", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        from .setup import django_ready, without_celery

        if args.without_celery:
            without_celery()
        if args.traced:
            _traces_dropped()

        # The fresh process runs on the schema the children before it migrated, as a
        # scheduler does: loading every migration would be memory of the benchmark's.
        django_ready(migrate=args.child != "fresh")
        _json_logs_to_devnull()
        if args.child == "fresh":
            _print_result(run_fresh(args.n, args.declared))
        elif args.child == "round":
            _print_result(run_round(args.n, args.repeats or _repeats(args.n)))
        elif args.child == "command":
            _print_result(run_command(args.n, args.repeats or _repeats(args.n)))
        elif args.child == "loop":
            _print_result(run_loop(args.n))
        elif args.child == "process":
            _print_result(run_process(args.n))
        else:
            _print_result(run_big(args.n))
        return

    from . import procrastinate_periodic

    rounds = [
        _child("--child", "round", "--n", str(n), "--repeats", str(args.repeats or _repeats(n)))
        for n in args.sizes
    ]
    traced = []
    if _tracing_sdk():
        traced = [
            _child(
                "--child", "round", "--n", str(n), "--repeats", str(args.repeats or _repeats(n)),
                "--traced",
            )
            for n in args.sizes
        ]  # fmt: skip
    fresh = [_child("--child", "fresh", "--n", str(n)) for n in args.sizes]
    plain = [_child("--child", "fresh", "--n", str(n), "--without-celery") for n in args.sizes]
    declared = [_child("--child", "fresh", "--n", str(n), "--declared") for n in args.sizes]
    other = procrastinate_periodic.measure(PROCRASTINATE_SIZE)
    commands = [
        _child("--child", "command", "--n", str(n), "--repeats", str(repeats))
        for n, repeats in ((PROCRASTINATE_SIZE, 5), (COMMAND_SIZE, 5), (args.big, 1))
    ]
    loop = _child("--child", "loop", "--n", str(LOOP_SIZE))
    big = _child("--child", "big", "--n", str(args.big))
    process = _child("--child", "process", "--n", str(args.big))

    print(
        "\nScheduler rounds (PostgreSQL; median of "
        + ", ".join(f"{r['repeats']} runs at N={r['n']:,}" for r in rounds)
        + ", each round followed by its floor, unless said)"
    )
    header = f"{'':<44} | " + " | ".join(f"{'N=' + format(r['n'], ','):>12}" for r in rounds)
    print(header)
    print("-" * len(header))

    def line(label: str, cells: list[str]) -> None:
        print(f"{label:<44} | " + " | ".join(f"{c:>12}" for c in cells))

    line("floor (COPY N jobs + UPDATE N watermarks)", [_ms(r["floor_s"]) for r in rounds])
    line("ours: run_scheduler --once round, all due", [_ms(r["due_s"]) for r in rounds])
    line("  of which this process's CPU", [_ms(r["due_cpu_s"]) for r in rounds])
    line("ours / floor", [f"{r['due_s'] / r['floor_s']:.2f}x" for r in rounds])
    line("statements in that round", [str(r["due_queries"]) for r in rounds])
    if traced:
        line("the same round, tracing on (spans dropped)", [_ms(r["due_s"]) for r in traced])
        line(
            "  tracing's overhead",
            [
                f"{(on['due_s'] - off['due_s']) / off['due_s'] * 100:+.0f}%"
                for on, off in zip(traced, rounds, strict=True)
            ],
        )
        line("  statements in it", [str(r["due_queries"]) for r in traced])
    else:
        print("tracing on: not measured (pip install opentelemetry-sdk)")
    line("round with nothing due", [_ms(r["idle_s"]) for r in rounds])
    line("statements in it", [str(r["idle_queries"]) for r in rounds])
    line("peak RSS (this timing process)", [f"{r['rss_mb']:.0f} MB" for r in rounds])
    line("peak RSS, a process arming + one round", [f"{r['rss_mb']:.0f} MB" for r in fresh])
    line("  of which Django and the app, set up", [f"{r['base_mb']:.0f} MB" for r in fresh])
    line("the same, in a project without Celery", [f"{r['rss_mb']:.0f} MB" for r in plain])
    line("  of which Django and the app, set up", [f"{r['base_mb']:.0f} MB" for r in plain])
    line("the same, a @task function per task", [f"{r['rss_mb']:.0f} MB" for r in declared])

    print(
        "\nrun_scheduler --once, the whole command in this process (call_command, start to "
        "return: task sync, leader election, round, commit), N tasks declared by @task, all due "
        "on the real clock; median of "
        + ", ".join(f"{c['repeats']} at N={c['n']:,}" for c in commands)
        + ", each followed by its floor"
    )
    header = f"{'':<44} | " + " | ".join(f"{'N=' + format(c['n'], ','):>12}" for c in commands)
    print(header)
    print("-" * len(header))
    line("floor (COPY N jobs + UPDATE N watermarks)", [_ms(c["floor_s"]) for c in commands])
    line("ours: run_scheduler --once, all due", [_ms(c["due_s"]) for c in commands])
    line("ours / floor (goal <= 2x)", [f"{c['due_s'] / c['floor_s']:.2f}x" for c in commands])
    line("first start, nothing stored (100k: <= 3 s)", [_ms(c["first_s"]) for c in commands])
    line("peak RSS of the process (100k: <= 150 MB)", [f"{c['rss_mb']:.0f} MB" for c in commands])
    print(
        "  runs, all due: "
        + "; ".join(f"N={c['n']:,}: " + ", ".join(_ms(s) for s in c["due_runs"]) for c in commands)
    )
    by_n = {r["n"]: r for r in rounds}
    command_by_n = {c["n"]: c for c in commands}
    if other is None:
        print("procrastinate: not installed (pip install -e '.[bench]')")
    else:
        spread = f"{_ms(min(other['runs']))}-{_ms(max(other['runs']))}"
        versus = [
            f"{label} {_ms(ours['due_s'])}, {other['s'] / ours['due_s']:.1f}x faster"
            for label, ours in (
                ("run_scheduler --once", command_by_n.get(other["n"])),
                ("its round", by_n.get(other["n"])),
            )
            if ours
        ]
        print(
            f"procrastinate {other['version']} periodic deferrer, one minute of "
            f"N={other['n']:,} periodic tasks: {_ms(other['s'])} (median of "
            f"{len(other['runs'])} minutes, {spread}); ours: "
            + "; ".join(versus)
            + " (goal: >= 25x)"
        )
    print(
        f"running loop (--tick-interval {TICK}), N={loop['n']:,} due at one instant: "
        f"occurrence -> all jobs committed {_ms(loop['latency_s'])} "
        f"(goal: <= tick + 2x floor = {_ms(TICK + 2 * loop['floor_s'])}; "
        f"floor {_ms(loop['floor_s'])}; start -> armed {_ms(loop['armed_s'])})"
    )
    print(
        f"N={big['n']:,} tasks, the round in this process: start -> dispatching "
        f"{big['cold_s']:.1f} s first start (goal: <= 3 s), {big['warm_s']:.1f} s restart; "
        f"nothing due {_ms(big['idle_s'])}, {big['idle_queries']} statement(s); all due "
        f"{_ms(big['due_s'])} against its floor {_ms(big['floor_s'])}, "
        f"{big['due_s'] / big['floor_s']:.2f}x (goal: <= 2x), {big['due_queries']} statements; "
        f"peak RSS {big['rss_mb']:.0f} MB (goal: <= 150 MB) (one run each)"
    )
    print(
        f"N={process['n']:,} tasks in a tasks.py, run_scheduler --once as its own process "
        f"(start to exit: Python, Django's setup, the system checks, the round, the exit): "
        f"first start {process['first_s']:.1f} s, peak RSS {process['first_mb']:.0f} MB; "
        f"all due {process['due_s']:.1f} s, peak RSS {process['due_mb']:.0f} MB (one run each)"
    )


if __name__ == "__main__":
    main()
