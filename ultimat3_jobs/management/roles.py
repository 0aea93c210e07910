"""The flags of the long-running commands and the objects they build, shared by
``run_scheduler``, ``run_worker``, ``run_jobs`` and ``run_relay`` so each flag means one thing
everywhere."""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError

from ultimat3_jobs import health, logs, metrics
from ultimat3_jobs.conf import LEADERS, get_settings
from ultimat3_jobs.db import app_database
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.leaders import build_leader
from ultimat3_jobs.lifecycle import UNAVAILABLE_EXIT
from ultimat3_jobs.management.arguments import (
    MAX_BATCH,
    MAX_CONCURRENCY,
    positive_int,
    positive_seconds,
    queue_names,
    up_to,
)
from ultimat3_jobs.management.preflight import (
    command_error,
    database_error,
    require_migrated,
    unavailable_fix,
    warn_if_behind,
)
from ultimat3_jobs.nodes import new_node_id
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.worker import CLEAN_EXIT, POOLS, Worker


def port_number(value: str) -> int:
    number = positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port (1-65535)")
    return number


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every long-running command has."""
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        help="Serve Prometheus metrics on this port at /metrics (default: no exporter).",
    )
    parser.add_argument(
        "--metrics-addr",
        help="With --metrics-port: the address the exporter listens on (default 0.0.0.0).",
    )
    parser.add_argument("--database", default=app_database())


def add_scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--leader",
        choices=LEADERS,
        help="Leader election (default: the LEADER setting, else advisory on PostgreSQL "
        "and lease elsewhere).",
    )
    parser.add_argument(
        "--tick-interval",
        type=positive_seconds,
        help="Seconds between the end of one round and the start of the next (at most a day).",
    )


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=up_to(MAX_CONCURRENCY),
        default=1,
        help=f"Jobs run at once, each in a thread (and a database connection) of its own: "
        f"1 to {MAX_CONCURRENCY} (default 1).",
    )
    parser.add_argument(
        "--prefetch",
        type=up_to(MAX_BATCH, least=0),
        help="Claimed jobs that may wait for a free thread, claimed only while the threads "
        "keep up (default 100; 0 claims a thread's worth at a time).",
    )
    parser.add_argument(
        "--queues",
        type=queue_names,
        action="extend",
        help="Comma-separated queues to run (repeatable; default: every queue).",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_seconds,
        help="Seconds between polls for due jobs (default: WORKER_POLL_INTERVAL).",
    )
    parser.add_argument(
        "--drain-grace",
        type=positive_seconds,
        help="Seconds a SIGTERM waits for jobs in flight (default: WORKER_DRAIN_GRACE).",
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default="thread",
        help="Where jobs run: in threads of the worker (default), or each slot in a child "
        "process of its own, so a timeout kills the job and a crash fails that job alone.",
    )
    parser.add_argument(
        "--max-jobs-per-child",
        type=positive_int,
        help="With --pool process: replace a child after it ran this many jobs (default: never).",
    )
    parser.add_argument(
        "--max-memory-per-child",
        type=positive_int,
        metavar="MB",
        help="With --pool process: replace a child once its peak resident memory passes this "
        "many MB, after the job that grew it (default: never).",
    )
    parser.add_argument(
        "--no-listen",
        action="store_true",
        help="Poll only; do not LISTEN for enqueues (e.g. behind a transaction pooler).",
    )


def prepare(options: dict[str, Any], *, exporter: bool = True) -> Any:
    """Logging, the migrated-database check and the exporter: what every role does first.

    Returns the metrics server (or None); it serves from a daemon thread until the process ends.
    Without ``exporter`` (a command that prints and exits) no server starts.
    """
    logs.configure(
        options["log_format"], logging.DEBUG if options.get("verbosity", 1) > 1 else logging.INFO
    )
    if options.get("metrics_addr") is not None and options.get("metrics_port") is None:
        # Said at once, as argparse says a bad value: no exporter would listen on it.
        raise CommandError("--metrics-addr needs --metrics-port", returncode=2)
    require_migrated(options["database"])
    warn_if_behind(options["database"])
    if not exporter or options.get("metrics_port") is None:
        return None
    try:
        return metrics.serve(
            options["metrics_port"],
            options.get("metrics_addr") or "0.0.0.0",
            using=options.get("database"),
        )
    except UltimateError as error:
        raise command_error(error) from error


def build_scheduler(options: dict[str, Any], *, once: bool = False) -> Scheduler:
    """A scheduler on the database, with the election and settings the flags name."""
    database = options["database"]
    try:
        config = get_settings()
        node_id = new_node_id()
        election = build_leader(options.get("leader"), node_id=node_id, using=database, once=once)
    except UltimateError as error:
        raise command_error(error) from error
    state = DatabaseState(
        node_id=node_id,
        leader=election.name,
        using=database,
        heartbeat_interval=config.heartbeat_interval,
        clock_skew_warning=config.clock_skew_warning,
        once=once,
    )
    tick_interval = options.get("tick_interval")
    scheduler = Scheduler(
        state=state,
        leader=election,
        tick_interval=timedelta(seconds=tick_interval) if tick_interval else config.tick_interval,
        misfire_grace=config.misfire_grace,
    )
    health.process.watch(scheduler)  # What /healthz on --metrics-port reports.
    return scheduler


def build_worker(options: dict[str, Any], **extra: Any) -> Worker:
    """A worker on the database with the flags' settings; ``extra`` for burst/max_jobs."""
    poll_interval = options.get("poll_interval")
    drain_grace = options.get("drain_grace")
    for flag in ("max_jobs_per_child", "max_memory_per_child"):
        if options.get(flag) is not None and options.get("pool") != "process":
            # Said at once, as argparse says a bad value: the thread pool has no child to replace.
            raise CommandError(
                f"--{flag.replace('_', '-')} needs --pool process (the thread pool runs jobs in "
                "threads, with no child process to replace)",
                returncode=2,
            )
    try:
        worker = Worker(
            queues=options.get("queues"),
            concurrency=options["concurrency"],
            prefetch=options.get("prefetch"),
            poll_interval=timedelta(seconds=poll_interval) if poll_interval else None,
            drain_grace=timedelta(seconds=drain_grace) if drain_grace else None,
            listen=not options["no_listen"],
            using=options["database"],
            pool=options.get("pool") or "thread",
            max_jobs_per_child=options.get("max_jobs_per_child"),
            max_memory_per_child=options.get("max_memory_per_child"),
            **extra,
        )
    except UltimateError as error:
        raise command_error(error) from error
    health.process.watch(worker)
    return worker


