"""Failures as log fields: every one carries an error, a code, a cause and a fix."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, ProgrammingError
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from ultimat3_jobs.errors import InvalidTimezoneError
from ultimat3_jobs.logs import (
    MESSAGE_LIMIT,
    JsonFormatter,
    Lines,
    configure,
    emit,
    emit_many,
    failure_fields,
)

#: What PostgreSQL says when a pooler gave the transaction a backend without the statement.
_LOST = 'prepared statement "_pg3_0" does not exist'


def _raised_by_django(error: psycopg.Error) -> ProgrammingError:
    """``error`` as Django's ``wrap_database_errors`` raises it: its own class, from it."""
    try:
        raise ProgrammingError(*error.args) from error
    except ProgrammingError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("error", "code", "fix_part"),
    [
        pytest.param(
            InvalidTimezoneError("bad tz", fix="use America/Bogota", cause="Bogota"),
            "jobs.task.tz-invalid",
            "America/Bogota",
            id="ultimate_error",
        ),
        pytest.param(
            OperationalError("connection refused"),
            "jobs.database-unavailable",
            "reachable",
            id="database_down",
        ),
        pytest.param(
            ProgrammingError('relation "ultimat3_jobs_task" does not exist'),
            "jobs.database-not-migrated",
            "manage.py migrate",
            id="not_migrated",
        ),
        pytest.param(
            _raised_by_django(psycopg.errors.UndefinedColumn('column "priority" does not exist')),
            "jobs.database-not-migrated",
            "manage.py migrate",
            id="not_migrated_column",
        ),
        pytest.param(
            OperationalError('connection failed: FATAL:  database "shop" does not exist'),
            "jobs.database-unavailable",
            "reachable",
            id="no_such_database",
        ),
        pytest.param(
            OperationalError("no such table: ultimat3_jobs_job"),
            "jobs.database-not-migrated",
            "manage.py migrate",
            id="not_migrated_sqlite",
        ),
        pytest.param(
            # An INSERT into a table older than the code (a migration not run), in SQLite's words.
            OperationalError("table ultimat3_jobs_task has no column named backfilled_to"),
            "jobs.database-not-migrated",
            "manage.py migrate",
            id="not_migrated_sqlite_insert",
        ),
        pytest.param(
            OperationalError("database is locked"),
            "jobs.database-timeout",
            "SQLite's write lock",
            id="sqlite_locked",
        ),
        pytest.param(
            _raised_by_django(psycopg.errors.QueryCanceled("canceling statement due to timeout")),
            "jobs.database-timeout",
            "statement_timeout",
            id="statement_timeout",
        ),
        pytest.param(
            _raised_by_django(psycopg.errors.InvalidSqlStatementName(_LOST)),
            "jobs.prepared-statement-lost",
            "remove prepare_threshold",
            id="prepared_statement_gone",
        ),
        pytest.param(
            psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists'),
            "jobs.prepared-statement-lost",
            "max_prepared_statements",
            id="prepared_statement_another_clients",
        ),
        pytest.param(ValueError("odd"), "jobs.unexpected-error", "traceback", id="unexpected"),
    ],
)
def test_failure_fields__carry_error_code_cause_and_fix(
    error: Exception, code: str, fix_part: str
) -> None:
    fields = failure_fields(error)
    assert set(fields) == {"error", "code", "cause", "fix"}
    assert fields["code"] == code
    assert fix_part in fields["fix"]


def test_failure_fields__a_message_of_megabytes_is_cut_for_the_log_line() -> None:
    fields = failure_fields(ValueError("y" * 5_000_000))
    assert fields["error"].startswith("ValueError: yyy")
    assert fields["error"].endswith("... (5,000,012 characters)")
    assert len(fields["error"]) < MESSAGE_LIMIT + 40


