"""``manage.py check`` for relaying: Celery settings that would lose a killed worker's message."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from django.core import checks

ACKS_LATE_FIX = (
    "set CELERY_TASK_ACKS_LATE = True and CELERY_TASK_REJECT_ON_WORKER_LOST = True (or "
    "acks_late=True on the task), so a message comes back when its worker dies"
)


@checks.register()
def check_relayed_celery_tasks(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every scheduled ``ExactlyOnceTask`` acknowledges late: else a killed worker's message is
    gone until the relay resends it after ``RELAY_RESEND_AFTER``."""
    if "celery" not in sys.modules:
        return []
    from .outbox import CELERY_ONCE, CeleryTaskHandle
    from .registry import registry

    messages: list[checks.CheckMessage] = []
    seen: set[str] = set()
    for handle in registry.tasks():
        try:
            entries = handle.entries()
        except Exception:
            continue  # A failing function is the scheduler's to report, every round.
        for job, _ in entries:
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
