"""Migration 0002 on a database that already holds tasks, records and jobs: every row stays."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("ultimat3_jobs", "0001_initial")]
AFTER = [("ultimat3_jobs", "0002_overlap_and_backfill")]
AT = datetime(2026, 6, 1, 3, tzinfo=UTC)


@pytest.fixture
def executor() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    yield executor
    # Leave the schema as the rest of the suite expects it.
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_0002__keeps_every_row_and_defaults_overlap_to_allow(executor: MigrationExecutor) -> None:
    old = executor.loader.project_state(BEFORE).apps
    old.get_model("ultimat3_jobs", "Task").objects.create(
        name="m.nightly", cron="0 3 * * *", tz="UTC", last_fired_at=AT
    )
    for outcome in ("fired", "dropped", "paused", "manual"):
        old.get_model("ultimat3_jobs", "Occurrence").objects.create(
            task="m.nightly", outcome=outcome, occurrence=AT, recorded_at=AT
        )
    old.get_model("ultimat3_jobs", "Job").objects.create(
        name="m.job", key="m.nightly:1:k", run_at=AT, created_at=AT, task="m.nightly"
    )

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)

    new = executor.loader.project_state(AFTER).apps
    task = new.get_model("ultimat3_jobs", "Task").objects.get()
    assert (task.name, task.last_fired_at, task.overlap) == ("m.nightly", AT, "allow")
    outcomes = new.get_model("ultimat3_jobs", "Occurrence").objects.values_list(
        "outcome", flat=True
    )
    assert sorted(outcomes) == ["dropped", "fired", "manual", "paused"]
    assert new.get_model("ultimat3_jobs", "Job").objects.get().key == "m.nightly:1:k"
    field = new.get_model("ultimat3_jobs", "Occurrence")._meta.get_field("outcome")
    assert {"overlap", "backfill"} <= {value for value, _ in field.choices}