def test_json_formatter__one_object_with_event_and_fields(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("ultimat3_jobs.test")
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.test"):
        emit(logger, "jobs.scheduler.dispatched", task="t", jobs=["a"], catch_up=False)
    [record] = caplog.records
    line = JsonFormatter().format(record)
    assert "\n" not in line
    payload = json.loads(line)
    assert payload["event"] == "jobs.scheduler.dispatched"
    assert (payload["task"], payload["jobs"], payload["catch_up"]) == ("t", ["a"], False)


@pytest.fixture
def configured() -> Iterator[Callable[[str], io.StringIO]]:
    """``logs.configure`` writing to a buffer; the app's logger is put back afterwards."""
    root = logging.getLogger("ultimat3_jobs")
    saved = (root.handlers[:], root.level, root.propagate)

    def configure_into(fmt: str) -> io.StringIO:
        configure(fmt)
        buffer = io.StringIO()
        [handler] = root.handlers
        handler.setStream(buffer)  # type: ignore[attr-defined]
        return buffer

    yield configure_into
    root.handlers[:], root.level, root.propagate = saved


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_emit_many__writes_the_lines_emit_would(
    fmt: str, configured: Callable[[str], io.StringIO]
) -> None:
    buffer = configured(fmt)
    logger = logging.getLogger("ultimat3_jobs.scheduler")
    occurrence = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    rows: list[dict[str, Any]] = [
        {"task": "t.a", "occurrence": occurrence, "jobs": ["a"], "catch_up": False},
        {},
        {"ts": "a field named like a key of the line", "n": 1},
        {"task": "t.b", "detail": "two\nlines"},
        {"task": "t.c"},
    ]
    for fields in rows:
        emit(logger, "jobs.scheduler.dispatched", **fields)
    emit_many(logger, "jobs.scheduler.dispatched", rows)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2 * len(rows)
    if fmt == "json":
        payloads = [json.loads(line) for line in lines]
        one, batch = payloads[: len(rows)], payloads[len(rows) :]
        for payload in payloads:
            if payload["ts"] != rows[2]["ts"]:
                payload.pop("ts")
        assert batch == one
        assert batch[0]["occurrence"] == "2026-03-08T07:00:00+00:00"
    else:
        assert [line.split(" ", 1)[1] for line in lines[len(rows) :]] == [
            line.split(" ", 1)[1] for line in lines[: len(rows)]
        ]


def test_emit_many__goes_through_other_handlers_as_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("ultimat3_jobs.test")
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.test"):
        emit_many(logger, "jobs.scheduler.dispatched", [{"task": "t.a"}, {"task": "t.b"}])
        emit_many(logger, "jobs.scheduler.armed", [{"task": "t.c"}], level=logging.DEBUG)
    assert [(r.event, r.fields) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("jobs.scheduler.dispatched", {"task": "t.a"}),
        ("jobs.scheduler.dispatched", {"task": "t.b"}),
    ]


def test_emit_many__a_silenced_per_task_logger_keeps_the_round_summary(
    configured: Callable[[str], io.StringIO],
) -> None:
    buffer = configured("json")
    per_task = logging.getLogger("ultimat3_jobs.scheduler.occurrences")
    per_task.setLevel(logging.WARNING)  # what the README's LOGGING example does
    try:
        emit_many(per_task, "jobs.scheduler.dispatched", [{"task": "t.a"}, {"task": "t.b"}])
        emit(logging.getLogger("ultimat3_jobs.scheduler"), "jobs.scheduler.round", fired=2)
    finally:
        per_task.setLevel(logging.NOTSET)
    events = [json.loads(line)["event"] for line in buffer.getvalue().splitlines()]
    assert events == ["jobs.scheduler.round"]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_lines__made_ahead_are_the_lines_emit_many_writes(
    fmt: str, configured: Callable[[str], io.StringIO]
) -> None:
    buffer = configured(fmt)
    logger = logging.getLogger("ultimat3_jobs.scheduler.occurrences")
    rows: list[dict[str, Any]] = [
        {"task": f"t.{n}", "occurrence": "2026-03-08T07:00:00+00:00", "jobs": ["a"]}
        for n in range(1200)  # More than a batch, and more than a chunk made ahead.
    ] + [{}, {"level": "a field named like a key of the line"}]
    rows.insert(150, {"event": "a line of its own amid lines joined"})
    emit_many(logger, "jobs.scheduler.dispatched", rows)
    lines = Lines(logger, "jobs.scheduler.dispatched", iter(rows), ahead=True)
    assert lines._ahead is not None
    lines.write()
    written = buffer.getvalue().splitlines()
    assert len(written) == 2 * len(rows)
    without_ts = [
        json.dumps({k: v for k, v in json.loads(line).items() if k != "ts"})
        if fmt == "json"
        else line.split(" ", 1)[1]
        for line in written
    ]
    assert without_ts[len(rows) :] == without_ts[: len(rows)]
    assert not lines._ahead._thread.is_alive()


def test_lines__through_another_handler_are_records_made_at_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("ultimat3_jobs.scheduler.occurrences")
    rows = [{"task": "t.a", "jobs": ["a"]}, {"task": "t.b", "jobs": []}]
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs"):
        lines = Lines(logger, "jobs.scheduler.dispatched", rows, ahead=True)
        assert lines.tails is None  # caplog's handler is there too: no batch.
        assert caplog.records == []
        lines.write()
    assert [r.fields for r in caplog.records] == rows  # type: ignore[attr-defined]


_TEXT = st.text(max_size=12)
_LEAF = st.none() | st.booleans() | st.integers() | _TEXT | st.lists(_TEXT, max_size=3)


@examples(max_examples=400)
@given(st.dictionaries(_TEXT, _LEAF | st.floats() | st.lists(st.integers(), max_size=2)))
def test_encode_fields__writes_what_the_json_encoder_writes(fields: dict[str, Any]) -> None:
    from ultimat3_jobs.logs import _ENCODE, _encode_fields

    assert _encode_fields(fields) == _ENCODE(fields)


@examples(max_examples=400)
@given(_LEAF | st.floats() | st.lists(st.integers(), max_size=2) | st.datetimes())
def test_encode_value__writes_what_the_json_encoder_writes(value: Any) -> None:
    # Each value of a text line, and of a JSON line's fields, goes through it.
    from ultimat3_jobs.logs import _ENCODE, _encode_value

    assert _encode_value(value) == _ENCODE(value)
