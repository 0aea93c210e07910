"""Declarations: ``@job`` and ``@task``, and the registry that names them.

A task never does work: for each occurrence it returns entries ``(job, input)`` and the
scheduler enqueues those jobs, so retries, idempotency and observability come from the job
machinery instead of being re-invented per cron. Nothing here touches the database at import.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import inspect
import json
import string
import threading
import uuid
import weakref
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal, overload

import orjson

from . import clock
from .cron import (
    CronSchedule,
    DstGap,
    DstRepeat,
    check_dst_options,
    next_occurrence,
    occurrences,
    parse,
)
from .errors import (
    InvalidCatchUpError,
    InvalidDeclarationError,
    InvalidJobInputError,
    InvalidJobKeyError,
    InvalidOverlapError,
    InvalidRunAtError,
    InvalidTimezoneError,
    JobNameTakenError,
    MissingTimezoneError,
    TaskEntriesError,
    UltimateError,
    readable,
)

if TYPE_CHECKING:
    from .store import EnqueueResult

CatchUp = Literal["skip", "run-once", "run-all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "run-once", "run-all")
Overlap = Literal["allow", "skip"]
OVERLAP_POLICIES: tuple[Overlap, ...] = ("allow", "skip")
JobKey = str | Callable[[dict[str, Any]], str] | None
#: ``(job, input)``: a @job handle, a Django Task (the framework's ``@task``) or a Celery task.
Entry = tuple[Any, dict[str, Any]]

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


def _site(func: Callable[..., Any]) -> tuple[str, int, str]:
    """Where a function was declared. A module imported twice declares the same site twice."""
    code = getattr(func, "__code__", None)
    if code is None:
        return (getattr(func, "__module__", "?"), 0, getattr(func, "__qualname__", repr(func)))
    return (code.co_filename, code.co_firstlineno, func.__qualname__)


def _default_name(func: Callable[..., Any]) -> str:
    """``<app_label>.<function>``: the app that holds the module, else its parent package."""
    module = func.__module__
    try:
        from django.apps import apps

        config = apps.get_containing_app_config(module)
    except Exception:  # Django not set up: a script or a pure unit test.
        config = None
    if config is not None:
        return f"{config.label}.{func.__name__}"
    parts = module.split(".")
    label = parts[-2] if len(parts) > 1 else parts[0]
    return f"{label}.{func.__name__}"


#: Names a zone directory may hold that are not zones of the IANA database: "localtime" and
#: "posixrules" are host files (the schedule would differ per host), "Factory" means "no zone set".
NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def _zone_names() -> frozenset[str]:
    """The IANA zones as the tzdata package lists them, never what a host's directory adds."""
    try:
        from importlib import resources

        names = frozenset(resources.files("tzdata").joinpath("zones").read_text().split())
    except (ImportError, OSError):  # tzdata is a dependency; a stripped install falls back.
        names = frozenset(zoneinfo.available_timezones())
    return names - NOT_ZONES


