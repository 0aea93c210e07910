"""Django set up against $DATABASE_URL, with the schema migrated, for a benchmark process."""

from __future__ import annotations

import os


def django_ready(*, migrate: bool = True) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    # As in production: with DEBUG, Django keeps every statement rendered with its parameters.
    os.environ.setdefault("DEBUG", "False")
    import django
    from django.core.management import call_command

    django.setup()
    if migrate:
        call_command("migrate", verbosity=0, interactive=False)


def server_line() -> str:
    """The server the benchmarks run on, with the settings that decide what a commit costs."""
    import psycopg

    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    with psycopg.connect(url) as conn:
        version, fsync, synchronous = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'), "
            "current_setting('synchronous_commit')"
        ).fetchone() or ("?", "?", "?")
    return f"PostgreSQL {version}, fsync={fsync}, synchronous_commit={synchronous}"


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def without_celery() -> None:
    """Make Celery unimportable in this process, before Django is set up: the example project
    then runs as a project without the celery extra (``testproject/__init__.py``), so a
    measurement of its memory holds none of Celery's."""
    import importlib.abc
    import sys

    class NoCelery(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            if name == "celery" or name.startswith("celery."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoCelery())
