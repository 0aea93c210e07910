"""``manage.py run_worker``: parse the flags, build a Worker, run it until drained."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from ultimat3_jobs import logs
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.management.arguments import (
    non_negative_int,
    positive_int,
    positive_seconds,
    queue_names,
)
from ultimat3_jobs.management.preflight import command_error, require_migrated
from ultimat3_jobs.worker import CLEAN_EXIT, Worker


class Command(BaseCommand):
    help = (
        "Run the jobs the scheduler enqueues. The first SIGTERM/SIGINT stops claiming and "
        "waits for the jobs in flight; the second exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            help="Jobs run at once, each in a thread of its own (default 1).",
        )
        parser.add_argument(
            "--prefetch",
            type=non_negative_int,
            help="Claimed jobs that may wait for a free thread, claimed only while the threads "
            "keep up (default 100; 0 claims a thread's worth at a time).",
        )
        parser.add_argument(
            "--queues",
            type=queue_names,
            action="extend",
            help="Comma-separated queues to run (repeatable; default: every queue).",
        )
        parser.add_argument("--burst", action="store_true", help="Run what is due now, then exit.")
        parser.add_argument(
            "--max-jobs", type=positive_int, help="Exit after running this many jobs."
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
            "--no-listen",
            action="store_true",
            help="Poll only; do not LISTEN for enqueues (e.g. behind a transaction pooler).",
        )
        parser.add_argument("--log-format", choices=("text", "json"), default="text")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(
        self,
        *,
        concurrency: int,
        prefetch: int | None,
        queues: list[str] | None,
        burst: bool,
        max_jobs: int | None,
        poll_interval: float | None,
        drain_grace: float | None,
        no_listen: bool,
        log_format: str,
        database: str,
        verbosity: int,
        **options: Any,
    ) -> None:
        logs.configure(log_format, logging.DEBUG if verbosity > 1 else logging.INFO)
        require_migrated(database)
        try:
            worker = Worker(
                queues=queues,
                concurrency=concurrency,
                prefetch=prefetch,
                burst=burst,
                max_jobs=max_jobs,
                poll_interval=timedelta(seconds=poll_interval) if poll_interval else None,
                drain_grace=timedelta(seconds=drain_grace) if drain_grace else None,
                listen=not no_listen,
                using=database,
            )
        except UltimateError as error:
            raise command_error(error) from error
        exit_code = worker.run()
        if exit_code != CLEAN_EXIT:
            raise CommandError(
                "the drain grace ran out; the jobs still in flight went back to the queue",
                returncode=exit_code,
            )
