"""Node heartbeats: one writer for every role, on the database clock."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.db import database_now
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job, Node
from ultimat3_jobs.nodes import Heartbeat
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.worker import Worker

from .factories import make_tasks


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


def _beat(heartbeat: Heartbeat, **fields: object) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        heartbeat.beat(**fields)
    return [query["sql"].split()[0].upper() for query in queries]


@pytest.mark.django_db(transaction=True)
def test_heartbeat__a_process_writes_its_first_in_one_insert_and_the_next_in_one_update() -> None:
    heartbeat = Heartbeat(using="default", node_id="n1", role="worker", every=timedelta(0))
    assert _beat(heartbeat, last_error="") == ["INSERT"]
    first = Node.objects.get(node_id="n1")
    assert (first.role, first.pid, first.stopped_at) == ("worker", os.getpid(), None)
    assert first.started_at == heartbeat.started_at
    assert _beat(heartbeat, last_error="boom") == ["UPDATE"]
    again = Node.objects.get(node_id="n1")
    assert again.last_error == "boom"
    assert again.last_seen_at >= first.last_seen_at


@pytest.mark.django_db(transaction=True)
def test_heartbeat__a_first_one_over_a_row_of_its_id_brings_it_up_to_date() -> None:
    # An id used again: a first INSERT whose reply was lost, or a node id fixed by its caller.
    old = datetime(2020, 1, 1, tzinfo=UTC)
    Node.objects.create(
        node_id="n2", role="worker", host="h", pid=1, started_at=old, last_seen_at=old,
        last_error="old", stopped_at=old,
    )  # fmt: skip
    heartbeat = Heartbeat(using="default", node_id="n2", role="worker", every=timedelta(0))
    assert _beat(heartbeat, last_error="") == ["INSERT", "UPDATE"]
    row = Node.objects.get(node_id="n2")
    assert (row.stopped_at, row.last_error) == (None, "")
    assert row.last_seen_at > old


@pytest.mark.django_db
def test_heartbeat__a_first_one_inside_a_callers_transaction_leaves_it_usable() -> None:
    old = datetime(2020, 1, 1, tzinfo=UTC)
    Node.objects.create(
        node_id="n3", role="relay", host="h", pid=1, started_at=old, last_seen_at=old
    )
    heartbeat = Heartbeat(using="default", node_id="n3", role="relay", every=timedelta(0))
    assert connection.in_atomic_block
    assert _beat(heartbeat) == ["UPDATE"]
    assert Node.objects.get(node_id="n3").last_seen_at > old  # the transaction goes on


@pytest.mark.django_db
def test_heartbeat__a_row_deleted_meanwhile_is_written_again() -> None:
    heartbeat = Heartbeat(using="default", node_id="n4", role="relay", every=timedelta(0))
    heartbeat.beat()
    Node.objects.filter(node_id="n4").delete()  # the admin's delete action
    assert _beat(heartbeat) == ["UPDATE", "INSERT"]
    assert Node.objects.get(node_id="n4").role == "relay"


@pytest.mark.django_db(transaction=True)
def test_heartbeat__a_once_run_writes_its_row_at_the_stop_in_one_insert_with_its_round() -> None:
    state = DatabaseState(node_id="once", leader="advisory", once=True)
    round_at = datetime.now(UTC)
    with CaptureQueriesContext(connection) as queries:
        state.heartbeat(is_leader=True, round_at=round_at, error="")
    assert not [q for q in queries if "ultimat3_jobs_node" in q["sql"]]
    assert not Node.objects.filter(node_id="once").exists()
    with CaptureQueriesContext(connection) as queries:
        state.stopped()
    assert [q["sql"].split()[0].upper() for q in queries] == ["INSERT"]
    row = Node.objects.get(node_id="once")
    assert (row.role, row.leader, row.is_leader, row.last_round_at) == (
        "scheduler", "advisory", False, round_at,
    )  # fmt: skip
    assert row.stopped_at is not None and row.clock_skew_ms is not None


@pytest.mark.django_db(transaction=True)
def test_heartbeat__a_stop_of_a_node_whose_row_was_written_is_one_update() -> None:
    heartbeat = Heartbeat(using="default", node_id="n5", role="worker", every=timedelta(0))
    heartbeat.beat(last_error="")
    with CaptureQueriesContext(connection) as queries:
        heartbeat.stopped()
    assert [q["sql"].split()[0].upper() for q in queries] == ["UPDATE"]
    assert Node.objects.get(node_id="n5").stopped_at is not None


@pytest.mark.django_db(transaction=True)
def test_heartbeat__a_once_run_whose_round_never_ended_writes_no_row() -> None:
    DatabaseState(node_id="once-failed", leader="advisory", once=True).stopped()
    assert not Node.objects.filter(node_id="once-failed").exists()


def _last_error(node_id: str, wanted: Callable[[str], bool], within: float = 5.0) -> str:
    """The node's ``last_error`` once ``wanted`` holds of it, else as it was at the deadline."""
    deadline = time.monotonic() + within
    while True:
        row = Node.objects.filter(node_id=node_id).values_list("last_error", flat=True).first()
        if (row is not None and wanted(row)) or time.monotonic() > deadline:
            return row or ""
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a trigger of PostgreSQL's")
def test_heartbeat__a_scheduler_whose_every_round_fails_says_why_on_its_row() -> None:
    # Every round's COPY refused by the database: the loop went on failing with nothing on the
    # node's row but the heartbeat of its last good round, as if silent.
    clock = FrozenClock(datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC))
    tasks = make_tasks(1, prefix="failing")
    state = DatabaseState(node_id="failing-node", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks,
        tick_interval=timedelta(seconds=0.05), drain_on_shutdown=False,
    )  # fmt: skip
    scheduler.tick()  # Armed: the row says a round and no error.
    assert Node.objects.get(node_id="failing-node").last_error == ""
    with connection.cursor() as cursor:
        cursor.execute(_REFUSING_TRIGGER)
    try:
        clock.set(datetime(2026, 6, 1, 0, 1, 0, 100_000, tzinfo=UTC))  # Its occurrence is due.
        scheduler.start()
        try:
            failing = _last_error("failing-node", lambda error: "refused by a trigger" in error)
            assert "refused by a trigger" in failing
            assert Job.objects.count() == 0
            with connection.cursor() as cursor:
                cursor.execute("DROP TRIGGER u3j_test_refuse ON ultimat3_jobs_job")
            # Once its rounds go through, the held occurrence fires.
            deadline = time.monotonic() + 15  # A rest doubled by each failure.
            while not Job.objects.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert Job.objects.count() == 1
        finally:
            scheduler.stop("test")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS u3j_test_refuse ON ultimat3_jobs_job")
            cursor.execute("DROP FUNCTION IF EXISTS u3j_test_refuse()")


_REFUSING_TRIGGER = """
CREATE FUNCTION u3j_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$;
CREATE TRIGGER u3j_test_refuse BEFORE INSERT ON ultimat3_jobs_job
FOR EACH ROW EXECUTE FUNCTION u3j_test_refuse();
"""
