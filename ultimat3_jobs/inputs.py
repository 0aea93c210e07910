"""What a job row can hold: the columns' limits, a job's input and key, checked before a write.

The same checks run at declaration, at enqueue and in a round, so the database never refuses a
value the app accepted. ``input_digest`` names an input in an occurrence key: it must stay
equal on every node and across releases for equal input.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from .errors import (
    InvalidDeclarationError,
    InvalidJobInputError,
    InvalidJobKeyError,
    InvalidRunAtError,
    InvalidTimeoutError,
    ResultUnstorableError,
)

if TYPE_CHECKING:
    from .handles import JobHandle


# The limits of the tables (models.py), checked at declaration and enqueue so the database never
# refuses a value the app accepted. A test holds them equal to the models' fields.
#: Task.name, Job.name, Job.task, Job.enqueued_by.
NAME_LIMIT = 200
#: Job.queue.
QUEUE_LIMIT = 100
#: Job.key.
KEY_LIMIT = 255
#: Task.cron.
CRON_LIMIT = 200
#: PositiveIntegerField (max_catch_up, max_attempts) is a 32-bit integer on PostgreSQL.
INT_LIMIT = 2**31 - 1
#: Job input nesting and size: ids and small values belong in it, never documents.
MAX_INPUT_DEPTH = 100
MAX_INPUT_BYTES = 1024 * 1024
#: A return value kept on the row (a Django Task's): held to the same nesting, and this size.
MAX_RESULT_BYTES = MAX_INPUT_BYTES


# Built once: ``json.dumps`` with any non-default option builds a new encoder per call.
_STRICT_ENCODE = json.JSONEncoder(allow_nan=False).encode
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: The longest JSON text of None, a bool or a 64-bit integer (an int, as JSON writes it).
_SCALAR_BYTES = len(str(_INT64_MIN))
_DIGEST_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def canonical_input(job_name: str, value: object) -> dict[str, Any]:
    """Check that ``value`` is a JSON-serialisable dict of keyword arguments, and return it.

    Also refused: text the database cannot store (NUL, a lone surrogate), nesting deeper than
    ``MAX_INPUT_DEPTH`` and input over ``MAX_INPUT_BYTES`` once serialised.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidJobInputError(
            f'input of job "{job_name}" is a {type(value).__name__}, '
            "not a dict of keyword arguments",
            fix=f'pass a dict with string keys, e.g. {job_name}.enqueue({{"day": "2026-03-08"}})',
            cause=value,
        )
    bound = _flat_size_bound(value)
    problem = _input_problem(value) if bound is None else _flat_text_problem(value)
    if problem is not None:
        raise InvalidJobInputError(
            f'input of job "{job_name}" {problem}',
            fix="pass ids and small values (str, int, float, bool, None, lists, dicts), "
            "not documents; strip NUL and unpaired surrogates from text",
            cause=problem,
        )
    if bound is not None and bound <= MAX_INPUT_BYTES:
        # What the round trip below gives for flat str/int/bool/None values: the same dict.
        return dict(value)
    try:
        # Round-tripped so the job gets exactly what the worker will read back.
        text = _STRICT_ENCODE(value)
        data: dict[str, Any] = json.loads(text)
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidJobInputError(
            f'input of job "{job_name}" is not JSON-serialisable: {error}',
            fix="pass only str, int, float, bool, None, lists and dicts; convert dates with "
            ".isoformat() and objects to their ids",
            cause=error,
        ) from error
    if len(text) > MAX_INPUT_BYTES:  # ASCII: json.dumps escapes everything else.
        raise InvalidJobInputError(
            f'input of job "{job_name}" is {len(text)} bytes as JSON, over the '
            f"{MAX_INPUT_BYTES} a job input may hold",
            fix="store large data elsewhere (a table, a file) and pass its id in the input",
            cause=len(text),
        )
    return data


