"""Handles: what ``@job`` and ``@task`` return, and the wiring that lets them reach the store.

A task never does work: for each occurrence it returns entries ``(job, input)`` and the
scheduler enqueues those jobs, so retries, idempotency and observability come from the job
machinery instead of being re-invented per cron. Nothing here touches the database or imports
the store: the app's ``ready()`` hands ``connect_store`` the function that writes a job row,
and the modules that know another engine's tasks (a Django Task, a Celery task) register an
entry adapter that turns one into a handle.
"""

from __future__ import annotations

import functools
import inspect
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Literal, Protocol

from . import clock
from .cron import CronSchedule, DstGap, DstRepeat, next_occurrence, occurrences
from .errors import (
    AppNotReadyError,
    InvalidJobInputError,
    InvalidJobKeyError,
    TaskEntriesError,
    UltimateError,
    readable,
)
from .inputs import (
    NAME_LIMIT,
    canonical_input,
    check_key,
    check_queue,
    check_run_at,
    check_text,
    input_digest,
)
from .monitors import Monitor

CatchUp = Literal["skip", "run-once", "run-all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("skip", "run-once", "run-all")
Overlap = Literal["allow", "skip"]
OVERLAP_POLICIES: tuple[Overlap, ...] = ("allow", "skip")
JobKey = str | Callable[[dict[str, Any]], str] | None
#: ``(job, input)``: a @job handle, a Django Task (the framework's ``@task``) or a Celery task.
Entry = tuple[Any, dict[str, Any]]


@dataclass(slots=True)
class EnqueueResult:
    """``created`` is False when a job with this key already existed; ``job_id`` is that job."""

    created: bool
    job_id: int
    key: str


#: ``record_run(task, results, enqueued_by)``: the record of a manual run of ``task``.
RecordRun = Callable[[str, "list[TaskJobResult]", str], None]


class Enqueue(Protocol):
    """The store's enqueue: insert one job row, or return the one that already holds ``key``."""

    def __call__(
        self,
        handle: JobHandle,
        data: dict[str, Any],
        *,
        key: str,
        run_at: datetime | None = ...,
        queue: str | None = ...,
        enqueued_by: str = ...,
        task: str = ...,
        using: str = ...,
    ) -> EnqueueResult: ...


#: Another engine's task (a Django Task, a Celery task) as a handle; None when not its kind.
EntryAdapter = Callable[[object], "JobHandle | None"]

# Set by the app's ``ready()``: a handle reaches the store through what is wired here, never
# by importing it, so the declarations stay below the store.
_store_enqueue: Enqueue | None = None
#: And what records a task's manual run (``manual.record_run``), in the transaction of its jobs.
_record_run: RecordRun | None = None

#: Instants in a zone, as task functions receive them: a round asks the same few (one
#: occurrence, a handful of zones) once per task, and converting costs ten times a look-up.
_LOCAL: dict[tuple[datetime, zoneinfo.ZoneInfo], datetime] = {}
_LOCAL_SIZE = 4096
_entry_adapters: list[EntryAdapter] = []


def connect_store(enqueue: Enqueue, record_run: RecordRun | None = None) -> None:
    """Make ``JobHandle.enqueue`` write through ``enqueue``, and ``TaskHandle.enqueue`` record
    its run through ``record_run``; the app's ``ready()`` calls it."""
    global _store_enqueue, _record_run
    _store_enqueue = enqueue
    _record_run = record_run


def add_entry_adapter(adapter: EntryAdapter) -> None:
    """Let a task return another engine's tasks: ``adapter`` gives the handle of one it knows.

    Adapters are tried in the order they were added, on every entry that is not a handle
    already; adding one twice keeps its first place.
    """
    if adapter not in _entry_adapters:
        _entry_adapters.append(adapter)


def _connected_store(job_name: str) -> Enqueue:
    if _store_enqueue is None:
        raise AppNotReadyError(
            f'job "{job_name}" cannot be enqueued: no job store is connected, the app\'s '
            "ready() has not run",
            fix='add "ultimat3_jobs" to INSTALLED_APPS and call django.setup() before enqueueing '
            "(manage.py, the WSGI and ASGI handlers and Celery's Django fixup do)",
            cause=job_name,
        )
    return _store_enqueue


def _adapted(value: object) -> object:
    """The handle an entry adapter gives ``value``, else ``value`` itself."""
    for adapter in _entry_adapters:
        handle = adapter(value)
        if handle is not None:
            return handle
    return value


def _local(at: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """``at.astimezone(zone)``, each instant and zone converted once (while remembered).

    Only an instant in UTC is remembered: two wall times that differ by their ``fold`` alone
    are equal keys, yet not the same instant.
    """
    if at.tzinfo is not UTC:
        return at.astimezone(zone)
    found = _LOCAL.get((at, zone))
    if found is None:
        if len(_LOCAL) >= _LOCAL_SIZE:
            _LOCAL.clear()
        found = _LOCAL[at, zone] = at.astimezone(zone)
    return found


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
        timeout: float | None = None,
    ) -> None:
        self.func = func
        self.name = name
        self.key = key
        self.max_attempts = max_attempts
        self.queue = queue
        #: Seconds an attempt may run; None: the ``JOB_TIMEOUT`` setting's.
        self.timeout = timeout
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
        enqueue = _connected_store(self.name)
        data = self.check_input(input)
        if key == "":
            # Read as "no key", it would get a generated one: the caller's dedupe lost.
            raise InvalidJobKeyError(
                f'key of job "{self.name}" is empty',
                fix=f'pass a key that names the run, e.g. key="{self.name}:2026-03-08", or '
                "no key at all for the declared one (or a fresh one)",
                cause=key,
            )
        if key is not None:
            check_key(self.name, key)
        check_run_at(self.name, run_at)
        check_queue(queue, f'job "{self.name}"')
        check_text(enqueued_by, "enqueued_by", NAME_LIMIT)
        check_text(task, "task", NAME_LIMIT)
        return enqueue(
            self,
            data,
            key=self.plain_key(data) if key is None else key,
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
            "timeout": self.timeout,
        }


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

    # Slots: a site declares its tasks by the ten thousand, and an instance dict each adds up.
    __slots__ = (
        "catch_up", "dst_gap", "dst_repeat", "func", "max_catch_up", "monitor", "name",
        "overlap", "schedule", "zone",
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
        monitor: Monitor = None,
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
        #: Whether it is a Sentry Crons monitor (``monitors.py``): None follows SENTRY_CRONS.
        self.monitor: Monitor = monitor

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
        at = _local(occurrence, self.zone) if occurrence else clock.now().astimezone(self.zone)
        try:
            produced = self.func(at)
            raw = list(produced) if produced is not None else []
        except UltimateError:
            raise
        except Exception as error:
            raise TaskEntriesError(
                f'task "{self.name}" raised '
                f"{'for occurrence' if occurrence else 'when run at'} {at.isoformat()}: "
                f"{type(error).__name__}: {readable(error)}",
                fix=f'fix the function of task "{self.name}"; the scheduler retries this '
                "occurrence every round until it returns entries"
                if occurrence
                else f'fix the function of task "{self.name}", then run it again',
                cause=error,
            ) from error
        checked: list[tuple[JobHandle, dict[str, Any]]] = []
        for item in raw:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TaskEntriesError(
                    f'task "{self.name}" returned {item!r}, not a (job, input) pair',
                    fix=f'make task "{self.name}" return a list like '
                    '[(send_digest, {"day": ...})]',
                    cause=item,
                )
            handle, data = item
            if not isinstance(handle, JobHandle):
                # A Django Task or a Celery task: its engine's adapter (backends, outbox).
                handle = _adapted(handle)
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
        """The next ``n`` occurrences strictly after ``after`` (default now), in UTC.

        Fewer than ``n`` only where the calendar ends, after year 9999.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, got {n!r}")
        if n < 0:
            raise ValueError(f"n must not be negative, got {n}")
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
        """Fire this task's entries now: a manual run, recorded in the task's history (who:
        ``enqueued_by``) in the transaction of its jobs.

        Each job's PLAIN key, never the occurrence key: reusing that would make a manual run
        dedupe against whichever occurrence it landed in. The watermark is left alone.
        """
        from django.db import transaction

        from .db import app_database

        check_run_at(self.name, run_at)
        # Called before the transaction: a slow function holds no lock meanwhile (on SQLite,
        # whose transactions take the write lock as they begin, every writer would wait).
        entries = self.entries()
        with transaction.atomic(using=app_database()):
            results = self.enqueue_entries(
                entries, run_at=run_at, queue=queue, enqueued_by=enqueued_by
            )
            if _record_run is not None:
                _record_run(self.name, results, enqueued_by)
        return results

    def enqueue_entries(
        self,
        entries: list[tuple[JobHandle, dict[str, Any]]],
        *,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
    ) -> list[TaskJobResult]:
        """``enqueue`` of the ``entries`` this task's function gave, without its record, for
        a caller that writes its own (the admin's "Run now" names the user)."""
        from django.db import transaction

        from .db import app_database

        check_run_at(self.name, run_at)
        with transaction.atomic(using=app_database()):
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