def worker_exit(exit_code: int, database: str, gave_up: BaseException | None = None) -> None:
    """Turn a worker's exit status into the command's: a drain past its grace fails it, and so
    does a burst that gave up on the error ``gave_up``, whose code and fix it says."""
    if exit_code == UNAVAILABLE_EXIT:
        if gave_up is not None:
            raise burst_failure(gave_up, database, "the jobs it did not run wait in the queue")
        raise CommandError(
            f"the database {database!r} could not be reached, so this burst ran nothing "
            f"[jobs.database-unavailable]\nfix: {unavailable_fix(database)}",
            returncode=exit_code,
        )
    if exit_code != CLEAN_EXIT:
        raise CommandError(
            "the drain grace ran out; the jobs still in flight went back to the queue",
            returncode=exit_code,
        )


def relay_exit(gave_up: BaseException | None, database: str) -> None:
    """A burst relay that gave up fails the command with what it could not reach and the fix;
    the rows it could not send wait in the outbox."""
    if gave_up is not None:
        raise burst_failure(gave_up, database, "the rows it could not send wait in the outbox")


def burst_failure(gave_up: BaseException, database: str, left: str) -> CommandError:
    """The failure of a burst that gave up on ``gave_up``: a database's with its own code and
    fix, any other error with its code and fix; ``left`` says what waits meanwhile."""
    fields = logs.failure_fields(gave_up)
    if fields["code"].startswith("jobs.database-"):
        failure = database_error(database, gave_up)
    else:
        failure = CommandError(
            f"{fields['error']} [{fields['code']}]; this burst gave up, {left}\n"
            f"fix: {fields['fix']}"
        )
    failure.returncode = UNAVAILABLE_EXIT
    return failure
