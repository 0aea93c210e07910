"""``RoundAdvisoryLeader``: the advisory lock of a one-round process, on the round's own
connection; and the migrated-database check every command makes first (``missing_tables``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from ultimat3_jobs.conf import get_settings
from ultimat3_jobs.db import dedicated_connection
from ultimat3_jobs.leaders import AdvisoryLeader, RoundAdvisoryLeader, build_leader
from ultimat3_jobs.store import postgres, store_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def other() -> Iterator[psycopg.Connection[Any]]:
    """Another session, as another scheduler's leader connection would be."""
    conn = dedicated_connection("default", "test other scheduler")
    try:
        yield conn
    finally:
        conn.close()


def _try_lock(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", [get_settings().advisory_lock_key])
    found = row.fetchone()
    return bool(found and found[0])


def test_build_leader__a_one_round_process_takes_the_lock_on_its_own_connection() -> None:
    assert isinstance(build_leader("advisory", node_id="n", once=True), RoundAdvisoryLeader)
    assert isinstance(build_leader("advisory", node_id="n"), AdvisoryLeader)


def test_round_leader__holds_the_lock_through_its_round_and_gives_it_back(
    other: psycopg.Connection[Any],
) -> None:
    leader = RoundAdvisoryLeader(key=get_settings().advisory_lock_key)
    try:
        assert leader.acquire()
        assert leader.acquire()  # Asked again in the same session: still held, not taken twice.
        assert not _try_lock(other)  # Another scheduler cannot lead meanwhile.
        with transaction.atomic():
            assert leader.fence("default")
    finally:
        leader.release()
    assert _try_lock(other)  # Released once: the lock is free for the next.


def test_round_leader__does_not_lead_while_another_scheduler_holds_the_lock(
    other: psycopg.Connection[Any],
) -> None:
    assert _try_lock(other)
    leader = RoundAdvisoryLeader(key=get_settings().advisory_lock_key)
    assert not leader.acquire()
    with transaction.atomic():
        assert not leader.fence("default")
    leader.release()  # Not ours: left alone.
    assert other.execute("SELECT pg_advisory_unlock(%s)", [leader.key]).fetchone() == (True,)


def test_round_leader__a_connection_lost_after_winning_fails_the_fence(
    other: psycopg.Connection[Any],
) -> None:
    leader = RoundAdvisoryLeader(key=get_settings().advisory_lock_key)
    assert leader.acquire()
    connection.close()  # The lock goes with the session: another node may take it now.
    # The server ends the session once it reads the close, a moment after it was sent.
    deadline = time.monotonic() + 5
    taken = _try_lock(other)
    while not taken and time.monotonic() < deadline:
        time.sleep(0.02)
        taken = _try_lock(other)
    assert taken
    with transaction.atomic():  # A new session, which never took the lock.
        assert not leader.fence("default")
    assert not leader.acquire()  # The other holds it now.


def test_missing_tables__names_the_app_tables_the_database_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = store_for("default")
    assert store.missing_tables() == []
    monkeypatch.setattr(postgres, "APP_TABLES", ("ultimat3_jobs_task", "no_such_table"))
    assert store.missing_tables() == ["no_such_table"]


@pytest.mark.django_db
def test_dedicated_connection__never_prepares_a_statement() -> None:
    # A leader's or a listener's statement runs again every round: psycopg's default would
    # prepare it from its sixth run, which a transaction-pooling PgBouncer cannot keep.
    with dedicated_connection("default", "probe") as conn:
        for _ in range(8):
            conn.execute("SELECT pg_try_advisory_lock(%s)", [4343])
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchall() == [(0,)]


def test_advisory_leader__its_connection_is_named_for_its_node(
    other: psycopg.Connection[Any],
) -> None:
    leader = build_leader("advisory", node_id="host:42:abcd")
    try:
        assert leader.acquire()
        names = other.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted"
        ).fetchall()
        assert names == [("ultimat3_jobs scheduler leader host:42:abcd",)]
    finally:
        leader.release()


def test_dedicated_connection__options_of_the_project_are_kept_and_its_name_is_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The README's own advice: "OPTIONS": {"connect_timeout": 5}; it clashed with ours.
    options = {**connection.settings_dict.get("OPTIONS", {})}
    options.update(connect_timeout=7, application_name="the project's", keepalives_idle=9)
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    conn = dedicated_connection("default", "ultimat3_jobs test leader")
    try:
        assert conn.info.get_parameters()["connect_timeout"] == "7"
        assert conn.info.get_parameters()["keepalives_idle"] == "9"
        row = conn.execute("SELECT current_setting('application_name')").fetchone()
        assert row == ("ultimat3_jobs test leader",)
        assert conn.autocommit
    finally:
        conn.close()
    leader = AdvisoryLeader(node_id="n-options", key=get_settings().advisory_lock_key)
    try:
        assert leader.acquire()
    finally:
        leader.release()
