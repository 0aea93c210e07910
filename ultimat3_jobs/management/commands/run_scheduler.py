"""``manage.py run_scheduler``: parse the flags, build a Scheduler, run it until a signal."""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.management.base import CommandParser
from django.db import DatabaseError

from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import database_error


class Command(JobsCommand):
    runs_until_signalled = True
    help = "Run the scheduler loop: one node dispatches each round; SIGTERM/SIGINT drain."

    def add_arguments(self, parser: CommandParser) -> None:
        from ultimat3_jobs.management.roles import add_process_arguments, add_scheduler_arguments

        add_scheduler_arguments(parser)
        parser.add_argument("--once", action="store_true", help="Run one round, then exit.")
        add_process_arguments(parser)

    def handle(self, *, once: bool, **options: Any) -> None:
        from ultimat3_jobs.management.roles import build_scheduler, prepare

        prepare(options)
        scheduler = build_scheduler(options, once=once)
        if once:
            try:
                scheduler.run_once()
            except (DatabaseError, psycopg.Error) as error:
                # One round and no loop to retry in: the failure is the command's.
                raise database_error(options["database"], error) from None
            return
        scheduler.start()
        scheduler.wait()
