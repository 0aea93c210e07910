"""Per-second tasks whose entries another engine runs: a Celery task, a second Tasks backend.

Imported by ``tasks.py`` only when ULTIMAT3_ACCEPTANCE_RELAY is set, in the scheduler, the
relays and the Celery worker alike. Each is declared only when its engine is installed (the
`celery` extra; the `tasks` extra or Django 6), so each extra's environment runs the other.
"""

from __future__ import annotations

import os
from datetime import datetime
from importlib.util import find_spec

from ultimat3_jobs import Entry, task
from ultimat3_jobs.tasks_compat import AVAILABLE as DJANGO_TASKS

if find_spec("celery") is not None:
    from testproject.demo.celery_tasks import write_row

    @task(
        cron="* * * * * *",
        tz="UTC",
        name="acceptance.relay_every_second",
        catch_up="run-all",
        max_catch_up=1000,
    )
    def relay_every_second(occurrence: datetime) -> list[Entry]:
        return [(write_row, {"occurrence": occurrence.isoformat()})]

    if os.environ.get("ULTIMAT3_ACCEPTANCE_RELAY_EXCLUSIVE"):
        from testproject.demo.celery_tasks import plain_row

        @task(cron="* * * * * *", tz="UTC", name="acceptance.relay_exclusive", overlap="skip")
        def relay_exclusive(occurrence: datetime) -> list[Entry]:
            return [(plain_row, {"label": f"exclusive {occurrence.isoformat()}"})]

    if os.environ.get("ULTIMAT3_ACCEPTANCE_NEW_RELEASE"):
        # A task only the next release declares: a relay without it is of the last release.
        from celery import shared_task  # type: ignore[import-untyped, unused-ignore]

        from testproject.demo.models import Ping

        @shared_task(name="acceptance.new_release_row")
        def new_release_row(label: str) -> None:
            Ping.objects.create(label=label)


if DJANGO_TASKS and os.environ.get("ULTIMAT3_ACCEPTANCE_IMMEDIATE"):
    from testproject.demo.background import record_immediately

    @task(
        cron="* * * * * *",
        tz="UTC",
        name="acceptance.immediate_every_second",
        catch_up="run-all",
        max_catch_up=1000,
    )
    def immediate_every_second(occurrence: datetime) -> list[Entry]:
        return [(record_immediately, {"label": f"immediate {occurrence.isoformat()}"})]