def value_problem(value: object, limit: int) -> str | None:
    """Why no JSON column can keep ``value`` as it is, or None: not JSON (``NaN`` included),
    text PostgreSQL refuses (NUL, a lone surrogate), nesting deeper than ``MAX_INPUT_DEPTH``,
    over ``limit`` bytes as JSON."""
    scalar = value is None or (isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX)
    if scalar and limit >= _SCALAR_BYTES:
        return None  # What most tasks return, which any JSON column keeps: nothing to encode.
    problem = _input_problem(value)
    if problem is not None:
        return problem
    try:
        text = _STRICT_ENCODE(value)
    except (TypeError, ValueError, RecursionError) as error:
        return f"is not JSON: {error}"
    if len(text) > limit:  # ASCII: json.dumps escapes everything else.
        return f"is {len(text)} bytes as JSON, over the {limit} a job row keeps"
    return None


def check_arguments(job_name: str, args: object, kwargs: object) -> None:
    """A Django Task's positional and keyword arguments as a job row can hold them, else
    ``InvalidJobInputError``: the checks of a job's input, before anything is written."""
    canonical_input(job_name, kwargs)
    problem = value_problem(args, MAX_INPUT_BYTES)
    if problem is not None:
        raise InvalidJobInputError(
            f'positional arguments of task "{job_name}" {problem}',
            fix="pass ids and small values (str, int, float, bool, None, lists, dicts), "
            "not documents; strip NUL and unpaired surrogates from text",
            cause=problem,
        )


def check_result(job_name: str, value: object) -> object:
    """``value`` if a job row can keep it as a return value, else ``ResultUnstorableError``."""
    problem = value_problem(value, MAX_RESULT_BYTES)
    if problem is not None:
        raise unstorable_result(job_name, problem)
    return value


def relayed_result(job_name: str, value: object) -> object:
    """What an outbox row keeps of an engine's return value: None for what JSON has no form
    for (a relayed row keeps its JSON return value only), else ``check_result``'s answer."""
    return check_result(job_name, json_value(value))


def unstorable_result(job_name: str, problem: str) -> ResultUnstorableError:
    """The error of a return value a job row cannot keep: ``problem`` says why."""
    return ResultUnstorableError(
        f'the return value of "{job_name}" {problem}',
        fix="return ids and small JSON values (keep documents elsewhere and return their "
        "id); strip NUL and unpaired surrogates from returned text",
        cause=problem,
    )


def _flat_size_bound(value: Mapping[str, Any]) -> int | None:
    """An upper bound of the JSON size of a dict of str/bool/None/64-bit int values, else None.

    A character takes at most 12 bytes as JSON (an astral one as two escapes), so flat input
    under the limit needs no encoding to be measured.
    """
    size = 2
    for key, item in value.items():
        kind = type(item)
        if kind is str:
            size += 12 * len(item) + 2
        elif kind is int:
            if item.bit_length() > 63:
                return None
            size += 20
        elif kind is bool or item is None:
            size += 5
        else:
            return None
        size += 12 * len(key) + 6
    return size


def _flat_text_problem(value: Mapping[str, Any]) -> str | None:
    """``_input_problem`` for a dict of plain values: only its text can be unstorable."""
    for key, item in value.items():
        for text in (key, item) if type(item) is str else (key,):
            # ASCII without NUL is always storable: the common case costs two C calls.
            if "\x00" in text or not text.isascii():
                bad = _unstorable(text)
                if bad is not None:
                    return f"holds text with {bad}: {text[:40]!r}"
    return None


def _plain_flat(value: Mapping[str, Any]) -> bool:
    """Whether ``value`` holds only str/int/bool/None values, all text ASCII without DEL.

    orjson then writes, byte for byte, what ``_DIGEST_ENCODE`` writes (it differs on DEL,
    non-ASCII text, floats and integers past 64 bits): digests stay what they were.
    """
    for key, item in value.items():
        if not key.isascii() or "\x7f" in key:
            return False
        kind = type(item)
        if kind is str:
            if not item.isascii() or "\x7f" in item:
                return False
        elif kind is int:
            if item.bit_length() > 63:
                return False
        elif not (kind is bool or item is None):
            return False
    return True


