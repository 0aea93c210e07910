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
import threading
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal, overload

from . import clock
from .cron import CronSchedule, occurrences, parse
from .errors import (
    InvalidCatchUpError,
    InvalidDeclarationError,
    InvalidJobInputError,
    InvalidTimezoneError,
    JobNameTakenError,
    MissingTimezoneError,
    TaskEntriesError,
    UltimateError,
)

if TYPE_CHECKING:
    from .jobstore import EnqueueResult

CatchUp = Literal["skip", "run-once", "run-all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "run-once", "run-all")
JobKey = str | Callable[[dict[str, Any]], str] | None
Entry = tuple["JobHandle", dict[str, Any]]


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


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


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
    close = difflib.get_close_matches(tz, _zone_names(), n=3, cutoff=0.5)
    suffix = [name for name in sorted(_zone_names()) if name.endswith("/" + tz)]
    examples = list(dict.fromkeys(suffix + close))[:3] or ["America/Bogota", "Europe/Paris"]
    raise InvalidTimezoneError(
        f'task "{owner}" has tz "{tz}", which is not a zone in the IANA tz database',
        fix=f"use the full zone id, e.g. tz={examples[0]!r}"
        + (f" (or one of {', '.join(repr(e) for e in examples[1:])})" if len(examples) > 1 else "")
        + "; list them with: python -c \"import zoneinfo; print('\\n'.join(sorted("
        'zoneinfo.available_timezones())))"',
        cause=tz,
    )


# Built once: ``json.dumps`` with any non-default option builds a new encoder per call.
_STRICT_ENCODE = json.JSONEncoder(allow_nan=False).encode
_DIGEST_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
#: Value types (exactly these, not subclasses) that a JSON round trip leaves as they are.
_FLAT = frozenset({str, int, bool, type(None)})


def canonical_input(job_name: str, value: object) -> dict[str, Any]:
    """Check that ``value`` is a JSON-serialisable dict of keyword arguments, and return it."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidJobInputError(
            f'input of job "{job_name}" is a {type(value).__name__}, '
            "not a dict of keyword arguments",
            fix=f'pass a dict with string keys, e.g. {job_name}.enqueue({{"day": "2026-03-08"}})',
            cause=value,
        )
    if all(type(v) in _FLAT for v in value.values()):
        # What the round trip below gives for flat str/int/bool/None values: the same dict.
        return dict(value)
    try:
        # Round-tripped so the job gets exactly what the worker will read back.
        return json.loads(_STRICT_ENCODE(value))
    except (TypeError, ValueError) as error:
        raise InvalidJobInputError(
            f'input of job "{job_name}" is not JSON-serialisable: {error}',
            fix="pass only str, int, float, bool, None, lists and dicts; convert dates with "
            ".isoformat() and objects to their ids",
            cause=error,
        ) from error


def input_digest(value: dict[str, Any]) -> str:
    """A short stable digest of an input, equal on every node for equal input."""
    text = _DIGEST_ENCODE(value)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class JobHandle:
    """A unit of work a worker runs. Calling the handle runs the function in-process."""

    kind: Literal["job"] = "job"

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
        """The key ``@job(key=...)`` derives from an input, if the job declares one."""
        if self.key is None:
            return None
        if callable(self.key):
            return str(self.key(data))
        try:
            return self.key.format(**data)
        except (KeyError, IndexError) as error:
            raise InvalidJobInputError(
                f'key template "{self.key}" of job "{self.name}" names {error}, not in the input',
                fix=f'give the input every field the key template of "{self.name}" uses',
                cause=error,
            ) from error

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
        from .jobstore import enqueue

        data = self.check_input(input)
        return enqueue(
            self,
            data,
            key=key or self.plain_key(data),
            run_at=run_at,
            queue=queue,
            enqueued_by=enqueued_by,
            task=task,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "job",
            "name": self.name,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
        }


@dataclass(frozen=True, slots=True)
class TaskJobResult:
    """One entry's outcome, from a scheduled dispatch or a manual ``task.enqueue()`` alike."""

    job: str
    result: EnqueueResult


class TaskHandle:
    """A named cron schedule in a zone. It returns entries; the scheduler enqueues them."""

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
    ) -> None:
        self.func = func
        self.name = name
        self.schedule = schedule
        self.zone = zone
        self.catch_up = catch_up
        self.max_catch_up = max_catch_up
        self.__doc__ = func.__doc__

    @property
    def cron(self) -> str:
        return self.schedule.expr

    @property
    def tz(self) -> str:
        return self.zone.key

    def __repr__(self) -> str:
        return f"<task {self.name} {self.cron!r} {self.tz}>"

    def entries(self, occurrence: datetime | None = None) -> list[tuple[JobHandle, dict[str, Any]]]:
        """Entries for ``occurrence`` (default: now, from the clock), checked.

        The function receives the occurrence in the task's zone, never now: a late or replayed
        occurrence must build the payload for its own day.
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
                f"{type(error).__name__}: {error}",
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
                raise TaskEntriesError(
                    f'task "{self.name}" returned {handle!r} where a @job handle belongs',
                    fix="decorate the function with @job and return the decorated function",
                    cause=handle,
                )
            checked.append((handle, handle.check_input(data)))
        return checked

    def next_runs(self, n: int = 10, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` occurrences strictly after ``after`` (default now), in UTC."""
        return list(islice(occurrences(self.schedule, self.zone, after or clock.now()), n))

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
            "jobs": [job.name for job, _ in self.entries()],
        }


