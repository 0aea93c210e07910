from importlib.util import find_spec

from django.contrib import admin
from django.urls import path

from ultimat3_jobs.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # Prometheus text; open here, a real project mounts it behind its own access control.
    path("metrics", metrics_view, name="metrics"),
]

if find_spec("health_check") is not None:  # the `health` extra
    from health_check.views import HealthCheckView

    urlpatterns.append(
        path(
            "health/jobs/",
            HealthCheckView.as_view(
                checks=[
                    "ultimat3_jobs.health_checks.Scheduler",
                    "ultimat3_jobs.health_checks.Worker",
                ]
            ),
            name="jobs-health",
        )
    )
