"""Entries another engine runs: a Celery task, or a Django Task on a backend that is not ours.

A round writes them to the job table as outbox rows (status ``outbox``) under the occurrence
key, in its own transaction, like any entry; ``run_relay`` (``relay.py``) then hands each one to
its engine. Nothing here touches the database or imports Celery: a project without it never
loads it, and a Celery task is recognised only once the project has imported Celery itself.
"""

from __future__ import annotations

import inspect
import json
import sys
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import TaskBackendError
from .registry import DjangoTaskHandle, JobHandle

if TYPE_CHECKING:
    from .store import EnqueueResult

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


class RelayedTaskHandle(DjangoTaskHandle):
    """A Django Task on a backend other than ``JobsBackend``: an outbox row ``run_relay``
    enqueues through that backend's ``enqueue()``, once per occurrence."""

    def __init__(self, task: Any) -> None:
        super().__init__(task)
        self.relay = TASKS

    def __repr__(self) -> str:
        return f"<relayed django task {self.name} on {self.backend}>"

    def check_backend(self, database: str | None) -> None:
        backend_of(self.task, owner=self.name)

    def enqueue(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
        task: str = "",
    ) -> EnqueueResult:
        """A manual run ("Run now"): an outbox row, which the relay sends like a round's."""
        return JobHandle.enqueue(
            self,
            input,
            key=key,
            run_at=run_at or self.task.run_after,
            queue=queue,
            enqueued_by=enqueued_by,
            task=task,
        )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kind": "relayed-django-task", "relay": self.relay}


def json_value(value: Any) -> Any:
    """``value`` if the row's JSON column can keep it, else None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return value


def backend_of(task: Any, *, owner: str) -> Any:
    """The backend a Django Task is declared on, or a ``TaskBackendError`` naming the alias."""
    from .tasks_compat import task_backends

    try:
        return task_backends[task.backend]
    except Exception as error:
        raise TaskBackendError(
            f'"{owner}" enqueues {task.module_path}, whose backend "{task.backend}" is not in '
            "TASKS",
            fix=f'add TASKS["{task.backend}"] to the settings, or declare the task with '
            "backend= an alias that is there",
            cause=error,
        ) from error


def _on_jobs_backend(task: Any) -> bool:
    from .backends import JobsBackend

    try:
        return isinstance(backend_of(task, owner=task.module_path), JobsBackend)
    except TaskBackendError:
        return True  # DjangoTaskHandle.check_backend reports the missing alias.


def celery_task_handle(task: Any) -> CeleryTaskHandle:
    """The entry handle of a Celery task, built once per task name."""
    with _lock:
        handle = _celery_handles.get(task.name)
        if handle is None or handle.task is not task:
            handle = _celery_handles[task.name] = CeleryTaskHandle(task)
        return handle


def entry_handle(value: object) -> JobHandle | None:
    """The handle of an entry another engine runs, or None when ``value`` is not one."""
    if is_celery_task(value):
        return celery_task_handle(value)
    from .tasks_compat import is_django_task

    if is_django_task(value) and not _on_jobs_backend(value):
        return RelayedTaskHandle(value)
    return None


__all__ = [
    "CELERY",
    "CELERY_ONCE",
    "RESENDABLE",
    "TASKS",
    "CeleryTaskHandle",
    "RelayedTaskHandle",
    "entry_handle",
    "is_celery_task",
]
