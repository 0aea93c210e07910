"""``manage.py check`` rules for relaying: Celery settings that would lose a killed worker's
message, and ``overlap="skip"`` tasks whose relayed rows no engine would ever report done.

Each rule reads one task's scheduled jobs; ``checks.check_scheduled_jobs`` calls every task's
function once and hands its jobs to each rule."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core import checks

from .outbox import CELERY, CELERY_ONCE, TASKS, CeleryTaskHandle

if TYPE_CHECKING:
    from .handles import TaskHandle

ACKS_LATE_FIX = (
    "set CELERY_TASK_ACKS_LATE = True and CELERY_TASK_REJECT_ON_WORKER_LOST = True (or "
    "acks_late=True on the task), so a message comes back when its worker dies"
)
UNREPORTED_TASKS_FIX = (
    'use overlap="allow" for this task, or give the Django Task a backend that can say when a '
    "task finished (supports_get_result, or JobsBackend)"
)
UNREPORTED_CELERY_FIX = (
    'use overlap="allow" for this task, or make the Celery task an ExactlyOnceTask (resent '
    "until done); a plain one needs acks_late=True (CELERY_TASK_ACKS_LATE) and "
    "ultimat3_jobs.celery imported where its workers run"
)


def acks_late_warnings(
    handle: TaskHandle, jobs: Sequence[Any], seen: set[str]
) -> list[checks.CheckMessage]:
    """Every scheduled ``ExactlyOnceTask`` acknowledges late: else a killed worker's message is
    gone until the relay resends it after ``RELAY_RESEND_AFTER``. ``seen``: the Celery tasks
    already looked at, by any task (each is warned about once)."""
    if "celery" not in sys.modules:
        return []
    messages: list[checks.CheckMessage] = []
    for job in jobs:
        if not isinstance(job, CeleryTaskHandle) or job.name in seen:
            continue
        seen.add(job.name)
        if job.relay == CELERY_ONCE and not getattr(job.task, "acks_late", False):
            messages.append(
                checks.Warning(
                    f'task "{handle.name}" schedules the ExactlyOnceTask "{job.name}", which '
                    "acknowledges its message before running: a worker killed mid-body "
                    "loses it until the relay resends it after RELAY_RESEND_AFTER",
                    hint=ACKS_LATE_FIX,
                    id="ultimat3_jobs.W006",
                )
            )
    return messages


def overlap_warnings(handle: TaskHandle, jobs: Sequence[Any]) -> list[checks.CheckMessage]:
    """No ``overlap="skip"`` task schedules work on an engine that may never report it done:
    a relayed row counts as busy until it is, so the task would be held back for good."""
    if handle.overlap != "skip":
        return []
    messages: list[checks.CheckMessage] = []
    seen: set[str] = set()
    for job in jobs:
        problem = _unreported(job)
        if problem is None or job.name in seen:
            continue
        seen.add(job.name)
        why, fix = problem
        messages.append(
            checks.Warning(
                f'task "{handle.name}" has overlap="skip" and schedules {why}: its row would '
                "stay relayed, and the task would never fire again",
                hint=fix,
                id="ultimat3_jobs.W007",
            )
        )
    return messages


def _unreported(job: Any) -> tuple[str, str] | None:
    """Why the engine of ``job``'s rows may never report one done, and the fix; None if it will.

    Done is reported by an ``ExactlyOnceTask`` in its own transaction (resent until then), by
    ``ultimat3_jobs.celery``'s signal handlers for a plain Celery task, by a Tasks backend
    that runs the task inside ``enqueue()`` or answers ``get_result`` (``Relay.check_results``).
    """
    relay = getattr(job, "relay", "")
    if relay == TASKS:
        from . import tasks_compat

        try:
            backend = tasks_compat.task_backends[job.backend]
        except Exception:
            return None  # The framework's own checks report a backend that cannot load.
        if backend.supports_get_result or isinstance(backend, tasks_compat.ImmediateBackend):
            return None
        return (
            f'the Django Task "{job.name}" on backend "{job.backend}", which cannot say when a '
            "task finished (no supports_get_result)",
            UNREPORTED_TASKS_FIX,
        )
    if relay == CELERY:
        from .celery import reports_plain_tasks

        if not reports_plain_tasks():
            return (
                f'the plain Celery task "{job.name}", whose end no handler records here '
                "(ultimat3_jobs.celery's signal handlers are not connected)",
                UNREPORTED_CELERY_FIX,
            )
        if not getattr(job.task, "acks_late", False):
            return (
                f'the plain Celery task "{job.name}", which acknowledges its message before '
                "running: a worker killed mid-task loses it, and nothing resends a plain task",
                UNREPORTED_CELERY_FIX,
            )
    return None
