"""A manual run ("Run now", ``task.enqueue()``): its task's function is called before the
transaction that writes its jobs, so a slow function holds no lock meanwhile (SQLite's
transactions take the database's write lock as they begin: every writer would wait)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.db import connection

from ultimat3_jobs.handles import JobHandle, TaskHandle
from ultimat3_jobs.manual import run_now
from ultimat3_jobs.models import Job, Occurrence

from .factories import demo_ping, task_of

pytestmark = pytest.mark.django_db(transaction=True)


def _watched(seen: list[bool]) -> TaskHandle:
    ping = demo_ping()

    def entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        seen.append(connection.in_atomic_block)
        return [(ping, {"label": f"manual {len(seen)}"})]

    return task_of(entries, "manual.watched", cron="0 3 * * *")


def test_run_now__calls_the_task_function_outside_the_transaction_that_writes() -> None:
    seen: list[bool] = []
    run = run_now(_watched(seen), user="ada")
    assert seen == [False]
    assert [r.result.created for r in run.results] == [True]
    assert Job.objects.filter(task="manual.watched").count() == 1
    assert Occurrence.objects.get(task="manual.watched").user == "ada"


def test_task_enqueue__calls_the_task_function_outside_the_transaction_that_writes() -> None:
    seen: list[bool] = []
    [result] = _watched(seen).enqueue()
    assert seen == [False]
    assert Job.objects.filter(pk=result.result.job_id, task="manual.watched").exists()
