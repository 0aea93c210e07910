"""The app loads and enqueues with each optional extra missing: Django Tasks, Celery, or both
(and OpenTelemetry with them).

Each case is a fresh process in which the missing libraries cannot be imported, as in a project
that did not install the ``tasks`` or ``celery`` extra.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.acceptance]

SCRIPT = """
import importlib.abc
import sys

MISSING = set(sys.argv[1:])


class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Missing())

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "ultimat3_jobs"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
    TASKS={"default": {"BACKEND": "ultimat3_jobs.backends.JobsBackend"}},
)
django.setup()

from django.core.management import call_command

call_command("migrate", verbosity=0)

from ultimat3_jobs import job, task
from ultimat3_jobs.models import Job


@job(name="extras.ping")
def ping(n: int) -> None: ...


entries = [(ping, {"n": 1})]
if "django_tasks" not in MISSING:
    from django_tasks import task as django_task

    @django_task()
    def report(n: int) -> None: ...

    entries.append((report, {"n": 2}))
if "celery" not in MISSING:
    from celery import Celery

    app = Celery("extras", set_as_current=False)

    @app.task(name="extras.publish")
    def publish(n: int) -> None: ...

    entries.append((publish, {"n": 3}))


@task(cron="0 3 * * *", tz="UTC", name="extras.nightly")
def nightly(occurrence):
    return entries


for handle, data in nightly.entries():
    handle.enqueue(data)
print(sorted(type(handle).__name__ for handle, _ in nightly.entries()))
print(sorted(Job.objects.values_list("name", "status")))
print("ultimat3_jobs.backends" in sys.modules)
"""


@pytest.mark.parametrize(
    ("missing", "handles", "rows"),
    [
        pytest.param(
            ["django_tasks", "celery", "opentelemetry"],
            ["JobHandle"],
            [("extras.ping", "queued")],
            id="no_extra",
        ),
        pytest.param(
            ["django_tasks"],
            ["CeleryTaskHandle", "JobHandle"],
            [("extras.ping", "queued"), ("extras.publish", "outbox")],
            id="celery_only",
        ),
        pytest.param(
            ["celery"],
            ["DjangoTaskHandle", "JobHandle"],
            [("__main__.report", "queued"), ("extras.ping", "queued")],
            id="tasks_only",
        ),
        pytest.param(
            [],
            ["CeleryTaskHandle", "DjangoTaskHandle", "JobHandle"],
            [
                ("__main__.report", "queued"),
                ("extras.ping", "queued"),
                ("extras.publish", "outbox"),
            ],
            id="both",
        ),
    ],
)
def test_app__loads_and_enqueues_every_entry_its_extras_allow(
    missing: list[str], handles: list[str], rows: list[tuple[str, str]]
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *missing],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    kinds, stored, backends_loaded = result.stdout.splitlines()
    assert kinds == repr(handles)
    assert stored == repr(rows)
    # Without the framework, the module that needs it is never imported.
    assert backends_loaded == repr("django_tasks" not in missing)
