"""The project's Celery app, laid out as Celery's Django guide has it.

``CELERY_*`` settings configure it; ``testproject/__init__.py`` imports it, so the app exists
(and is current) before Django loads the apps whose ``tasks.py`` declare ``@shared_task``s.
"""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped, unused-ignore]

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