def _unstorable(text: str) -> str | None:
    """Why the database would refuse ``text``, or None: PostgreSQL stores no NUL, no surrogate."""
    if "\x00" in text:
        return "a NUL character (\\x00)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "an unpaired surrogate (not valid UTF-8)"
    return None


def _input_problem(value: object) -> str | None:
    """The first thing in ``value`` no job row can hold. Iterative: deep input must not recurse."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            bad = _unstorable(item)
            if bad is not None:
                return f"holds text with {bad}: {item[:40]!r}"
        elif isinstance(item, Mapping | list | tuple):
            if depth > MAX_INPUT_DEPTH:
                return f"nests deeper than {MAX_INPUT_DEPTH} levels"
            children = (
                list(item.items()) if isinstance(item, Mapping) else [(None, v) for v in item]
            )
            for key, child in children:
                if isinstance(key, str):
                    stack.append((key, depth))
                stack.append((child, depth + 1))
    return None


def check_key(job_name: str, key: object) -> str:
    """``key`` if the job table can hold it, else ``InvalidJobKeyError`` (never hashed: a key is
    what callers dedupe on and search the admin for, so it must stay the one they gave)."""
    if not isinstance(key, str):
        raise InvalidJobKeyError(
            f'key {key!r} of job "{job_name}" is a {type(key).__name__}, not a str',
            fix=f'pass the key as text, e.g. key="{job_name}:2026-03-08"',
            cause=key,
        )
    bad = _unstorable(key)
    if bad is not None:
        raise InvalidJobKeyError(
            f'key {key[:60]!r} of job "{job_name}" holds {bad}',
            fix="build keys from ids and dates, without NUL or unpaired surrogates",
            cause=key,
        )
    if len(key) > KEY_LIMIT:
        raise InvalidJobKeyError(
            f'key of job "{job_name}" is {len(key)} characters, over the {KEY_LIMIT} the job '
            f"table holds: {key[:60]!r}...",
            fix=f"shorten the key (ids rather than names), or hash its variable part, e.g. "
            f'key=lambda i: "{job_name[:20]}:" + hashlib.sha256(...).hexdigest()',
            cause=len(key),
        )
    return key


def check_run_at(job_name: str, run_at: object) -> datetime | None:
    """``run_at`` if it is None or an aware datetime, else ``InvalidRunAtError``."""
    if run_at is None:
        return None
    if not isinstance(run_at, datetime):
        raise InvalidRunAtError(
            f'run_at={run_at!r} for job "{job_name}" is a {type(run_at).__name__}, not a datetime',
            fix="pass an aware datetime, e.g. run_at=timezone.now() + timedelta(minutes=5)",
            cause=run_at,
        )
    if run_at.utcoffset() is None:
        raise InvalidRunAtError(
            f'run_at={run_at.isoformat()} for job "{job_name}" has no timezone: it would be '
            "read in whatever zone the server runs",
            fix='pass an aware datetime: datetime(..., tzinfo=ZoneInfo("Europe/Paris")) or '
            "django.utils.timezone.now() + timedelta(...)",
            cause=run_at,
        )
    try:
        run_at.astimezone(UTC)
    except OverflowError:
        # datetime.min in a zone east of UTC: the database would keep a year BC, and the
        # worker that claims the row could not read it back.
        raise InvalidRunAtError(
            f'run_at={run_at.isoformat()} for job "{job_name}" is before year 1 or after 9999 '
            "in UTC",
            fix="pass an instant between the years 1 and 9999 in UTC, e.g. "
            "timezone.now() + timedelta(minutes=5)",
            cause=run_at,
        ) from None
    return run_at


def input_digest(value: dict[str, Any]) -> str:
    """A short stable digest of an input, equal on every node for equal input."""
    if _plain_flat(value):
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)  # Faster, the same bytes.
    else:
        text = _DIGEST_ENCODE(value).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def occurrence_prefix(task: str, occurrence: datetime) -> str:
    """``<task>:<occurrence_ms>:``: how every job key of a task's occurrence begins, so a key
    names the occurrence it was enqueued for (``planner.occurrence_key``)."""
    return f"{task}:{int(occurrence.timestamp() * 1000)}:"


def json_value(value: Any) -> Any:
    """``value`` if the row's JSON column can keep it, else None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return value


