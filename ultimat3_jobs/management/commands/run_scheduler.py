"""``manage.py run_scheduler``: parse the flags, build a Scheduler, run it until a signal."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from ultimat3_jobs import logs
from ultimat3_jobs.conf import LEADERS, get_settings
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.leaders import build_leader
from ultimat3_jobs.management.arguments import positive_seconds
from ultimat3_jobs.management.preflight import command_error, database_error, require_migrated
from ultimat3_jobs.nodes import new_node_id
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState


class Command(BaseCommand):
    help = "Run the scheduler loop: one node dispatches each round; SIGTERM/SIGINT drain."

    def add_arguments(self, parser: CommandParser) -> None:
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
        parser.add_argument("--log-format", choices=("text", "json"), default="text")
        parser.add_argument("--once", action="store_true", help="Run one round, then exit.")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(
        self,
        *,
        leader: str | None,
        tick_interval: float | None,
        log_format: str,
        once: bool,
        database: str,
        verbosity: int,
        **options: Any,
    ) -> None:
        logs.configure(log_format, logging.DEBUG if verbosity > 1 else logging.INFO)
        require_migrated(database)
        try:
            config = get_settings()
            node_id = new_node_id()
            election = build_leader(leader, node_id=node_id, using=database)
        except UltimateError as error:
            raise command_error(error) from error
        state = DatabaseState(
            node_id=node_id,
            leader=election.name,
            using=database,
            heartbeat_interval=config.heartbeat_interval,
            clock_skew_warning=config.clock_skew_warning,
        )
        scheduler = Scheduler(
            state=state,
            leader=election,
            tick_interval=timedelta(seconds=tick_interval)
            if tick_interval
            else config.tick_interval,
            misfire_grace=config.misfire_grace,
        )
        if once:
            try:
                scheduler.run_once()
            except (DatabaseError, psycopg.Error) as error:
                # One round and no loop to retry in: the failure is the command's.
                raise database_error(database, error) from None
            return
        scheduler.start()
        scheduler.wait()
