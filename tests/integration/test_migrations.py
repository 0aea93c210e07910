"""Migrations keep the rows that exist: a job table from before Django Tasks migrates as is."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("ultimat3_jobs", "0001_initial")]
AFTER = [("ultimat3_jobs", "0002_django_tasks")]


@pytest.mark.django_db(transaction=True)
def test_migration_0002__keeps_every_job_as_a_plain_job_of_priority_0() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("ultimat3_jobs", "Job")
        at = datetime(2026, 6, 1, tzinfo=UTC)
        old.objects.create(
            name="demo.ping", key="k1", input={"label": "x"}, run_at=at, created_at=at
        )
        old.objects.create(
            name="demo.ping",
            key="k2",
            status="failed",
            last_error="boom",
            run_at=at,
            created_at=at,
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps.get_model("ultimat3_jobs", "Job")
    rows = list(
        new.objects.order_by("key").values_list(
            "key",
            "status",
            "priority",
            "backend",
            "args",
            "return_value",
            "error_class",
            "traceback",
            "last_error",
        )
    )
    assert rows == [
        ("k1", "queued", 0, "", None, None, "", "", ""),
        ("k2", "failed", 0, "", None, None, "", "", "boom"),
    ]
