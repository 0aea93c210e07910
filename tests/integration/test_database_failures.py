"""A database failure names what went wrong, by what the server said, not by its wording: a
database that does not exist is unreachable, not unmigrated, and a cancelled statement is
neither."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.db.utils import ConnectionHandler

from ultimat3_jobs.logs import failure_fields

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _params() -> dict[str, Any]:
    """The test database's connection, for psycopg alone."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    return params


def _code_of(sql: str, *setup: str) -> str:
    with (
        pytest.raises(DatabaseError) as raised,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        for statement in setup:
            cursor.execute(statement)
        cursor.execute(sql)
    return str(failure_fields(raised.value)["code"])


@pytest.fixture
def other_database() -> Iterator[ConnectionHandler]:
    """A connection handler whose default alias names a database, then a role, that the server
    does not have; the test sets which."""
    handler = ConnectionHandler({"default": dict(connection.settings_dict)})
    yield handler
    handler.close_all()


@pytest.mark.parametrize("what", ["NAME", "USER"])
def test_failure_fields__a_database_or_role_that_does_not_exist_is_unavailable_not_unmigrated(
    other_database: ConnectionHandler, what: str
) -> None:
    other_database.settings["default"][what] = "ultimat3_no_such_thing"
    with pytest.raises(DatabaseError) as raised:
        other_database["default"].ensure_connection()
    assert "does not exist" in str(raised.value)  # what the old test matched on

    fields = failure_fields(raised.value)

    assert fields["code"] == "jobs.database-unavailable"


@pytest.mark.parametrize(
    "sql",
    ["SELECT * FROM ultimat3_jobs_no_such_table", "SELECT no_such_column FROM ultimat3_jobs_job"],
    ids=["table", "column"],
)
def test_failure_fields__a_missing_table_or_column_is_not_migrated(sql: str) -> None:
    assert _code_of(sql) == "jobs.database-not-migrated"


def test_failure_fields__a_statement_past_statement_timeout_is_a_timeout() -> None:
    code = _code_of("SELECT pg_sleep(2)", "SET LOCAL statement_timeout = 20")
    assert code == "jobs.database-timeout"


def test_failure_fields__a_lock_waited_for_past_lock_timeout_is_a_timeout() -> None:
    holder = psycopg.connect(**_params())
    try:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE ultimat3_jobs_task IN ACCESS EXCLUSIVE MODE")
        code = _code_of("SELECT count(*) FROM ultimat3_jobs_task", "SET LOCAL lock_timeout = 20")
    finally:
        holder.close()
    assert code == "jobs.database-timeout"


def test_failure_fields__a_statement_cancelled_by_an_operator_is_a_timeout_with_its_fix() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()

    def cancel() -> None:
        with psycopg.connect(**_params(), autocommit=True) as other:
            other.execute("SELECT pg_cancel_backend(%s)", [pid])

    canceller = threading.Timer(0.3, cancel)
    canceller.start()
    try:
        with pytest.raises(DatabaseError) as raised, connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(10)")
    finally:
        canceller.join()

    fields = failure_fields(raised.value)

    assert fields["code"] == "jobs.database-timeout"
    assert "pg_cancel_backend" in fields["fix"]
    assert "statement_timeout" in fields["fix"]


def test_a_one_shot_command_stopped_by_a_statement_timeout_says_to_run_it_again() -> None:
    from django.core.management import CommandError

    from ultimat3_jobs.management.preflight import database_error

    with pytest.raises(DatabaseError) as raised, connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 20")
        try:
            cursor.execute("SELECT pg_sleep(2)")
        finally:
            cursor.execute("RESET statement_timeout")

    error = database_error("default", raised.value)

    assert isinstance(error, CommandError)
    assert "[jobs.database-timeout]" in str(error)
    assert str(error).endswith("then run the command again")
    assert "retries" not in str(error)
