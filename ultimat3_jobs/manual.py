"""Running a task by hand ("Run now"): enqueue its entries and record who asked.

Kept apart from the admin so a shell, a command or an API can do exactly what the button does.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from . import clock
from .models import Occurrence, Outcome
from .registry import TaskHandle, TaskJobResult


@dataclass(frozen=True)
class ManualRun:
    """One "Run now": the jobs it produced and the occurrence record that tells of it."""

    task: str
    results: list[TaskJobResult]
    record: Occurrence

    @property
    def created(self) -> list[TaskJobResult]:
        return [r for r in self.results if r.result.created]

    @property
    def present(self) -> list[TaskJobResult]:
        return [r for r in self.results if not r.result.created]


def run_now(handle: TaskHandle, *, user: str, detail: str = "run now") -> ManualRun:
    """Enqueue ``handle``'s entries now, as ``admin:<user>``, and record a manual occurrence.

    Plain job keys and the watermark untouched (``TaskHandle.enqueue``): a manual run neither
    replaces nor delays the next scheduled occurrence. A job whose key already existed is
    reported as present and left as it was. The jobs and the record commit together; an
    ``UltimateError`` from the task's function propagates and nothing is written.
    """
    with transaction.atomic():
        at = clock.now()
        results = handle.enqueue(enqueued_by=f"admin:{user}")
        record = Occurrence.objects.create(
            task=handle.name,
            outcome=Outcome.MANUAL,
            occurrence=at,
            last_occurrence=at,
            jobs=[
                {"job": r.job, "key": r.result.key, "created": r.result.created} for r in results
            ],
            recorded_at=at,
            user=user,
            detail=detail,
        )
    return ManualRun(task=handle.name, results=results, record=record)
