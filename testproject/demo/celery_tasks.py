"""Celery tasks (``@shared_task``) a schedule's entries name; the relay publishes them.

Nothing is scheduled here: ``testproject/acceptance/relayed.py`` declares the per-second
tasks whose entries these are, and the tests name them directly.
"""

from __future__ import annotations

import os
import random
import time

from celery import shared_task  # type: ignore[import-untyped, unused-ignore]

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