def resolve_zone(tz: object, owner: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``tz`` names, or an error whose fix names real zone ids."""
    if tz is None or tz == "":
        raise MissingTimezoneError(
            f'task "{owner}" has no tz: a cron without a timezone is a bug waiting for March',
            fix=f'add tz to @task for "{owner}", e.g. tz="UTC" or tz="Europe/Paris" '
            "(an unzoned cron drifts by an hour at every DST change)",
        )
    if not isinstance(tz, str):
        raise InvalidTimezoneError(
            f'task "{owner}" has tz {tz!r}, not an IANA zone name',
            fix=f'pass the zone id as a string on "{owner}", e.g. tz="America/Bogota"',
            cause=tz,
        )
    if tz in _zone_names():
        return zoneinfo.ZoneInfo(tz)
    zones = _zone_names()
    same = [name for name in sorted(zones) if name.lower() == tz.lower()]
    close = difflib.get_close_matches(tz, zones, n=3, cutoff=0.5)
    suffix = [name for name in sorted(zones) if name.endswith("/" + tz)]
    found = [name for name in dict.fromkeys(same + suffix + close) if name in zones]
    examples = found[:3] or ["UTC", "America/Bogota", "Europe/Paris"]
    message = f'task "{owner}" has tz "{tz}", which is not a zone in the IANA tz database'
    if tz in NOT_ZONES:
        message += (
            ": it is a file of the host's zone directory, so the schedule would follow "
            "whatever zone each host happens to run in"
        )
    raise InvalidTimezoneError(
        message,
        fix=f"use the full zone id, e.g. tz={examples[0]!r}"
        + (f" (or one of {', '.join(repr(e) for e in examples[1:])})" if len(examples) > 1 else "")
        + '; list them with: python -c "import importlib.resources as r; '
        "print(r.files('tzdata').joinpath('zones').read_text())\"",
        cause=tz,
    )


# Built once: ``json.dumps`` with any non-default option builds a new encoder per call.
_STRICT_ENCODE = json.JSONEncoder(allow_nan=False).encode
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
    return run_at


def _check_key_declaration(key: object, func: Callable[..., Any], job_name: str) -> None:
    """A ``key=`` that can never build a key is refused at import, not at the first enqueue."""
    if key is None or callable(key):
        return
    if not isinstance(key, str):
        raise InvalidJobKeyError(
            f'job "{job_name}" has key={key!r}: neither a template nor a callable',
            fix=f"pass a template over the arguments of {job_name}(), "
            f'e.g. key="{job_name}:{{day}}", or a callable of the input',
            cause=key,
        )
    params = inspect.signature(func).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    accepted = ", ".join(named) or "none"

    def refuse(problem: str) -> InvalidJobKeyError:
        return InvalidJobKeyError(
            f'key template "{key}" of job "{job_name}" {problem}',
            fix=f"name only arguments of {job_name}() in braces ({accepted}), e.g. "
            f'key="{job_name}:{{{named[0] if named else "day"}}}"; double a literal brace: {{{{',
            cause=key,
        )

    templates = [key]
    while templates:
        try:
            fields = list(string.Formatter().parse(templates.pop()))
        except ValueError as error:
            raise refuse(f"does not parse: {error}") from error
        for _, field, spec, conversion in fields:
            if field is None:
                continue
            head = field.split(".", 1)[0].split("[", 1)[0]
            if not head or head.isdigit():
                raise refuse(f'has a positional field "{{{field}}}"')
            if head not in named and not takes_any:
                raise refuse(f'names "{head}", which {job_name}() does not take')
            if conversion not in (None, "r", "s", "a"):
                raise refuse(f'has the conversion "!{conversion}" (only !r, !s, !a exist)')
            if spec:
                templates.append(spec)  # Nested fields, e.g. "{n:{width}}".
    literal = "".join(text for text, *_ in string.Formatter().parse(key))
    if len(literal) > KEY_LIMIT:
        raise refuse(f"is over {KEY_LIMIT} characters before any field is filled in")


def input_digest(value: dict[str, Any]) -> str:
    """A short stable digest of an input, equal on every node for equal input."""
    if _plain_flat(value):
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)  # 4x faster, same bytes.
    else:
        text = _DIGEST_ENCODE(value).encode()
    return hashlib.sha256(text).hexdigest()[:16]


class JobHandle:
    """A unit of work a worker runs. Calling the handle runs the function in-process."""

    kind: Literal["job"] = "job"
    #: Claim priority of its rows; only Django Tasks set one.
    priority: int = 0
    #: The ``TASKS`` alias a Django Task runs on; empty for a @job.
    backend: str = ""
    #: The engine an outbox row goes to (``outbox.py``); empty for a row our worker runs.
    relay: str = ""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str,
        key: JobKey,
        max_attempts: int | None,
        queue: str | None,
    ) -> None:
        self.func = func
        self.name = name
        self.key = key
        self.max_attempts = max_attempts
        self.queue = queue
        self.signature = inspect.signature(func)
        # Argument names already seen to fit the signature: binding is per name, not value.
        self._fitting: set[frozenset[str]] = set()
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<job {self.name}>"

    def check_input(self, value: object) -> dict[str, Any]:
        """The input as the worker will pass it; ``InvalidJobInputError`` now, not at run time."""
        data = canonical_input(self.name, value)
        names = frozenset(data)
        if names in self._fitting:
            return data
        try:
            self.signature.bind(**data)
        except TypeError as error:
            params = ", ".join(self.signature.parameters) or "no arguments"
            raise InvalidJobInputError(
                f'input {sorted(data)} does not fit job "{self.name}": {error}',
                fix=f"pass the keyword arguments {self.name}() takes ({params})",
                cause=error,
            ) from error
        if len(self._fitting) < 64:
            self._fitting.add(names)
        return data

    def declared_key(self, data: dict[str, Any]) -> str | None:
        """The key ``@job(key=...)`` derives from an input, if the job declares one.

        A template sees the function's defaults under the input. Whatever goes wrong building
        it (a callable that raises, a value its format spec does not fit) is an
        ``InvalidJobKeyError`` naming this job.
        """
        if self.key is None:
            return None
        if callable(self.key):
            try:
                value = str(self.key(data))
            except Exception as error:
                raise InvalidJobKeyError(
                    f'the key callable of job "{self.name}" raised for input {sorted(data)}: '
                    f"{type(error).__name__}: {readable(error)}",
                    fix=f'make the key of "{self.name}" handle every input it is given',
                    cause=error,
                ) from error
            return check_key(self.name, value)
        defaults = {
            n: p.default
            for n, p in self.signature.parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        try:
            value = self.key.format(**{**defaults, **data})
        except (KeyError, IndexError) as error:
            raise InvalidJobKeyError(
                f'key template "{self.key}" of job "{self.name}" names {error}, not in the input',
                fix=f'give the input every field the key template of "{self.name}" uses',
                cause=error,
            ) from error
        except Exception as error:
            raise InvalidJobKeyError(
                f'key template "{self.key}" of job "{self.name}" does not fit input '
                f"{sorted(data)}: {type(error).__name__}: {readable(error)}",
                fix=f'make the format specs of the key of "{self.name}" fit the values passed',
                cause=error,
            ) from error
        return check_key(self.name, value)

    def plain_key(self, data: dict[str, Any]) -> str:
        """The key of a direct or manual enqueue: the declared one, else a fresh one."""
        return self.declared_key(data) or f"{self.name}:{uuid.uuid4().hex}"

    def occurrence_part(self, data: dict[str, Any]) -> str:
        """This entry's part of an occurrence key: equal on every node for the same entry."""
        return self.declared_key(data) or f"{self.name}:{input_digest(data)}"

    def enqueue(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
        task: str = "",
    ) -> EnqueueResult:
        """Enqueue one run. An existing ``key`` returns that job with ``created=False``.

        ``task`` names the task this run belongs to, for a manual run of a task.
        """
        from .store import enqueue

        data = self.check_input(input)
        if key is not None:
            check_key(self.name, key)
        check_run_at(self.name, run_at)
        _check_queue(queue, f'job "{self.name}"')
        _check_text(enqueued_by, "enqueued_by", NAME_LIMIT)
        _check_text(task, "task", NAME_LIMIT)
        return enqueue(
            self,
            data,
            key=key or self.plain_key(data),
            run_at=run_at,
            queue=queue,
            enqueued_by=enqueued_by,
            task=task,
        )

    def check_backend(self, database: str | None) -> None:
        """Raise if a round on ``database`` cannot enqueue this entry; a @job always can."""

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "job",
            "name": self.name,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
        }


