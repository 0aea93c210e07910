"""``manage.py run_worker``: parse the flags, build a Worker, run it until drained."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ultimat3_jobs.management.arguments import positive_int
from ultimat3_jobs.management.base import JobsCommand


class Command(JobsCommand):
    runs_until_signalled = True
    help = (
        "Run the jobs the scheduler enqueues. The first SIGTERM/SIGINT stops claiming and "
        "waits for the jobs in flight; the second exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from ultimat3_jobs.management.roles import add_process_arguments, add_worker_arguments

        add_worker_arguments(parser)
        parser.add_argument("--burst", action="store_true", help="Run what is due now, then exit.")
        parser.add_argument(
            "--max-jobs", type=positive_int, help="Exit after running this many jobs."
        )
        add_process_arguments(parser)

    def handle(self, *, burst: bool, max_jobs: int | None, **options: Any) -> None:
        from ultimat3_jobs.management.roles import build_worker, prepare, worker_exit

        prepare(options)
        worker = build_worker(options, burst=burst, max_jobs=max_jobs)
        worker_exit(worker.run(), options["database"], worker.gave_up)
