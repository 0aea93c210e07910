"""``JobsBackend``: the Django Tasks backend whose tasks are rows of the job table.

Configured the framework's way::

    TASKS = {"default": {"BACKEND": "ultimat3_jobs.backends.JobsBackend", "QUEUES": ["default"]}}

``enqueue()`` writes one job row in the caller's transaction and ``run_worker`` runs it: one
run (the framework has no retries), its JSON return value or ``TaskError`` kept on the row.
The framework builds the backend when a task is declared, during ``ready()``, so this module
touches no database and imports no models at import time; the job store (``store``) is
imported on use.

A Django Task a ``@task`` returns becomes an entry here too: a ``DjangoTaskHandle`` when its
backend is a ``JobsBackend``, else a ``RelayedTaskHandle``, an outbox row ``run_relay`` hands to
that backend. Importing this module registers that adapter (``handles.add_entry_adapter``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils.module_loading import import_string

from .conf import get_settings
from .db import app_database, committed, in_transaction, left_in_transaction
from .errors import (
    InvalidJobInputError,
    TaskBackendError,
    TaskReceiverError,
    UnknownDatabaseError,
    WorkerLostError,
    class_path,
)
from .handles import EnqueueResult, JobHandle, add_entry_adapter
from .inputs import (
    MAX_INPUT_DEPTH,
    NAME_LIMIT,
    QUEUE_LIMIT,
    check_arguments,
    check_result,
    unstorable_result,
)
from .logs import emit
from .outbox import TASKS
from .retries import bounded, format_error
from .tasks_compat import (
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    get_exception_traceback,
    is_django_task,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

if TYPE_CHECKING:
    from django.dispatch import Signal

    from .models import Job
    from .store import JobStore, StartedTask

logger = logging.getLogger(__name__)
#: The framework's signals this backend sends after a commit, by name.
_SIGNALS = {task_enqueued: "task_enqueued", task_finished: "task_finished"}

#: Job status -> the framework's. A cancelled row never ran and never will: FAILED.
STATUSES = {
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
    # Rows for another engine: waiting for the relay, then handed over (its result is there).
    "outbox": TaskResultStatus.READY,
    "relayed": TaskResultStatus.READY,
}
#: The largest id a bigint primary key holds; a larger "id" is malformed, not a query.
MAX_ID = 2**63 - 1
ID_PATTERN = re.compile(r"[1-9][0-9]{0,18}")


class JobsBackend(BaseTaskBackend):
    """Django Tasks as job rows: deferred, prioritised, async-capable, results kept.

    ``OPTIONS``: ``DATABASE``, the alias whose job table holds this backend's tasks (default
    ``"default"``); a worker and a scheduler on that database serve them. ``store``: the job
    store that writes them (default: ``store_for(DATABASE)``, looked up on first use).
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(
        self, alias: str, params: dict[str, Any], *, store: JobStore | None = None
    ) -> None:
        super().__init__(alias, params)
        self._database: str | None = self.options.get("DATABASE")
        self._store = store

    @property
    def database(self) -> str:
        """The database its rows are written to: ``DATABASE``, else the app's
        (``db.app_database``, where ``DATABASE_ROUTERS`` send the app), looked up on first
        use, not at construction (the framework builds a backend while apps are still being
        made ready), then kept: a round asks it for each Django Task entry."""
        if self._database is None:
            self._database = app_database()
        return self._database

    @property
    def store(self) -> JobStore:
        if self._store is None:
            from django.conf import settings

            from .store import store_for

            if self.database not in settings.DATABASES:
                # As manage.py check says it (E005), rather than Django's bare lookup error.
                raise UnknownDatabaseError(
                    f'TASKS["{self.alias}"] keeps its tasks in database "{self.database}", '
                    "which is not in DATABASES",
                    fix=database_option_fix(self.alias),
                    cause=self.database,
                )
            self._store = store_for(self.database)
        return self._store

    def validate_task(self, task: Task) -> None:
        """The framework's rules, and the widths of the job row's name and queue columns."""
        super().validate_task(task)
        if len(task.module_path) > NAME_LIMIT:
            raise InvalidTaskError(
                f"Task path {task.module_path!r} is longer than {NAME_LIMIT} characters, the "
                "job name JobsBackend stores it as; move or rename the function."
            )
        if len(task.queue_name) > QUEUE_LIMIT:
            raise InvalidTaskError(
                f"Queue name {task.queue_name!r} is longer than {QUEUE_LIMIT} characters."
            )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """One job row in the caller's transaction, due at ``task.run_after`` (else now).

        Arguments a job row cannot hold (NUL or an unpaired surrogate in text, too deep, too
        large) raise ``InvalidJobInputError`` before anything is written, so the caller's
        transaction goes on. ``task_enqueued`` is sent once that transaction commits (at once
        outside one): a rolled-back enqueue announces nothing.
        """
        self.validate_task(task)
        try:
            args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        except RecursionError:
            # The framework's walk recurses: nesting this deep is past what a row keeps anyway.
            raise InvalidJobInputError(
                f"the arguments of {task.module_path} nest too deep for a job row",
                fix=f"pass ids and small values, nested at most {MAX_INPUT_DEPTH} levels",
            ) from None
        except (TypeError, ValueError) as error:
            # A set, a datetime, bytes that are not text: refused as a @job's input is.
            raise InvalidJobInputError(
                f"the arguments of {task.module_path} are not JSON-serialisable: {error}",
                fix="pass only str, int, float, bool, None, lists and dicts; convert dates "
                "with .isoformat() and objects to their ids",
                cause=error,
            ) from error
        check_arguments(task.module_path, args, kwargs)
        job = self.store.enqueue_task(django_task_handle(task), args, kwargs, run_at=task.run_after)
        result = result_of(job, task, self.alias)
        _enqueued_at_commit(type(self), result, using=self.database)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's row as it is now; ``TaskResultDoesNotExist`` for an unknown or bad id."""
        text = str(result_id)
        # Only the ids enqueue() hands out: "12", never " 12", "+12" or "012".
        if not ID_PATTERN.fullmatch(text) or int(text) > MAX_ID:
            raise TaskResultDoesNotExist(result_id)
        pk = int(text)
        job = self.store.read_task(pk, backend=self.alias)
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            task = load_task(job.name)
        except ImportError as error:
            raise TaskResultDoesNotExist(f"{result_id}: {error}") from error
        return result_of(job, task, self.alias)


