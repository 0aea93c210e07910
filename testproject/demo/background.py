"""Example Django Tasks (the framework's ``@task``), run by ``JobsBackend``'s worker."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django_tasks import TaskContext, task

from .models import Ping


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def record(label: str) -> str:
    """Leave a row, so a test sees that (and in which order) it ran."""
    Ping.objects.create(label=label)
    return label


@task()
def record_uncommitted(label: str) -> str:
    """Leave a row with autocommit off, and return without committing it."""
    transaction.set_autocommit(False)
    Ping.objects.create(label=label)
    return label


@task(queue_name="emails", priority=10)
def send_email(to: str) -> dict[str, str]:
    return {"sent": to}


@task()
def explode(reason: str) -> None:
    raise ValueError(f"exploded: {reason}")


@task()
async def add_later(a: int, b: int) -> int:
    return a + b


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(takes_context=True)
def attempt_of(context: TaskContext, label: str) -> dict[str, Any]:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task(backend="elsewhere")
def elsewhere(label: str) -> None:
    """On a backend that is not ``JobsBackend``: a schedule's rows for it are relayed."""


@task(backend="immediate")
def record_immediately(label: str) -> str:
    """On a second backend that runs it inside ``enqueue()``: the relay hands it over."""
    Ping.objects.create(label=label)
    return label


@task(backend="immediate")
def unstorable_immediately(label: str, raises: bool = False) -> str:
    """Runs inside ``enqueue()`` and returns (or raises with) text no ``jsonb`` keeps: a NUL."""
    if raises:
        raise ValueError(f"{label} \x00")
    return f"{label} \x00"


@task(backend="immediate")
def break_transaction() -> None:
    """Fails on the database inside ``enqueue()``, where the relay's transaction is open."""
    Ping.objects.create(label=None)  # type: ignore[misc]


@task(backend="reporting")
def reported(label: str) -> None:
    """On a backend that reports when its tasks finish; nothing runs it in the tests."""


@task()
def stamp(occurrence: str) -> str:
    """What the multi-process tests schedule every second: its result names its occurrence."""
    return occurrence


@task()
def unstorable(label: str) -> str:
    """Return text no JSON column keeps (a NUL character): its run must still end, failed."""
    return f"{label}\x00"


@task()
def not_json(label: str) -> dict[str, object]:
    """Return a value JSON has no form for (a set): its run must end failed, saying so."""
    return {label: {1, 2}}


@task()
def nested(levels: int) -> list[object]:
    """Return a list nested ``levels`` deep: past Python's recursion limit, no row keeps it."""
    value: list[object] = []
    for _ in range(levels):
        value = [value]
    return value


@task()
def nap(seconds: float) -> None:
    """Sleeps: past ``JOB_TIMEOUT``, the worker ends it failed."""
    time.sleep(seconds)
