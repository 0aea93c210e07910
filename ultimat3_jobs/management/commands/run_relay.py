"""``manage.py run_relay``: parse the flags, build a Relay, run it until drained."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandParser

from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.management.arguments import MAX_BATCH, positive_seconds, up_to
from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import command_error


class Command(JobsCommand):
    runs_until_signalled = True
    help = (
        "Hand outbox rows (scheduled Celery tasks, Django Tasks on other backends) to the "
        "engine that runs them. Several may run at once; SIGTERM finishes the row in hand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from ultimat3_jobs.management.roles import add_process_arguments
        from ultimat3_jobs.relay import DEFAULT_BATCH

        parser.add_argument(
            "--batch",
            type=up_to(MAX_BATCH),
            default=DEFAULT_BATCH,
            help=f"Rows locked and sent per transaction (default {DEFAULT_BATCH}).",
        )
        parser.add_argument("--burst", action="store_true", help="Send what is due now, then exit.")
        parser.add_argument(
            "--poll-interval",
            type=positive_seconds,
            help="Seconds between polls for outbox rows (default: WORKER_POLL_INTERVAL).",
        )
        parser.add_argument(
            "--resend-after",
            type=positive_seconds,
            help="Seconds after which an ExactlyOnceTask not done is sent again "
            "(default: RELAY_RESEND_AFTER).",
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="Poll only; do not LISTEN for new rows (e.g. behind a transaction pooler).",
        )
        parser.add_argument(
            "--stats",
            action="store_true",
            help="Print the outbox's rows by state as JSON (outbox, relayed, done, failed, "
            "stuck) and exit, for monitoring.",
        )
        add_process_arguments(parser)

    def handle(
        self,
        *,
        batch: int,
        burst: bool,
        poll_interval: float | None,
        resend_after: float | None,
        no_listen: bool,
        stats: bool,
        **options: Any,
    ) -> None:
        from ultimat3_jobs import health
        from ultimat3_jobs.lifecycle import DATABASE_ERRORS
        from ultimat3_jobs.management.preflight import database_error
        from ultimat3_jobs.management.roles import prepare, relay_exit
        from ultimat3_jobs.relay import Relay

        # --stats prints and exits: no exporter to serve.
        prepare(options, exporter=not stats)
        try:
            relay = Relay(
                using=options["database"],
                batch=batch,
                burst=burst,
                poll_interval=timedelta(seconds=poll_interval) if poll_interval else None,
                resend_after=timedelta(seconds=resend_after) if resend_after else None,
                listen=not no_listen,
            )
        except UltimateError as error:
            raise command_error(error) from error
        health.process.watch(relay)
        if stats:
            try:
                counts = relay.counts()
            except DATABASE_ERRORS as error:
                raise database_error(options["database"], error) from error
            self.stdout.write(json.dumps(counts, sort_keys=True))
            return
        relay.run()
        relay_exit(relay.gave_up, options["database"])