class Registry:
    """Names to handles, with the naming rules that keep watermarks and keys unambiguous."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_kind: dict[str, dict[str, Any]] = {"task": {}, "job": {}}
        self._sites: dict[str, dict[tuple[str, int, str], str]] = {"task": {}, "job": {}}
        #: Bumped on every change, so a scheduler can cache its view of the tasks.
        self.version = 0

    def register(self, handle: TaskHandle | JobHandle) -> None:
        kind, name, site = handle.kind, handle.name, _site(handle.func)
        with self._lock:
            seated = self._by_kind[kind].get(name)
            # The same declaration seen twice (a module imported twice) is one registration.
            # A DIFFERENT one under a taken name would silently take over the watermark.
            if seated is not None and _site(seated.func) != site:
                raise JobNameTakenError(
                    f'{kind} name "{name}" is already taken by {seated.func.__module__}.'
                    f"{seated.func.__qualname__}",
                    fix=f'give one of them another name with @{kind}(name="...")',
                    cause=name,
                )
            # One declaration under two names would move the key the scheduler dedupes on.
            other = self._sites[kind].get(site)
            if other is not None and other != name:
                raise JobNameTakenError(
                    f'{kind} {handle.func.__qualname__} is already registered as "{other}", '
                    f'not "{name}"',
                    fix=f"declare the {kind} once; to run it under a second name, "
                    "declare a second function",
                    cause=name,
                )
            self._by_kind[kind][name] = handle
            self._sites[kind][site] = name
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
                self._sites[handle.kind].pop(_site(handle.func), None)
                self.version += 1


registry = Registry()


def _check_name(name: object, kind: str) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip() or ":" in name):
        raise InvalidDeclarationError(
            f"{kind} name {name!r} is not a usable name",
            fix=f'name the {kind} with a non-empty string without ":", e.g. "billing.nightly"',
            cause=name,
        )


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
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise InvalidDeclarationError(
            f"max_attempts={max_attempts!r} is not a positive integer",
            fix="pass max_attempts=1 or more to @job",
            cause=max_attempts,
        )

    def decorate(fn: Callable[..., Any]) -> JobHandle:
        if not callable(fn) or isinstance(fn, JobHandle | TaskHandle):
            raise InvalidDeclarationError(
                f"@job cannot wrap {fn!r}",
                fix="put @job directly on a plain function",
                cause=fn,
            )
        handle = JobHandle(
            fn, name=name or _default_name(fn), key=key, max_attempts=max_attempts, queue=queue
        )
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
) -> Callable[[Callable[[datetime], Iterable[Entry]]], TaskHandle]:
    """Declare a task: ``@task(cron="0 3 * * *", tz="Europe/Paris")``.

    The function receives each occurrence (aware, in ``tz``) and returns ``[(job, input), ...]``.
    Every problem with the declaration raises here, at import, with a fix.
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
        zone = resolve_zone(tz, task_name)
        schedule = parse(cron)  # type: ignore[arg-type]
        if catch_up not in CATCH_UP_POLICIES:
            raise InvalidCatchUpError(
                f'task "{task_name}" has catch_up={catch_up!r}',
                fix='use catch_up="skip" (default), "run-once" or "run-all"',
                cause=catch_up,
            )
        if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
            raise InvalidCatchUpError(
                f'task "{task_name}" has max_catch_up={max_catch_up!r}',
                fix="use a positive integer, e.g. max_catch_up=10",
                cause=max_catch_up,
            )
        handle = TaskHandle(
            fn,
            name=task_name,
            schedule=schedule,
            zone=zone,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
        )
        registry.register(handle)
        return handle

    return decorate
