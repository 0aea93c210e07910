"""The example project's settings plus django-tasks-db, for the Django Tasks benchmark only."""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS, TASKS

DEBUG = False  # db_worker reloads on code changes under DEBUG
INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db", "bench"]
TASKS = {
    **TASKS,
    "default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], "bench"]},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["bench"]},
}
