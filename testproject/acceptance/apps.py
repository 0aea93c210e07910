from django.apps import AppConfig


class AcceptanceConfig(AppConfig):
    """Per-second tasks for the multi-process tests; installed only when ULTIMAT3_ACCEPTANCE=1."""

    name = "testproject.acceptance"
    label = "acceptance"
