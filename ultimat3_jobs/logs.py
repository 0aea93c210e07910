"""Structured log events: ``emit(logger, "jobs.scheduler.dispatched", task=..., ...)``.

Every record carries its event name and fields in ``record.event`` / ``record.fields``, so the
text and JSON formatters below (chosen by ``--log-format``) print the same facts.
"""

from __future__ import annotations

import json
import json.encoder
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime
from typing import Any

from .db import Ahead, prepared_statement_lost
from .errors import UltimateError, class_path, readable


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
    Lines(logger, event, rows, level).write()


class Lines:
    """``emit_many`` in two steps: the lines made now, ``ahead`` in a thread of their own
    (``db.Ahead``) while the caller waits on the database, and written by ``write()`` with
    the time of writing. Lines for a handler other than ``configure``'s are made at write().
    """

    def __init__(
        self,
        logger: logging.Logger,
        event: str,
        rows: Iterable[dict[str, Any]],
        level: int = logging.INFO,
        *,
        ahead: bool = False,
    ) -> None:
        self.logger, self.event, self.rows, self.level = logger, event, rows, level
        self.enabled = logger.isEnabledFor(level)
        self.handler = _sole_handler(logger, level) if self.enabled else None
        #: Each line but its head (``_StdoutHandler.tails``), made as it is read.
        self.tails: Iterable[str | dict[str, Any]] | None = None
        self._ahead: Ahead[Any] | None = None
        if self.handler is not None:
            self.tails = self.handler.tails(rows)
            if ahead:
                self.made_by(Ahead(self.tails), 0)

    def made_by(self, ahead: Ahead[Any], index: int) -> None:
        """Read ``tails`` from source ``index`` of ``ahead``, which makes them; it is closed
        once they are written."""
        self._ahead = ahead
        if self.tails is not None:
            self.tails = ahead.rows(index)

    def write(self) -> None:
        try:
            if self.handler is not None and self.tails is not None:
                self.handler.write_tails(logging.getLevelName(self.level), self.event, self.tails)
            elif self.enabled:
                for fields in self.rows:
                    record = self.logger.makeRecord(
                        self.logger.name, self.level, "(unknown file)", 0, self.event, (), None,
                        extra={"event": self.event, "fields": fields},
                    )  # fmt: skip
                    self.logger.handle(record)
        finally:
            self.close()

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()


#: Fixes for the failures that come from the environment rather than from a declaration.
#: The loops retry; ``run_scheduler --once`` ends with its command's error and must be run again.
RETRIED = "a running loop backs off and retries by itself (run_scheduler --once: run it again)"
DATABASE_UNAVAILABLE_FIX = (
    f"check that the database in DATABASES / DATABASE_URL is running and reachable from this "
    f"host; {RETRIED}"
)
NOT_MIGRATED_FIX = "run: python manage.py migrate"
#: What to do about a cancelled statement; a loop retries it by itself, a command does not.
TIMEOUT_FIX = (
    "a statement ran past the database's statement_timeout or lock_timeout (or was cancelled "
    "by pg_cancel_backend): raise those for this role (ALTER ROLE ... SET, or the options of "
    "DATABASES / DATABASE_URL), or find what holds its locks in pg_stat_activity"
)
DATABASE_TIMEOUT_FIX = f"{TIMEOUT_FIX}; {RETRIED}"
SQLITE_LOCKED_FIX = (
    "another connection held SQLite's write lock past the busy timeout (a long transaction, "
    'a shell\'s BEGIN): end it, or raise "timeout" in the OPTIONS of DATABASES (seconds); '
    f"{RETRIED}; for many writers, use PostgreSQL"
)
PREPARED_STATEMENT_LOST_FIX = (
    "a transaction-pooling PgBouncer older than 1.21 (or one with max_prepared_statements = 0) "
    "cannot keep prepared statements: remove prepare_threshold from the OPTIONS of DATABASES "
    "(or DATABASE_URL), or upgrade PgBouncer and set max_prepared_statements; meanwhile the "
    "process that hit this prepares nothing more"
)


#: The most characters of an error's message a log line carries (the job row keeps its
#: traceback's last ``retries.ERROR_LIMIT``).
MESSAGE_LIMIT = 4_000


