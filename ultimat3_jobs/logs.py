"""Structured log events: ``emit(logger, "jobs.scheduler.dispatched", task=..., ...)``.

Every record carries its event name and fields in ``record.event`` / ``record.fields``, so the
text and JSON formatters below (chosen by ``--log-format``) print the same facts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any

from .errors import UltimateError, readable


def emit(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``event`` with ``fields`` attached for the formatters."""
    logger.log(level, event, extra={"event": event, "fields": fields})


def emit_many(
    logger: logging.Logger, event: str, rows: Iterable[dict[str, Any]], level: int = logging.INFO
) -> None:
    """``emit(logger, event, **fields)`` for each of ``rows``: one line each, as cheap as it goes.

    For the per-occurrence lines of a big round. The level is checked once; through the
    handler ``configure`` installs the batch is formatted and written in one write, else each
    line is a record made without looking up the caller's frame.
    """
    if not logger.isEnabledFor(level):
        return
    handler = _sole_handler(logger, level)
    if handler is not None:
        handler.write_batch(logging.getLevelName(level), event, rows)
        return
    for fields in rows:
        record = logger.makeRecord(
            logger.name, level, "(unknown file)", 0, event, (), None,
            extra={"event": event, "fields": fields},
        )  # fmt: skip
        logger.handle(record)


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


#: Lines per write of a batch: few writes, and never a round's worth of text held at once.
BATCH_LINES = 1000

#: Keys every JSON line starts with; a field of the same name takes their place.
RESERVED = frozenset({"ts", "level", "event"})

#: One encoder for every line: ``json.dumps(default=...)`` would build a new one per call.
_ENCODE = json.JSONEncoder(default=_jsonable).encode


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with ``event``, ``level`` and ``ts`` keys."""

    def format(self, record: logging.LogRecord) -> str:
        extra = {}
        if record.exc_info:
            extra["traceback"] = self.formatException(record.exc_info)
        return self.line(
            record.created,
            record.levelname,
            getattr(record, "event", record.getMessage()),
            getattr(record, "fields", {}),
            extra,
        )

    def line(
        self,
        created: float,
        level: str,
        event: str,
        fields: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(created, UTC).isoformat(),
            "level": level.lower(),
            "event": event,
        }
        payload.update(fields)
        for key, value in (extra or {}).items():
            payload.setdefault(key, value)
        return _ENCODE(payload)


class TextFormatter(logging.Formatter):
    """``2026-03-08T07:00:00+00:00 INFO jobs.scheduler.dispatched task=... jobs=1``."""

    def format(self, record: logging.LogRecord) -> str:
        text = self.line(
            record.created,
            record.levelname,
            getattr(record, "event", record.getMessage()),
            getattr(record, "fields", {}),
        )
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text

    def line(self, created: float, level: str, event: str, fields: dict[str, Any]) -> str:
        parts = [datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds"), level]
        parts.append(event)
        parts += [f"{key}={_ENCODE(value)}" for key, value in fields.items()]
        return " ".join(parts)


class _StdoutHandler(logging.StreamHandler):
    """The handler ``configure`` installs; it can write a batch of lines at once."""

    formatter: JsonFormatter | TextFormatter

    def write_batch(self, level: str, event: str, rows: Iterable[dict[str, Any]]) -> None:
        # The lines of a batch are written at one instant and share their ts, level and event:
        # that part is formatted once, and each line only encodes its own fields.
        line = self.formatter.line
        head = line(time.time(), level, event, {})
        json_head = head[:-1] + ", " if isinstance(self.formatter, JsonFormatter) else None
        parts = []
        for fields in rows:
            if not fields or RESERVED.intersection(fields):
                parts.append(line(time.time(), level, event, fields))
            elif json_head is not None:
                parts.append(json_head + _ENCODE(fields)[1:])
            else:
                parts.append(head + "".join(f" {k}={_ENCODE(v)}" for k, v in fields.items()))
            if len(parts) == BATCH_LINES:
                self._write(parts)
        self._write(parts)

    def _write(self, parts: list[str]) -> None:
        if parts:
            with self.lock:  # type: ignore[union-attr]
                self.stream.write("\n".join(parts) + "\n")
                self.flush()
            parts.clear()


def _sole_handler(logger: logging.Logger, level: int) -> _StdoutHandler | None:
    """The ``configure`` handler, if it is the only place a record of ``logger`` would go."""
    found: _StdoutHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if not isinstance(handler, _StdoutHandler) or found is not None:
                return None
            if handler.filters or level < handler.level:
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def configure(fmt: str, level: int = logging.INFO) -> None:
    """Print the app's logs to stdout in ``fmt`` ("text" or "json"), replacing other handlers.

    Standard output, one event per line, is what process managers and log shippers collect;
    stderr keeps what Django itself reports (system checks, command errors).
    """
    handler = _StdoutHandler(sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("ultimat3_jobs")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
