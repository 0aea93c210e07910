"""The base of the app's commands."""

from __future__ import annotations

import gc
from typing import Any

from django.core.management.base import BaseCommand

from ultimat3_jobs import shutdown
from ultimat3_jobs.checks import command_database


class JobsCommand(BaseCommand):
    """A command of the app. Run from the command line (not ``call_command``), it owns its
    process, and what Django's setup built (modules, the app registry, every declared task and
    its handle) lives as long as the process does.

    So it freezes those objects first (``gc.freeze``): the cyclic collector stops walking them,
    both in the full collections of a long run and in the ones the interpreter runs at exit,
    the bulk of a short command's exit. Garbage the command itself makes is collected as before.

    A command's module imports the role it runs (``roles``, the scheduler, the worker, the relay)
    in its methods, which run after the freeze: imported with the module, before it, they set
    off a full collection of everything Django's setup made.
    """

    #: A role that runs until signalled (the scheduler, the worker, the relay): a SIGTERM or
    #: SIGINT while it starts up is kept for it, which then drains at once and exits 0.
    runs_until_signalled = False

    def run_from_argv(self, argv: list[str]) -> None:
        gc.freeze()
        if self.runs_until_signalled:
            shutdown.catch_early()
        super().run_from_argv(argv)

    def execute(self, *args: Any, **options: Any) -> str | None:
        # The system checks judge the database the command works on (its --database).
        token = command_database.set(options.get("database"))
        try:
            return super().execute(*args, **options)
        finally:
            command_database.reset(token)