class DjangoTaskHandle(JobHandle):
    """A Django Task (the framework's ``@task``) as a scheduler entry: enqueued like a @job.

    Its rows carry the task's priority, queue and backend alias and run once: the framework
    has no retries. Only a ``JobsBackend`` on the round's database can take it in the round's
    transaction; ``check_backend`` refuses any other.
    """

    def __init__(self, task: Any) -> None:
        super().__init__(
            task.func, name=task.module_path, key=None, max_attempts=1, queue=task.queue_name
        )
        self.task = task
        self.priority = task.priority
        self.backend = task.backend
        if task.takes_context:
            # The worker passes the context first; entries name the other arguments.
            params = list(self.signature.parameters.values())[1:]
            self.signature = self.signature.replace(parameters=params)

    def __repr__(self) -> str:
        return f"<django task {self.name}>"

    def check_backend(self, database: str | None) -> None:
        from .backends import require_jobs_backend

        require_jobs_backend(self.task, owner=self.name, database=database)

    def enqueue(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
        task: str = "",
    ) -> EnqueueResult:
        """A manual run ("Run now"): the task's row on its backend's database."""
        from .backends import require_jobs_backend
        from .store import enqueue

        backend = require_jobs_backend(self.task, owner=task or self.name, database=None)
        data = self.check_input(input)
        result = enqueue(
            self,
            data,
            key=key or self.plain_key(data),
            run_at=run_at or self.task.run_after,
            queue=queue,
            enqueued_by=enqueued_by,
            task=task,
            using=backend.database,
        )
        if result.created:
            from .backends import announce

            announce(backend, self.task, result.job_id)
        return result

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "django-task",
            "name": self.name,
            "queue": self.queue,
            "priority": self.priority,
            "backend": self.backend,
        }


