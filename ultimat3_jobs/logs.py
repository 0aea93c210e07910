"""Structured log events: ``emit(logger, "jobs.scheduler.dispatched", task=..., ...)``.

Every record carries its event name and fields in ``record.event`` / ``record.fields``, so the
text and JSON formatters below (chosen by ``--log-format``) print the same facts.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, date, datetime
from typing import Any

from .errors import UltimateError, readable


def emit(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``event`` with ``fields`` attached for the formatters."""
    logger.log(level, event, extra={"event": event, "fields": fields})


#: Fixes for the failures that come from the environment rather than from a declaration.
DATABASE_UNAVAILABLE_FIX = (
    "check that the database in DATABASES / DATABASE_URL is running and reachable from this "
    "host; the loop backs off and retries by itself"
)
NOT_MIGRATED_FIX = "run: python manage.py migrate"


def failure_fields(error: BaseException) -> dict[str, Any]:
    """A failure as log fields. The message alone drops the code to search on and the fix."""
    if isinstance(error, UltimateError):
        return error.as_fields()
    import psycopg
    from django.db import InterfaceError, OperationalError, ProgrammingError

    text = readable(error)
    message = f"{type(error).__name__}: {text}".strip()
    cause = f"{type(error).__module__}.{type(error).__qualname__}"
    text = text.lower()
    unavailable = (
        OperationalError,
        InterfaceError,
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
    if isinstance(error, ProgrammingError | OperationalError) and (
        "does not exist" in text or "no such table" in text
    ):
        code, fix = "jobs.database-not-migrated", NOT_MIGRATED_FIX
    elif isinstance(error, unavailable):
        code, fix = "jobs.database-unavailable", DATABASE_UNAVAILABLE_FIX
    else:
        code = "jobs.unexpected-error"
        fix = "this is not a known failure: report it with the traceback (run with -v 2)"
    return {"error": message, "code": code, "cause": cause, "fix": fix}


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with ``event``, ``level`` and ``ts`` keys."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", record.getMessage()),
        }
        payload.update(getattr(record, "fields", {}))
        if record.exc_info and "traceback" not in payload:
            payload["traceback"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=_jsonable)


class TextFormatter(logging.Formatter):
    """``2026-03-08T07:00:00+00:00 INFO jobs.scheduler.dispatched task=... jobs=1``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        parts = [
            datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            record.levelname,
            getattr(record, "event", record.getMessage()),
        ]
        parts += [f"{key}={json.dumps(value, default=_jsonable)}" for key, value in fields.items()]
        text = " ".join(parts)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(fmt: str, level: int = logging.INFO) -> None:
    """Print the app's logs to stdout in ``fmt`` ("text" or "json"), replacing other handlers.

    Standard output, one event per line, is what process managers and log shippers collect;
    stderr keeps what Django itself reports (system checks, command errors).
    """
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("ultimat3_jobs")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