def failure_fields(error: BaseException) -> dict[str, Any]:
    """A failure as log fields. The message alone drops the code to search on and the fix."""
    if isinstance(error, UltimateError):
        return error.as_fields()
    import psycopg
    from django.db import InterfaceError, OperationalError, ProgrammingError

    text = readable(error)
    message = f"{type(error).__name__}: {text}".strip()
    if len(message) > MESSAGE_LIMIT:
        # An exception may carry megabytes: a log line of them is dropped or split downstream.
        message = f"{message[:MESSAGE_LIMIT]}... ({len(message):,} characters)"
    cause = class_path(type(error))
    text = text.lower()
    unavailable = (
        OperationalError,
        InterfaceError,
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
    sqlstate = _sqlstate(error)
    if prepared_statement_lost(error):
        code, fix = "jobs.prepared-statement-lost", PREPARED_STATEMENT_LOST_FIX
    elif isinstance(error, ProgrammingError | OperationalError | psycopg.Error) and (
        sqlstate in _MISSING_SCHEMA or (sqlstate is None and _names_missing_schema(text))
    ):
        code, fix = "jobs.database-not-migrated", NOT_MIGRATED_FIX
    elif sqlstate in _CANCELLED:
        code, fix = "jobs.database-timeout", DATABASE_TIMEOUT_FIX
    elif sqlstate is None and isinstance(error, OperationalError) and _sqlite_locked(text):
        code, fix = "jobs.database-timeout", SQLITE_LOCKED_FIX
    elif isinstance(error, unavailable):
        code, fix = "jobs.database-unavailable", DATABASE_UNAVAILABLE_FIX
    else:
        code = "jobs.unexpected-error"
        fix = "this is not a known failure: report it with the traceback (run with -v 2)"
    return {"error": message, "code": code, "cause": cause, "fix": fix}


#: PostgreSQL's undefined_table and undefined_column: a table or column of the app is missing.
#: "does not exist" alone is no sign: a database or a role that does not exist says it too.
_MISSING_SCHEMA = frozenset({"42P01", "42703"})
#: query_canceled (``statement_timeout``, ``pg_cancel_backend``) and lock_not_available
#: (``lock_timeout``): the server is there and refused to go on.
_CANCELLED = frozenset({"57014", "55P03"})


def _sqlite_locked(text: str) -> bool:
    """SQLite's own words for a write lock another connection held past the busy timeout."""
    return "database is locked" in text or "database table is locked" in text


def _sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of ``error`` or of the driver's error Django wrapped in it; ``None`` for
    SQLite, and for a connection that failed before the server answered."""
    for found in (error, error.__cause__):
        for name in ("sqlstate", "pgcode"):  # psycopg's, psycopg2's
            sqlstate = getattr(found, name, None)
            if isinstance(sqlstate, str):
                return sqlstate
    return None


def _names_missing_schema(text: str) -> bool:
    """A missing table or column by the words of an error that has no SQLSTATE (SQLite's)."""
    if "no such table" in text or "no such column" in text or "has no column named" in text:
        return True
    return "does not exist" in text and ('relation "' in text or 'column "' in text)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


#: Lines per write of a batch: few writes, and never a round's worth of text held at once.
BATCH_LINES = 1000

#: Lines whose own parts ``_StdoutHandler.tails`` joins into one text.
TAILS_JOINED = 100

#: Keys every JSON line starts with; a field of the same name takes their place.
RESERVED = frozenset({"ts", "level", "event"})

#: One encoder for every line: ``json.dumps(default=...)`` would build a new one per call.
_ENCODE = json.JSONEncoder(default=_jsonable).encode
#: The string encoder ``_ENCODE`` uses (``ensure_ascii``), in C.
_QUOTE = json.encoder.encode_basestring_ascii


def _encode_value(value: Any) -> str:
    """``_ENCODE(value)``, byte for byte, quicker for the values of a per-occurrence line.

    Text, integers, booleans, None and lists of text are written here; anything else goes to
    ``_ENCODE``, which sets itself up again at every call: that was most of the cost of 10,000
    short lines.
    """
    kind = type(value)
    if kind is str:
        return _QUOTE(value)
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    if kind is list and all(type(item) is str for item in value):
        return "[" + ", ".join(map(_QUOTE, value)) + "]"
    return _ENCODE(value)


def _encode_fields(fields: dict[str, Any]) -> str:
    """``_ENCODE(fields)``, byte for byte, for the fields of a per-occurrence line."""
    parts = []
    for key, value in fields.items():
        if type(key) is not str:
            return _ENCODE(fields)
        parts.append(f"{_QUOTE(key)}: {_encode_value(value)}")
    return "{" + ", ".join(parts) + "}"


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
        parts += [f"{key}={_encode_value(value)}" for key, value in fields.items()]
        return " ".join(parts)


class _StdoutHandler(logging.StreamHandler):
    """The handler ``configure`` installs; it can write a batch of lines at once."""

    formatter: JsonFormatter | TextFormatter

    def tails(self, rows: Iterable[dict[str, Any]]) -> Iterator[str | dict[str, Any]]:
        """Each line's own part, its fields encoded: all of a line but its ts, level and
        event. The parts of up to ``TAILS_JOINED`` lines come as one text, joined by newlines,
        which no part holds (values are written as JSON): less memory, for lines made ahead,
        than a text each (README, "Figures"). Fields that take the place of those stay a dict,
        for a line of their own, as do fields whose part would hold a newline."""
        json_lines = isinstance(self.formatter, JsonFormatter)
        run: list[str] = []
        for fields in rows:
            part = self._part(fields, json_lines)
            if part is not None:
                run.append(part)
                if len(run) < TAILS_JOINED:
                    continue
            if run:
                yield "\n".join(run)
                run = []
            if part is None:
                yield fields
        if run:
            yield "\n".join(run)

    @staticmethod
    def _part(fields: dict[str, Any], json_lines: bool) -> str | None:
        """A line's own part, or None for a line ``tails`` leaves to stand alone."""
        if not fields or RESERVED.intersection(fields):
            return None
        if json_lines:
            part = _encode_fields(fields)[1:]
        else:
            part = "".join(f" {k}={_encode_value(v)}" for k, v in fields.items())
        return None if "\n" in part else part

    def write_tails(self, level: str, event: str, tails: Iterable[str | dict[str, Any]]) -> None:
        # The lines of a batch are written at one instant and share their ts, level and event:
        # that part is formatted once, and each line only adds its own fields.
        line = self.formatter.line
        head = line(time.time(), level, event, {})
        if isinstance(self.formatter, JsonFormatter):
            head = head[:-1] + ", "
        parts: list[str] = []
        lines = 0
        for tail in tails:
            if isinstance(tail, str):
                # The parts of several lines, each given the head.
                parts.append(head + tail.replace("\n", "\n" + head))
                lines += tail.count("\n") + 1
            else:
                parts.append(line(time.time(), level, event, tail))
                lines += 1
            if lines >= BATCH_LINES:
                self._write(parts)
                lines = 0
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
