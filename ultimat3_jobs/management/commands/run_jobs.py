"""``manage.py run_jobs``: the scheduler and a worker in one process, for small deployments.

One leader election (the scheduler's), one drain: the first SIGTERM/SIGINT stops both (the
scheduler finishes its round and hands leadership back while the worker finishes its jobs in
flight), the second exits at once.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from ultimat3_jobs.management.base import JobsCommand


class Command(JobsCommand):
    runs_until_signalled = True
    help = (
        "Run the scheduler and a worker in one process (a small site's one process). The "
        "first SIGTERM/SIGINT drains both; the second exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from ultimat3_jobs.management.roles import (
            add_process_arguments,
            add_scheduler_arguments,
            add_worker_arguments,
        )

        add_scheduler_arguments(parser)
        add_worker_arguments(parser)
        add_process_arguments(parser)

    def handle(self, **options: Any) -> None:
        from ultimat3_jobs.management.roles import (
            build_scheduler,
            build_worker,
            prepare,
            worker_exit,
        )

        prepare(options)
        scheduler = build_scheduler(options)
        worker = build_worker(options)
        # Both register with ultimat3_jobs.shutdown, so one signal reaches both.
        scheduler.start()
        try:
            exit_code = worker.run()
        finally:
            # Joins the drain the signal began (or stops it if the worker ended on its own);
            # stop() may return as soon as the status reads "stopped", wait() once it is done.
            scheduler.stop("worker-stopped")
            scheduler.wait()
        worker_exit(exit_code, options["database"], worker.gave_up)
