from django.contrib import admin
from django.urls import path

from ultimat3_jobs.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # Prometheus text; open here, a real project mounts it behind its own access control.
    path("metrics", metrics_view, name="metrics"),
]