def load_task(path: str) -> Task:
    """The Django Task declared at ``path`` (its module path), or ``ImportError``."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise ImportError(f"{path} is {type(found).__name__}, not a Django Task")
    return found


def result_of(job: Job | StartedTask, task: Task, alias: str) -> TaskResult:
    """A ``TaskResult`` of ``job``'s row as loaded (or, started, as its claim made it)."""
    run_after = _run_after(job) or task.run_after
    if (task.priority, task.queue_name, task.backend, task.run_after) != (
        job.priority,
        job.queue,
        alias,
        run_after,
    ):
        # The row tells what the task was enqueued as: its priority, queue and due time (the
        # declared task has none of a using()), should the settings have changed since.
        with contextlib.suppress(InvalidTaskError):
            task = task.using(
                priority=job.priority, queue_name=job.queue, backend=alias, run_after=run_after
            )
    status = STATUSES[job.status]
    if job.status == "running" and job.started_at is None:
        status = TaskResultStatus.READY  # Claimed ahead by a worker; not started yet.
    result: TaskResult = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=list(job.args or []),
        kwargs=dict(job.input or {}),
        backend=alias,
        errors=_errors(job.error_class, job.traceback),
        # A row claimed ahead counts its attempt, and has no start: it has not run yet.
        worker_ids=[job.worker] if job.attempts and job.worker and job.started_at else [],
    )
    # The framework keeps the value behind a read-only property; a backend sets it.
    object.__setattr__(result, "_return_value", job.return_value)
    return result


def _run_after(job: Job | StartedTask) -> datetime | None:
    """When a row enqueued for later is due, while nothing has moved that time since: not
    once it was claimed (a retry's backoff moves it) or put off for a worker that knows its
    task. A claim's record (``StartedTask``) is of a claimed row."""
    if job.attempts or getattr(job, "target_unknown_since", None) is not None:
        return None
    run_at: datetime | None = getattr(job, "run_at", None)
    return run_at if run_at is not None and run_at != job.created_at else None


def _errors(error_class: str, traceback: str) -> list[TaskError]:
    """A result's errors: the one its run ended with, if it raised."""
    if not error_class:
        return []
    return [TaskError(exception_class_path=error_class, traceback=traceback)]


