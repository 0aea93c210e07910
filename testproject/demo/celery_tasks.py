"""Celery tasks (``@shared_task``) a schedule's entries name; the relay publishes them.

Nothing is scheduled here: ``testproject/acceptance/relayed.py`` declares the per-second
tasks whose entries these are, and the tests name them directly.
"""

from __future__ import annotations

import os
import random
import time

from celery import shared_task  # type: ignore[import-untyped, unused-ignore]
from celery.exceptions import Ignore, Reject  # type: ignore[import-untyped, unused-ignore]

from ultimat3_jobs.celery import ExactlyOnceTask

from .models import Ping


@shared_task(base=ExactlyOnceTask, bind=True, name="demo.write_row")
def write_row(self: ExactlyOnceTask, occurrence: str) -> str:
    """One row per occurrence, then a pause, so a kill often lands before the commit."""
    Ping.objects.create(label=f"relayed {occurrence}")
    if occurrence == "explode":
        raise RuntimeError("the body failed after writing its row")
    pause = float(os.environ.get("ULTIMAT3_ACCEPTANCE_BODY_PAUSE", "0"))
    if pause:
        time.sleep(random.uniform(0, pause))
    return self.job_key or ""


@shared_task(name="demo.plain_row")
def plain_row(label: str) -> None:
    """A plain Celery task: at least once, its row marked done by the signal handlers."""
    Ping.objects.create(label=label)


def _note_run(label: str) -> None:
    """A line per run of a body, outside the database, so a test counts runs a rollback undid."""
    path = os.environ.get("ULTIMAT3_ACCEPTANCE_BODY_LOG")
    if path:
        with open(path, "a") as file:
            file.write(f"{label}\n")


@shared_task(base=ExactlyOnceTask, bind=True, name="demo.once_ends")
def once_ends(self: ExactlyOnceTask, label: str, how: str) -> str:
    """Writes a row, then ends as ``how`` says: "return", "ignore", "reject" (not requeued),
    "requeue" (rejected and requeued), "replace" (by ``plain_row``) or "nul" (returns what a
    PostgreSQL ``jsonb`` column refuses)."""
    Ping.objects.create(label=label)
    _note_run(label)
    if how == "ignore":
        raise Ignore()
    if how == "reject":
        raise Reject("the body refused its message", requeue=False)
    if how == "requeue":
        raise Reject("the body wants it again", requeue=True)
    if how == "replace":
        return self.replace(plain_row.si(label=f"{label} replacement"))
    if how == "nul":
        return f"{label} \x00"
    return label


@shared_task(name="demo.plain_ends")
def plain_ends(label: str, how: str) -> str | None:
    """A plain task that writes a row, then ignores or rejects its message as ``how`` says,
    or returns what a PostgreSQL ``jsonb`` column refuses ("nul")."""
    Ping.objects.create(label=label)
    if how == "ignore":
        raise Ignore()
    if how == "reject":
        raise Reject("the body refused its message", requeue=False)
    if how == "nul":
        return f"{label} \x00"
    return None
