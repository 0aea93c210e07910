"""``manage.py celery_beat_tasks``: print ``@task`` declarations for django-celery-beat's rows."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser
from django.db import DEFAULT_DB_ALIAS

from ultimat3_jobs.celery_beat import read_beat_tasks, render
from ultimat3_jobs.errors import UltimateError
from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import command_error, require_database


class Command(JobsCommand):
    help = (
        "Print @task declarations for the PeriodicTask rows of a django-celery-beat database "
        "(read with plain SQL; the package need not be installed). Nothing is written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--prefix", default="beat", help='Task names are "<prefix>.<name>" (default beat).'
        )
        parser.add_argument(
            "--skip-disabled", action="store_true", help="Leave out rows disabled in beat."
        )
        parser.add_argument(
            "--tz",
            help="Zone of crontabs that name none (default: CELERY_TIMEZONE, else TIME_ZONE).",
        )

    def handle(
        self, *, database: str, prefix: str, skip_disabled: bool, tz: str | None, **options: Any
    ) -> None:
        from ultimat3_jobs.errors import InvalidDeclarationError
        from ultimat3_jobs.zones import resolve_zone

        require_database(database)
        zone = tz or getattr(settings, "CELERY_TIMEZONE", None) or settings.TIME_ZONE or "UTC"
        try:
            # Refused here, not at the import of the file printed: a name or zone no task takes.
            resolve_zone(zone, "", given_to="the zone (--tz, else CELERY_TIMEZONE or TIME_ZONE)")
            if not prefix.strip() or ":" in prefix or len(prefix) > 100:
                raise InvalidDeclarationError(
                    f"--prefix {prefix!r} cannot begin a task name",
                    fix='pass a prefix of up to 100 characters without ":", e.g. --prefix beat',
                    cause=prefix,
                )
            tasks = read_beat_tasks(database, default_tz=zone)
        except UltimateError as error:
            raise command_error(error) from error
        self.stdout.write(
            render(tasks, prefix=prefix, include_disabled=not skip_disabled), ending=""
        )