def require_jobs_backend(task: Task, *, owner: str, database: str | None) -> JobsBackend:
    """The task's backend, if it is a ``JobsBackend`` (on ``database`` when given)."""
    alias = task.backend
    try:
        backend = task_backends[alias]
    except Exception as error:
        raise TaskBackendError(
            f'"{owner}" enqueues {task.module_path}, whose backend "{alias}" is not in TASKS',
            fix=f'add TASKS["{alias}"] with "BACKEND": "ultimat3_jobs.backends.JobsBackend"',
            cause=error,
        ) from error
    if not isinstance(backend, JobsBackend):
        raise TaskBackendError(
            f'"{owner}" enqueues {task.module_path} on backend "{alias}" '
            f"({type(backend).__module__}.{type(backend).__name__}), which a round cannot "
            "write exactly once",
            fix=f'set TASKS["{alias}"]["BACKEND"] to "ultimat3_jobs.backends.JobsBackend", or '
            f"declare the task with backend= an alias that is one, or return a @job instead",
            cause=alias,
        )
    if database is not None and backend.database != database:
        raise TaskBackendError(
            f'"{owner}" enqueues {task.module_path} on backend "{alias}", whose database '
            f'"{backend.database}" is not the scheduler\'s ("{database}")',
            fix=f'set TASKS["{alias}"]["OPTIONS"]["DATABASE"] to "{database}", or run the '
            f"scheduler with --database {backend.database}",
            cause=alias,
        )
    return backend


def _enqueued_at_commit(sender: type[BaseTaskBackend], result: TaskResult, *, using: str) -> None:
    """``task_enqueued`` once the transaction that wrote the row commits on ``using`` (at once
    outside one); never for a row a rollback took back."""
    transaction.on_commit(lambda: told(task_enqueued, sender, result), using=using)


def database_option_fix(alias: str) -> str:
    """The fix for a ``JobsBackend`` whose ``DATABASE`` is no database (``E005``)."""
    from django.conf import settings

    names = ", ".join(sorted(settings.DATABASES))
    return f'set TASKS["{alias}"]["OPTIONS"]["DATABASE"] to one of: {names}'


#: What to do about a receiver of the framework's signals that raised.
RECEIVER_FIX = (
    "make the receiver catch what it raises (its traceback is logged by django.dispatch): "
    "the task's row is as it was written, and the other receivers were told"
)


def told(signal: Signal, sender: type[BaseTaskBackend], result: TaskResult) -> None:
    """Send ``signal`` of ``result`` to each of its receivers, whatever one raises: sent once
    the row it tells of is committed, a receiver's failure must not look like the commit's,
    nor keep the other receivers, or the rest of a worker's batch, from being told. A
    receiver that raised is logged with its fix."""
    for receiver, response in signal.send_robust(sender, task_result=result):
        if isinstance(response, Exception):
            name = getattr(receiver, "__qualname__", repr(receiver))
            error = TaskReceiverError(
                f"a receiver of {_SIGNALS.get(signal, 'a task signal')} ({name}) raised "
                f"{type(response).__name__}: {response}",
                fix=RECEIVER_FIX,
                cause=response,
            )
            emit(
                logger,
                "jobs.task.receiver-failed",
                logging.ERROR,
                task=result.task.module_path,
                result=result.id,
                **error.as_fields(),
            )


def announce(backend: JobsBackend, task: Task, job_id: int) -> None:
    """``task_enqueued`` for one row enqueued outside ``enqueue()`` (a manual "Run now"), once
    the caller's transaction commits."""
    job = backend.store.read_task(job_id, backend=backend.alias)
    if job is not None:
        result = result_of(job, task, backend.alias)
        _enqueued_at_commit(type(backend), result, using=backend.database)


def announce_round(rows: list[dict[str, Any]], enqueued: Mapping[str, tuple[int, bool]]) -> None:
    """``task_enqueued`` for the Django Task rows a scheduler round created, once the round's
    transaction commits (a round inside a caller's transaction: once that one does)."""
    from .models import Job

    for row in rows:
        pk, created = enqueued.get(row["key"], (None, False))
        # A relayed row is announced by the backend it is relayed to, when the relay enqueues it.
        if not row.get("backend") or row.get("relay") or not created:
            continue
        try:
            backend = task_backends[row["backend"]]
            task = load_task(row["name"])
        except Exception:
            continue  # The round refused such an entry; nothing to announce.
        job = Job(pk=pk, **row)
        result = result_of(job, task, row["backend"])
        using = getattr(backend, "database", DEFAULT_DB_ALIAS)
        _enqueued_at_commit(type(backend), result, using=using)


