"""The example project's settings plus django-tasks-db, for the Django Tasks benchmark only."""

from typing import Any

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS
from testproject.settings import TASKS as PROJECT_TASKS

TASKS_BASE: dict[str, Any] = PROJECT_TASKS

DEBUG = False  # db_worker reloads on code changes under DEBUG
INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db", "bench"]
TASKS = {
    **TASKS_BASE,
    "default": {**TASKS_BASE["default"], "QUEUES": [*TASKS_BASE["default"]["QUEUES"], "bench"]},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["bench"]},
}
