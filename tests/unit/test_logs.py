"""Failures as log fields: every one carries an error, a code, a cause and a fix."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import OperationalError, ProgrammingError

from ultimat3_jobs.errors import InvalidTimezoneError
from ultimat3_jobs.logs import JsonFormatter, emit, failure_fields


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