def _is_django_task(value: object) -> bool:
    # Imported here: importing the framework loads django.conf, which ``cron`` must not need.
    from .tasks_compat import is_django_task

    return is_django_task(value)


@functools.lru_cache(maxsize=1024)
def django_task_handle(task: Any) -> DjangoTaskHandle:
    """The entry handle of a Django Task, built once per task (its signature is read once)."""
    return DjangoTaskHandle(task)


@dataclass(slots=True)
class TaskJobResult:
    """One entry's outcome, from a scheduled dispatch or a manual ``task.enqueue()`` alike."""

    job: str
    result: EnqueueResult


class _FunctionDoc:
    """``__doc__`` of a slotted handle: its function's on a handle, the class's on the class."""

    def __init__(self, doc: str | None) -> None:
        self.doc = doc

    def __get__(self, handle: Any, owner: type | None = None) -> str | None:
        return self.doc if handle is None else handle.func.__doc__


class TaskHandle:
    """A named cron schedule in a zone. It returns entries; the scheduler enqueues them."""

    # Slots: a site declares its tasks by the ten thousand, and a handle with an instance dict
    # was 56 bytes more each.
    __slots__ = (
        "catch_up", "dst_gap", "dst_repeat", "func", "max_catch_up", "name", "overlap",
        "schedule", "zone",
    )  # fmt: skip

    kind: Literal["task"] = "task"

    def __init__(
        self,
        func: Callable[[datetime], Iterable[Entry]],
        *,
        name: str,
        schedule: CronSchedule,
        zone: zoneinfo.ZoneInfo,
        catch_up: CatchUp,
        max_catch_up: int,
        dst_gap: DstGap = "end-of-gap",
        dst_repeat: DstRepeat = "first",
        overlap: Overlap = "allow",
    ) -> None:
        self.func = func
        self.name = name
        self.schedule = schedule
        self.zone = zone
        self.catch_up = catch_up
        self.max_catch_up = max_catch_up
        self.dst_gap: DstGap = dst_gap
        self.dst_repeat: DstRepeat = dst_repeat
        self.overlap = overlap

    @property
    def cron(self) -> str:
        return self.schedule.expr

    @property
    def tz(self) -> str:
        return self.zone.key

    def __repr__(self) -> str:
        return f"<task {self.name} {self.cron!r} {self.tz}>"

    def entries(
        self, occurrence: datetime | None = None, *, check_inputs: bool = True
    ) -> list[tuple[JobHandle, dict[str, Any]]]:
        """Entries for ``occurrence`` (default: now, from the clock), checked.

        The function receives the occurrence in the task's zone, never now: a late or replayed
        occurrence must build the payload for its own day. ``check_inputs=False`` leaves the
        inputs as the function gave them, for a caller that only wants the jobs.
        """
        at = (occurrence or clock.now()).astimezone(self.zone)
        try:
            produced = self.func(at)
            raw = list(produced) if produced is not None else []
        except UltimateError:
            raise
        except Exception as error:
            raise TaskEntriesError(
                f'task "{self.name}" raised for occurrence {at.isoformat()}: '
                f"{type(error).__name__}: {readable(error)}",
                fix=f'fix the function of task "{self.name}"; the scheduler retries this '
                "occurrence every round until it returns entries",
                cause=error,
            ) from error
        checked: list[tuple[JobHandle, dict[str, Any]]] = []
        for item in raw:
            if not (isinstance(item, tuple | list) and len(item) == 2):
                raise TaskEntriesError(
                    f'task "{self.name}" returned {item!r}, not a (job, input) pair',
                    fix=f'make task "{self.name}" return a list like '
                    '[(send_digest, {"day": ...})]',
                    cause=item,
                )
            handle, data = item
            if not isinstance(handle, JobHandle):
                # A Celery task, or a Django Task on another backend: an outbox row.
                from .outbox import entry_handle

                handle = entry_handle(handle) or handle
            if not isinstance(handle, JobHandle) and _is_django_task(handle):
                handle = django_task_handle(handle)
            if not isinstance(handle, JobHandle):
                raise TaskEntriesError(
                    f'task "{self.name}" returned {handle!r} where a @job handle belongs',
                    fix="decorate the function with @job (or the Django Tasks @task) and "
                    "return the decorated function",
                    cause=handle,
                )
            checked.append((handle, handle.check_input(data) if check_inputs else data))
        return checked

    def next_after(self, at: datetime) -> datetime:
        """The first occurrence strictly after ``at``, under this task's DST options."""
        return next_occurrence(
            self.schedule, self.zone, at, dst_gap=self.dst_gap, dst_repeat=self.dst_repeat
        )

    def next_runs(self, n: int = 10, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` occurrences strictly after ``after`` (default now), in UTC."""
        start = after or clock.now()
        found = occurrences(
            self.schedule, self.zone, start, dst_gap=self.dst_gap, dst_repeat=self.dst_repeat
        )
        return list(islice(found, n))

    def enqueue(
        self,
        *,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
    ) -> list[TaskJobResult]:
        """Fire this task's entries now: the backfill and "run it again" path.

        Each job's PLAIN key, never the occurrence key: reusing that would make a manual run
        dedupe against whichever occurrence it landed in. The watermark is left alone.
        """
        from django.db import transaction

        check_run_at(self.name, run_at)
        entries = self.entries()
        with transaction.atomic():
            return [
                TaskJobResult(
                    job=job.name,
                    result=job.enqueue(
                        data, run_at=run_at, queue=queue, enqueued_by=enqueued_by, task=self.name
                    ),
                )
                for job, data in entries
            ]

    def describe(self) -> dict[str, Any]:
        """A JSON-safe view of the task; jobs in declaration order."""
        return {
            "kind": "task",
            "name": self.name,
            "cron": self.cron,
            "tz": self.tz,
            "catch_up": self.catch_up,
            "max_catch_up": self.max_catch_up,
            "dst_gap": self.dst_gap,
            "dst_repeat": self.dst_repeat,
            "overlap": self.overlap,
            "jobs": [job.name for job, _ in self.entries()],
        }


TaskHandle.__doc__ = _FunctionDoc(TaskHandle.__doc__)  # type: ignore[assignment]


class Registry:
    """Names to handles, with the naming rules that keep watermarks and keys unambiguous.

    A declaration is known by its site (file, line, qualified name) and the module instance
    that ran it: the same site from ANOTHER instance is a module imported twice and must keep
    its names; from the SAME instance it is a factory (a loop declaring one task per region)
    and each function may take a name of its own. One function object keeps one name.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_kind: dict[str, dict[str, Any]] = {"task": {}, "job": {}}
        #: kind -> site -> id of the module instance's globals -> names declared there; a site
        #: with one declaration holds (module, name) instead, 400 bytes less per site (a
        #: ``tasks.py`` of 10,000 functions was 4.5 MB of dicts and sets of one name each).
        self._sites: dict[str, dict[Site, SiteNames]] = {"task": {}, "job": {}}
        #: kind -> a registered function -> its name (the handle holds the function anyway).
        self._names: dict[str, dict[Callable[..., Any], str]] = {"task": {}, "job": {}}
        #: Bumped on every change, so a scheduler can cache its view of the tasks.
        self.version = 0

    def register(self, handle: TaskHandle | JobHandle) -> None:
        kind, name, func = handle.kind, handle.name, handle.func
        site, module = _site(func), _module_of(func)
        with self._lock:
            seated = self._by_kind[kind].get(name)
            if seated is not None and seated.func is not func:
                reimport = _site(seated.func) == site and _module_of(seated.func) != module
                # A DIFFERENT declaration under a taken name would silently take over the
                # watermark; only a module imported twice may declare a name again.
                if not reimport:
                    raise JobNameTakenError(
                        f'{kind} name "{name}" is already taken by {seated.func.__module__}.'
                        f"{seated.func.__qualname__}",
                        fix=f'give one of them another name with @{kind}(name="...")',
                        cause=name,
                    )
            # One declaration under two names would move the key the scheduler dedupes on.
            other = self._names[kind].get(func)
            elsewhere = [
                names
                for seen, names in _by_module(self._sites[kind].get(site)).items()
                if seen != module
            ]
            if other is None and elsewhere and not any(name in names for names in elsewhere):
                other = sorted(elsewhere[0])[0]  # The same site imported as another module.
            if other is not None and other != name:
                raise JobNameTakenError(
                    f'{kind} {func.__qualname__} is already registered as "{other}", not "{name}"',
                    fix=f"declare the {kind} once; to run it under a second name, "
                    "declare a second function",
                    cause=name,
                )
            if seated is not None:
                self._forget(seated)
            self._by_kind[kind][name] = handle
            sites = self._sites[kind]
            declared = sites.get(site)
            if declared is None:
                sites[site] = (module, name)
            elif declared != (module, name):
                modules = sites[site] = _by_module(declared)
                modules.setdefault(module, set()).add(name)
            self._names[kind][func] = name
            self.version += 1

    def _forget(self, handle: TaskHandle | JobHandle) -> None:
        """Drop what ``register`` noted about ``handle`` (the lock is held)."""
        kind, site, module = handle.kind, _site(handle.func), _module_of(handle.func)
        self._names[kind].pop(handle.func, None)
        sites = self._sites[kind]
        declared = sites.get(site)
        if declared == (module, handle.name):
            del sites[site]
        elif isinstance(declared, dict):
            declared.get(module, set()).discard(handle.name)
            if not declared.get(module, True):
                del declared[module]
            if not declared:
                del sites[site]

    def snapshot(self) -> tuple[Any, ...]:
        """Everything registered, for ``restore``: a test's declarations must not leak."""
        with self._lock:
            return (
                {kind: dict(table) for kind, table in self._by_kind.items()},
                _copy_sites(self._sites),
                {kind: dict(table) for kind, table in self._names.items()},
            )

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Go back to a ``snapshot``."""
        with self._lock:
            by_kind, sites, names = saved
            self._by_kind = {kind: dict(table) for kind, table in by_kind.items()}
            self._sites = _copy_sites(sites)
            self._names = {kind: dict(table) for kind, table in names.items()}
            self.version += 1

    def tasks(self) -> list[TaskHandle]:
        with self._lock:
            return sorted(self._by_kind["task"].values(), key=lambda t: t.name)

    def jobs(self) -> list[JobHandle]:
        with self._lock:
            return sorted(self._by_kind["job"].values(), key=lambda j: j.name)

    def get_task(self, name: str) -> TaskHandle | None:
        return self._by_kind["task"].get(name)

    def get_job(self, name: str) -> JobHandle | None:
        return self._by_kind["job"].get(name)

    def unregister(self, handle: TaskHandle | JobHandle) -> None:
        with self._lock:
            if self._by_kind[handle.kind].get(handle.name) is handle:
                del self._by_kind[handle.kind][handle.name]
                self._forget(handle)
                self.version += 1


#: Where a function was declared (``_site``).
Site = tuple[str, int, str]
#: Who declared there: the one (module instance, name), or names by module instance.
SiteNames = tuple[int, str] | dict[int, set[str]]


def _by_module(declared: SiteNames | None) -> dict[int, set[str]]:
    """The names declared at a site by module instance, as a dict of its own for a site of one
    declaration."""
    if declared is None:
        return {}
    if isinstance(declared, tuple):
        return {declared[0]: {declared[1]}}
    return declared


def _copy_sites(sites: dict[str, dict[Site, SiteNames]]) -> dict[str, dict[Site, SiteNames]]:
    return {
        kind: {
            site: declared
            if isinstance(declared, tuple)
            else {m: set(names) for m, names in declared.items()}
            for site, declared in by.items()
        }
        for kind, by in sites.items()
    }


def _module_of(func: Callable[..., Any]) -> int:
    """The module instance a function was declared in: two imports of one file differ."""
    return id(getattr(func, "__globals__", func))


registry = Registry()


def _check_name(name: object, kind: str) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip() or ":" in name):
        raise InvalidDeclarationError(
            f"{kind} name {name!r} is not a usable name",
            fix=f'name the {kind} with a non-empty string without ":", e.g. "billing.nightly"',
            cause=name,
        )
    if name is not None:
        _check_text(name, f"{kind} name", NAME_LIMIT)


def _check_text(value: object, what: str, limit: int) -> None:
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


def _check_queue(queue: object, owner: str) -> None:
    if queue is None:
        return
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidDeclarationError(
            f"{owner} has queue={queue!r}, not a queue name",
            fix='pass a non-empty queue name, e.g. queue="emails", or leave it out',
            cause=queue,
        )
    _check_text(queue, "queue name", QUEUE_LIMIT)


def check_columns(handle: JobHandle) -> None:
    """Hold a handle to the job table's limits, as ``@job`` does: one built without it (a
    plugin, a test double) must fail its own task's round, never the insert of everyone's."""
    if handle in _FITTING:
        return  # Checked once per handle: a round may hold thousands of its entries.
    _check_text(handle.name, "job name", NAME_LIMIT)
    _check_queue(handle.queue, f'job "{handle.name}"')
    if handle.max_attempts is not None:
        problem = _check_count(handle.max_attempts, "max_attempts", f'job "{handle.name}"')
        if problem is not None:
            raise InvalidDeclarationError(
                problem, fix="pass max_attempts=1 or more to @job", cause=handle.max_attempts
            )
    _FITTING.add(handle)


_FITTING: weakref.WeakSet[JobHandle] = weakref.WeakSet()


def _check_count(value: object, what: str, owner: str) -> str | None:
    """Why ``value`` is not a count from 1 to ``INT_LIMIT`` (bool refused), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{owner} has {what}={value!r}, not a whole number"
    if not 1 <= value <= INT_LIMIT:
        return f"{owner} has {what}={value!r}, outside 1..{INT_LIMIT} (the column's range)"
    return None


@overload
def job(func: Callable[..., Any], /) -> JobHandle: ...
@overload
def job(
    *,
    name: str | None = None,
    key: JobKey = None,
    max_attempts: int | None = None,
    queue: str | None = None,
) -> Callable[[Callable[..., Any]], JobHandle]: ...
def job(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    key: JobKey = None,
    max_attempts: int | None = None,
    queue: str | None = None,
) -> JobHandle | Callable[[Callable[..., Any]], JobHandle]:
    """Declare a job: ``@job`` or ``@job(name=..., key=..., max_attempts=..., queue=...)``.

    ``key`` makes enqueues idempotent: a format string over the input (``"digest:{day}"``) or
    a callable of the input. ``max_attempts`` and ``queue`` default to the settings.
    """
    _check_name(name, "job")
    attempts_problem = None
    if max_attempts is not None:
        attempts_problem = _check_count(max_attempts, "max_attempts", "@job")
    if attempts_problem is not None:
        raise InvalidDeclarationError(
            f"{attempts_problem}: it is not a positive integer",
            fix="pass max_attempts=1 or more to @job, e.g. max_attempts=5",
            cause=max_attempts,
        )
    _check_queue(queue, "@job")

    def decorate(fn: Callable[..., Any]) -> JobHandle:
        if not callable(fn) or isinstance(fn, JobHandle | TaskHandle):
            raise InvalidDeclarationError(
                f"@job cannot wrap {fn!r}",
                fix="put @job directly on a plain function",
                cause=fn,
            )
        job_name = name or _default_name(fn)
        _check_name(job_name, "job")
        _check_key_declaration(key, fn, job_name)
        handle = JobHandle(fn, name=job_name, key=key, max_attempts=max_attempts, queue=queue)
        registry.register(handle)
        return handle

    return decorate(func) if func is not None else decorate


def task(
    cron: str | None = None,
    *,
    tz: str | None = None,
    name: str | None = None,
    catch_up: CatchUp = "skip",
    max_catch_up: int = 10,
    dst_gap: DstGap = "end-of-gap",
    dst_repeat: DstRepeat = "first",
    overlap: Overlap = "allow",
) -> Callable[[Callable[[datetime], Iterable[Entry]]], TaskHandle]:
    """Declare a task: ``@task(cron="0 3 * * *", tz="Europe/Paris")``.

    The function receives each occurrence (aware, in ``tz``) and returns ``[(job, input), ...]``.
    ``dst_gap`` ("end-of-gap" | "skip") and ``dst_repeat`` ("first" | "both") choose what a
    wall-clock schedule does on DST days (``ultimat3_jobs.cron``). ``overlap="skip"`` records an
    occurrence as skipped, rather than firing it, while a job of an earlier occurrence of the
    task is still queued or running. Every problem with the
    declaration raises here, at import, with a fix.
    """
    _check_name(name, "task")

    def decorate(fn: Callable[[datetime], Iterable[Entry]]) -> TaskHandle:
        if not callable(fn) or isinstance(fn, JobHandle | TaskHandle):
            raise InvalidDeclarationError(
                f"@task cannot wrap {fn!r}",
                fix="put @task directly on a plain function of the occurrence",
                cause=fn,
            )
        task_name = name or _default_name(fn)
        _check_name(task_name, "task")
        zone = resolve_zone(tz, task_name)
        schedule = parse(cron)  # type: ignore[arg-type]
        if len(schedule.expr) > CRON_LIMIT:
            raise InvalidDeclarationError(
                f'task "{task_name}" has a cron of {len(schedule.expr)} characters, over the '
                f"{CRON_LIMIT} the task table holds",
                fix="shorten the cron: ranges (1-5) and steps (*/15) rather than long lists",
                cause=schedule.expr,
            )
        if catch_up not in CATCH_UP_POLICIES:
            raise InvalidCatchUpError(
                f'task "{task_name}" has catch_up={catch_up!r}',
                fix='use catch_up="skip" (default), "run-once" or "run-all"',
                cause=catch_up,
            )
        if _check_count(max_catch_up, "max_catch_up", f'task "{task_name}"') is not None:
            raise InvalidCatchUpError(
                f'task "{task_name}" has max_catch_up={max_catch_up!r}',
                fix=f"use a whole number from 1 to {INT_LIMIT}, e.g. max_catch_up=10",
                cause=max_catch_up,
            )
        gap, repeat = check_dst_options(dst_gap, dst_repeat, f'task "{task_name}"')
        if overlap not in OVERLAP_POLICIES:
            raise InvalidOverlapError(
                f'task "{task_name}" has overlap={overlap!r}',
                fix='use overlap="allow" (default: occurrences may run side by side) or '
                '"skip" (skip an occurrence while an earlier one is still queued or running)',
                cause=overlap,
            )
        handle = TaskHandle(
            fn,
            name=task_name,
            schedule=schedule,
            zone=zone,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
            dst_gap=gap,
            dst_repeat=repeat,
            overlap=overlap,
        )
        registry.register(handle)
        return handle

    return decorate
