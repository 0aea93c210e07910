# Celery's Django layout: the app is created when the project package is imported. Celery is an
# optional extra of ultimat3-jobs, so the example project runs without it too.
try:
    from .celery import app as celery_app
except ImportError:  # pragma: no cover - the celery extra is not installed
    celery_app = None

__all__ = ["celery_app"]
