import sys

from django.apps import AppConfig


class Ultimat3JobsConfig(AppConfig):
    name = "ultimat3_jobs"
    label = "ultimat3_jobs"
    verbose_name = "Scheduled jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks, relay_checks  # noqa: F401  (registers the system checks)

        # Every installed app's tasks.py, as the admin discovers admin.py: a bad declaration
        # fails here, at startup, rather than at the first round.
        autodiscover_modules("tasks")
        if "celery" in sys.modules:
            # The project runs Celery (its app module is imported first, as Celery's Django
            # layout has it): mark plain Celery tasks' outbox rows done when they finish.
            from . import celery  # noqa: F401