# -- Django Tasks as scheduler entries ------------------------------------------------------------


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
        # The framework lets a bool or a whole float through its range check; the column is
        # an integer, which a bool is not to the database.
        self.priority = int(task.priority)
        self.backend = task.backend
        if task.takes_context:
            # The worker passes the context first; entries name the other arguments.
            params = list(self.signature.parameters.values())[1:]
            self.signature = self.signature.replace(parameters=params)

    def __repr__(self) -> str:
        return f"<django task {self.name}>"

    def check_backend(self, database: str | None) -> None:
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
        backend = require_jobs_backend(self.task, owner=task or self.name, database=None)
        data = self.check_input(input)
        result = backend.store.enqueue(
            self,
            data,
            key=key or self.plain_key(data),
            run_at=run_at or self.task.run_after,
            queue=queue,
            enqueued_by=enqueued_by,
            task=task,
        )
        if result.created:
            announce(backend, self.task, result.job_id)
        return result

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "django-task",
            "name": self.name,
            "queue": self.queue,
            "priority": self.priority,
            "backend": self.backend,
            # Run by our worker: the JOB_TIMEOUT default bounds each attempt.
            "timeout": get_settings().job_timeout,
        }


class RelayedTaskHandle(DjangoTaskHandle):
    """A Django Task on a backend other than ``JobsBackend``: an outbox row ``run_relay``
    enqueues through that backend's ``enqueue()``, once per occurrence."""

    def __init__(self, task: Any) -> None:
        super().__init__(task)
        self.relay = TASKS

    def __repr__(self) -> str:
        return f"<relayed django task {self.name} on {self.backend}>"

    def check_backend(self, database: str | None) -> None:
        backend_of(self.task, owner=self.name)

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
        """A manual run ("Run now"): an outbox row, which the relay sends like a round's."""
        return JobHandle.enqueue(
            self,
            input,
            key=key,
            run_at=run_at or self.task.run_after,
            queue=queue,
            enqueued_by=enqueued_by,
            task=task,
        )

    def describe(self) -> dict[str, Any]:
        # Run by the backend's own workers: no timeout of ours applies.
        described = {**super().describe(), "kind": "relayed-django-task", "relay": self.relay}
        return {**described, "timeout": None}


@functools.lru_cache(maxsize=1024)
def django_task_handle(task: Any) -> DjangoTaskHandle:
    """The entry handle of a Django Task, built once per task (its signature is read once)."""
    return DjangoTaskHandle(task)


@functools.cache
def backend_class(alias: str) -> type[BaseTaskBackend]:
    """The class of the backend ``alias`` names in ``TASKS``, the sender of its signals: looked
    up once (the framework keeps a backend per thread, behind a lookup that costs a worker more
    per task than running a no-op does), again once ``TASKS`` changes."""
    return type(task_backends[alias])


def _tasks_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKS":
        backend_class.cache_clear()


setting_changed.connect(_tasks_changed)


def backend_of(task: Any, *, owner: str) -> Any:
    """The backend a Django Task is declared on, or a ``TaskBackendError`` naming the alias."""
    try:
        return task_backends[task.backend]
    except Exception as error:
        raise TaskBackendError(
            f'"{owner}" enqueues {task.module_path}, whose backend "{task.backend}" is not in '
            "TASKS",
            fix=f'add TASKS["{task.backend}"] to the settings, or declare the task with '
            "backend= an alias that is there",
            cause=error,
        ) from error


def _on_jobs_backend(task: Any) -> bool:
    try:
        return isinstance(backend_of(task, owner=task.module_path), JobsBackend)
    except TaskBackendError:
        return True  # DjangoTaskHandle.check_backend reports the missing alias.


def entry_handle(value: object) -> JobHandle | None:
    """The handle of a Django Task entry, or None when ``value`` is not one."""
    if not is_django_task(value):
        return None
    if _on_jobs_backend(value):
        return django_task_handle(value)
    return RelayedTaskHandle(value)


add_entry_adapter(entry_handle)


# -- the worker's side ----------------------------------------------------------------------------


@dataclass
class TaskRun:
    """One run of a Django Task's row: its JSON return value, or the error it ended with."""

    job: StartedTask
    task: Task | None = None
    backend: type[BaseTaskBackend] = JobsBackend
    #: The result ``task_started`` was sent with, finished in place by ``finished``.
    result: TaskResult | None = None
    return_value: Any = None
    error: BaseException | None = None
    error_class: str = ""
    traceback: str = ""

    @property
    def message(self) -> str:
        """The error as ``last_error`` keeps it."""
        return "" if self.error is None else format_error(self.error)


