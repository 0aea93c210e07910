import sys

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from .collector import paused


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
        discover_tasks()
        if "celery" in sys.modules:
            # The project runs Celery (its app module is imported first, as Celery's Django
            # layout has it): mark plain Celery tasks' outbox rows done when they finish.
            from . import celery  # noqa: F401


def discover_tasks() -> None:
    """Import every installed app's ``tasks`` module, the cyclic collector off meanwhile
    (``collector.paused``): what the declarations make lives as long as the process."""
    with paused():
        autodiscover_modules("tasks")
