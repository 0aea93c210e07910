"""Node heartbeats: one writer for every role, on the database clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.db import database_now
from ultimat3_jobs.models import Node
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.worker import Worker


@pytest.mark.django_db
def test_heartbeat__a_scheduler_with_a_skewed_clock_is_seen_at_database_time() -> None:
    skewed = FrozenClock(datetime.now(UTC) - timedelta(hours=3))
    state = DatabaseState(node_id="late-node", leader="sole", clock=skewed)
    before = database_now()
    state.heartbeat(is_leader=True, round_at=skewed(), error="")
    row = Node.objects.get(node_id="late-node")
    assert row.last_seen_at >= before - timedelta(seconds=1)
    assert row.last_round_at == skewed()  # the round keeps the instant it was planned at


@pytest.mark.django_db
def test_heartbeat__workers_and_schedulers_write_the_same_row_shape() -> None:
    DatabaseState(node_id="s1", leader="lease").heartbeat(is_leader=False, round_at=None, error="")
    Worker(node_id="w1", drain_on_shutdown=False).heartbeat()
    rows = {row.node_id: row for row in Node.objects.filter(node_id__in=["s1", "w1"])}
    assert (rows["s1"].role, rows["w1"].role) == ("scheduler", "worker")
    assert all(row.stopped_at is None and row.pid > 0 and row.host for row in rows.values())