def check_text(value: object, what: str, limit: int) -> None:
    """A str the table can hold: at most ``limit`` characters, no NUL, valid UTF-8."""
    if not isinstance(value, str):
        raise InvalidDeclarationError(
            f"{what} {value!r} is a {type(value).__name__}, not a str",
            fix=f"pass {what} as text",
            cause=value,
        )
    bad = _unstorable(value)
    if len(value) > limit or bad is not None:
        raise InvalidDeclarationError(
            f"{what} {value[:60]!r} "
            + (f"holds {bad}" if bad else f"is {len(value)} characters, over {limit}"),
            fix=f"use a {what} of at most {limit} characters, without NUL",
            cause=value,
        )


def check_queue(queue: object, owner: str) -> None:
    """A queue name the table can hold; None leaves the job's or the settings' default."""
    if queue is None:
        return
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidDeclarationError(
            f"{owner} has queue={queue!r}, not a queue name",
            fix='pass a non-empty queue name, e.g. queue="emails", or leave it out',
            cause=queue,
        )
    check_text(queue, "queue name", QUEUE_LIMIT)


def check_columns(handle: JobHandle) -> None:
    """Hold a handle to the job table's limits, as ``@job`` does: one built without it (a
    plugin, a test double) must fail its own task's round, never the insert of everyone's."""
    if handle in _FITTING:
        return  # Checked once per handle: a round may hold thousands of its entries.
    check_text(handle.name, "job name", NAME_LIMIT)
    check_queue(handle.queue, f'job "{handle.name}"')
    if handle.max_attempts is not None:
        problem = check_count(handle.max_attempts, "max_attempts", f'job "{handle.name}"')
        if problem is not None:
            raise InvalidDeclarationError(
                problem, fix="pass max_attempts=1 or more to @job", cause=handle.max_attempts
            )
    _FITTING.add(handle)


_FITTING: weakref.WeakSet[JobHandle] = weakref.WeakSet()


def check_count(value: object, what: str, owner: str) -> str | None:
    """Why ``value`` is not a count from 1 to ``INT_LIMIT`` (bool refused), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{owner} has {what}={value!r}, not a whole number"
    if not 1 <= value <= INT_LIMIT:
        return f"{owner} has {what}={value!r}, outside 1..{INT_LIMIT} (the column's range)"
    return None


#: The longest ``timeout`` a job may declare, in seconds: a day.
TIMEOUT_LIMIT = 86_400
#: How to give a timeout, for the fix of every refusal of one (declaration and setting alike).
TIMEOUT_FIX = "a number of seconds above 0 and at most 86400, e.g. 300, or None for no limit"


def timeout_problem(value: object) -> str | None:
    """Why ``value`` is not a timeout (None, or seconds in (0, ``TIMEOUT_LIMIT``]), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "not a number of seconds"
    if not 0 < value <= TIMEOUT_LIMIT:  # nan fails both comparisons
        return f"not above 0 and at most {TIMEOUT_LIMIT} seconds"
    return None


def check_timeout(value: object, owner: str) -> float | None:
    """``value`` as seconds (None: no limit), or ``InvalidTimeoutError`` naming ``owner``."""
    problem = timeout_problem(value)
    if problem is not None:
        raise InvalidTimeoutError(
            f"{owner} has timeout={value!r}, {problem}",
            fix=f"make timeout {TIMEOUT_FIX}",
            cause=value,
        )
    return None if value is None else float(value)  # type: ignore[arg-type]
