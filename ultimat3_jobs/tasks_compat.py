"""The Django Tasks API from wherever it lives: ``django.tasks`` (Django 6+), else the backport.

Every other module imports the framework through here, so moving to Django 6 changes nothing
else. ``AVAILABLE`` is False when neither is installed: ``@job`` and ``@task`` work without it.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING or not find_spec("django.tasks"):
    try:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.backends.immediate import ImmediateBackend
        from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
        from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import get_exception_traceback, normalize_json

        AVAILABLE = True
    except ImportError:  # pragma: no cover - the extra is not installed
        AVAILABLE = False
else:  # pragma: no cover - Django 6
    from traceback import format_exception

    from django.tasks import (  # type: ignore[no-redef]
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django.tasks.backends.immediate import ImmediateBackend  # type: ignore[no-redef]
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError  # type: ignore[no-redef]
    from django.tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTask as InvalidTaskError,
    )
    from django.tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
    from django.tasks.signals import (  # type: ignore[no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django.utils.json import normalize_json  # type: ignore[no-redef]

    def get_exception_traceback(exc: BaseException) -> str:  # type: ignore[misc]
        return "".join(format_exception(exc))

    AVAILABLE = True


def is_django_task(value: object) -> bool:
    """Whether ``value`` is a task declared with the framework's ``@task``."""
    return AVAILABLE and isinstance(value, Task)


__all__ = [
    "AVAILABLE",
    "DEFAULT_TASK_PRIORITY",
    "BaseTaskBackend",
    "ImmediateBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "get_exception_traceback",
    "is_django_task",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
