import os
import sys
import traceback
from types import FrameType

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .collector import paused
from .errors import UltimateError


class Ultimat3JobsConfig(AppConfig):
    name = "ultimat3_jobs"
    label = "ultimat3_jobs"
    verbose_name = "Scheduled jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import shutdown

        # A SIGTERM while the project's tasks.py modules import is kept for the role.
        shutdown.catch_early_in(sys.argv)
        from . import (  # noqa: F401  (registers the system checks)
            checks,
            handles,
            manual,
            outbox,
            store,
            tasks_compat,
        )

        # Handles reach the store through this, never by importing it: they sit below it.
        handles.connect_store(store.enqueue, manual.record_run)
        if tasks_compat.AVAILABLE:
            # The Django Tasks' entry adapter, where the framework is installed (the `tasks`
            # extra, or Django 6): without it, backends.py cannot be imported.
            from . import backends  # noqa: F401

        # Every installed app's tasks.py, as the admin discovers admin.py: a bad declaration
        # fails here, at startup, rather than at the first round.
        try:
            discover_tasks()
        except UltimateError as error:
            _exit_on_the_command_line(error)
            raise
        if "celery" in sys.modules:
            # The project runs Celery (its app module is imported first, as Celery's Django
            # layout has it): mark plain Celery tasks' outbox rows done when they finish.
            from . import celery  # noqa: F401


def discover_tasks() -> None:
    """Import every installed app's ``tasks`` module, the cyclic collector off meanwhile
    (``collector.paused``): what the declarations make lives as long as the process."""
    with paused():
        autodiscover_modules("tasks")


def _exit_on_the_command_line(error: UltimateError) -> None:
    """A declaration's error as a management command's (its message, code and fix, where it
    is, exit status 1), not a traceback through Django's setup; ``--traceback`` keeps that.
    Returns in any other process (a web server, a test run, ``runserver``'s reloader, which
    shows the traceback and waits for the file to be fixed), for the caller to raise it."""
    argv = sys.argv
    if "--traceback" in argv or not _in_management_utility():
        return
    if len(argv) > 1 and argv[1] == "runserver" and "--noreload" not in argv:
        return
    # The declaration's line is the last one in the project's code: not ours, not Python's own
    # (importlib, dataclasses), nor code made at run time (a dataclass's ``__init__``).
    skipped = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.__file__))
    where = ""
    for frame, line in traceback.walk_tb(error.__traceback__):
        name = frame.f_code.co_filename
        path = os.path.abspath(name)
        if not name.startswith("<") and not path.startswith(tuple(d + os.sep for d in skipped)):
            where = f" ({path}, line {line})"
    sys.stderr.write(f"{error.message}{where} [{error.code}]\nfix: {error.fix}\n")
    raise SystemExit(1)


def _in_management_utility() -> bool:
    """Whether Django's command line (``manage.py``, ``django-admin``, ``python -m django``) is
    setting Django up: its ``ManagementUtility.execute`` is on the stack."""
    management = sys.modules.get("django.core.management")
    if management is None:
        return False
    execute = management.ManagementUtility.execute.__code__
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_code is execute:
            return True
        frame = frame.f_back
    return False