def run_task(job: StartedTask) -> TaskRun:
    """Run a claimed Django Task's row once (a coroutine function on an event loop of its own).

    Sends ``task_started``; the caller records the outcome, then calls ``finished``.
    """
    run = TaskRun(job)
    before = in_transaction()
    try:
        task, result = _loaded(run)
        task_started.send(run.backend, task_result=result)
        args = list(job.args or [])
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        # Task.call runs a coroutine function to completion (async_to_sync), a plain one as is.
        value = task.call(*args, **(job.input or {}))
        committed(job.name, before)
        # Held to what the row's JSON column keeps, as its input was: a value that is not
        # JSON, or one the database would refuse, ends the run failed
        # (``ResultUnstorableError``), never left running.
        try:
            value = normalize_json(value)
        except (TypeError, ValueError) as error:
            raise unstorable_result(job.name, f"is not JSON: {error}") from error
        except RecursionError:
            raise unstorable_result(job.name, "nests too deep for a job row") from None
        run.return_value = check_result(job.name, value)
    except BaseException as error:
        left_in_transaction(before)
        run.error = error
        run.error_class = class_path(type(error))
        run.traceback = bounded(get_exception_traceback(error))
    return run


def ended_from_outside(job: StartedTask, error: BaseException) -> TaskRun:
    """The run of ``job`` its worker ended (a timeout, its process's death) with ``error``: what
    ``finished`` tells ``task_finished`` of, once the failure is written. Its result is made
    again here, the one its run made being another thread's or process's."""
    run = TaskRun(job, error=error, error_class=class_path(type(error)))
    run.traceback = bounded(str(error))
    with contextlib.suppress(Exception):  # Not loadable (its run failed so): nothing to tell.
        _loaded(run)
    return run


def _loaded(run: TaskRun) -> tuple[Task, TaskResult]:
    """``run``'s backend class, task and result, loaded from its row; raises what fails."""
    job = run.job
    run.backend = backend_class(job.backend)
    run.task = task = load_task(job.name)
    run.result = result = result_of(job, task, job.backend)
    return task, result


def finished(run: TaskRun, *, now: Any) -> None:
    """Send ``task_finished`` with the result as recorded (status, value or error): the one
    its run started with, brought up to date in place as the framework's ``refresh`` does."""
    result = run.result
    if result is None:
        return  # Not even loaded: there is no task to tell of.
    failed = run.error is not None
    for name, value in (
        ("status", TaskResultStatus.FAILED if failed else TaskResultStatus.SUCCESSFUL),
        ("finished_at", now),
        ("errors", _errors(run.error_class, run.traceback)),
        ("_return_value", run.return_value),
    ):
        object.__setattr__(result, name, value)
    if run.error is None:
        told(task_finished, run.backend, result)
        return
    # Sent after the outcome committed, long after the run's exception was handled; raised
    # again here, it is the one a receiver's ``logger.exception`` reports (the framework's
    # own receiver logs a failed task so, for error monitoring), not "NoneType: None".
    try:
        raise run.error
    except BaseException:
        told(task_finished, run.backend, result)


def finished_lost(job_ids: Iterable[int], *, using: str) -> None:
    """``task_finished`` for the Django Task rows among ``job_ids`` that their worker's loss
    ended failed (another worker's recovery, or its own drain that ran out of grace), once
    that is committed: the framework's receivers hear of every failure, those too. Read
    again, as the rows were written, by the error a worker's loss leaves (a row that failed of
    its own run meanwhile, told by the worker that ran it, is not told again); a row whose
    task this code cannot load tells nothing."""
    from .models import Job, JobStatus

    ids = list(job_ids)
    if not ids:
        return
    lost = class_path(WorkerLostError)
    rows = (
        Job.objects.using(using)
        .filter(pk__in=ids, status=JobStatus.FAILED, error_class=lost)
        .exclude(backend="")
    )
    for job in rows.order_by("pk"):
        try:
            sender, task = backend_class(job.backend), load_task(job.name)
        except Exception:  # Not loadable here (or its backend gone): nothing to tell of.
            continue
        result = result_of(job, task, job.backend)
        # Raised, so that a receiver's ``logger.exception`` reports it, as for any failure.
        try:
            raise WorkerLostError(job.last_error, fix=WorkerLostError.FIX)
        except WorkerLostError:
            told(task_finished, sender, result)


__all__ = [
    "DjangoTaskHandle",
    "JobsBackend",
    "RelayedTaskHandle",
    "TaskRun",
    "django_task_handle",
    "ended_from_outside",
    "finished",
    "finished_lost",
    "load_task",
    "result_of",
    "run_task",
]
