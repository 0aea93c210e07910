"""Entries another engine runs: a Celery task, or a Django Task on a backend that is not ours.

A round writes them to the job table as outbox rows (status ``outbox``) under the occurrence
key, in its own transaction, like any entry; ``run_relay`` (``relay.py``) then hands each one to
its engine. The relay kinds and the Celery task's handle are here (importing this module
registers its entry adapter); a Django Task's is in ``backends.py``, beside the backend. Nothing
here touches the database or imports Celery: a project without it never loads it, and a Celery
task is recognised only once the project has imported Celery itself.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

from .handles import JobHandle, add_entry_adapter

#: Relay kinds, the job row's ``relay`` column. Only "celery-once" rows are ever sent again.
CELERY = "celery"
CELERY_ONCE = "celery-once"
TASKS = "tasks"
#: Relays whose rows are resent when not done in time: the task dedupes a second copy.
RESENDABLE = (CELERY_ONCE,)

_lock = threading.Lock()
_celery_handles: dict[str, CeleryTaskHandle] = {}


def is_celery_task(value: object) -> bool:
    """Whether ``value`` is a Celery task (``@shared_task`` returns a proxy: isinstance works)."""
    celery = sys.modules.get("celery")
    if celery is None:
        return False
    try:
        return isinstance(value, celery.Task)
    except Exception:  # A proxy whose app cannot be finalised yet.
        return False


def _celery_queue(task: Any) -> str:
    """The queue Celery routes ``task`` to, for display; publishing lets Celery route it."""
    try:
        route = task.app.amqp.router.route({}, task.name)
        return str(route["queue"].name)
    except Exception:
        return str(getattr(task, "queue", None) or task.app.conf.task_default_queue)


class CeleryTaskHandle(JobHandle):
    """A Celery task as a scheduler entry: an outbox row that ``run_relay`` publishes.

    Keyword arguments only, checked against the task's signature when the round builds them.
    An ``ExactlyOnceTask`` is marked "celery-once": it is resent when not done in time.
    """

    def __init__(self, task: Any) -> None:
        from .celery import ExactlyOnceTask

        super().__init__(
            task.run, name=task.name, key=None, max_attempts=1, queue=_celery_queue(task)
        )
        self.task = task
        self.relay = CELERY_ONCE if isinstance(task, ExactlyOnceTask) else CELERY
        if getattr(task, "typing", True) is False:
            # Declared with typing=False: Celery checks no arguments, and neither do we.
            anything = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)
            self.signature = inspect.Signature([anything])

    def __repr__(self) -> str:
        return f"<celery task {self.name}>"

    def describe(self) -> dict[str, Any]:
        return {"kind": "celery-task", "name": self.name, "queue": self.queue, "relay": self.relay}


def celery_task_handle(task: Any) -> CeleryTaskHandle:
    """The entry handle of a Celery task, built once per task name."""
    with _lock:
        handle = _celery_handles.get(task.name)
        if handle is None or handle.task is not task:
            handle = _celery_handles[task.name] = CeleryTaskHandle(task)
        return handle


def entry_handle(value: object) -> JobHandle | None:
    """The handle of a Celery task entry, or None when ``value`` is not one."""
    return celery_task_handle(value) if is_celery_task(value) else None


add_entry_adapter(entry_handle)


__all__ = [
    "CELERY",
    "CELERY_ONCE",
    "RESENDABLE",
    "TASKS",
    "CeleryTaskHandle",
    "entry_handle",
    "is_celery_task",
]
