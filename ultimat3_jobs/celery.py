"""Celery's side of relaying: ``ExactlyOnceTask``, and the outbox rows of plain tasks marked done.

``run_relay`` publishes an outbox row with headers naming the row. ``ExactlyOnceTask`` runs
the task body in one database transaction with marking that row done, holding the row lock
(``SELECT ... FOR UPDATE``) throughout, so::

    @shared_task(base=ExactlyOnceTask)
    def record_visit(day: str) -> None:
        Visit.objects.create(day=day)  # once per occurrence, however often the message comes

A copy delivered again (a broker's redelivery, a relay's resend) finds the row done and does
nothing; two copies at once wait for each other on the lock; a worker killed mid-body rolls
the body back and the redelivered message runs it again. What the body writes to the database
is exactly once; anything else it does (an email, an HTTP call) is at least once: dedupe it on
``self.job_key``.

How the body ends decides the row, in the body's transaction, so no copy runs it again:

- it returns, or raises ``Ignore`` (it is done and wants no state recorded): ``succeeded``, its
  writes committed, the return value kept (None after ``Ignore``);
- ``self.replace(sig)``: Celery publishes the replacement, then raises ``Ignore``: the row is
  ``succeeded`` (replaced) with the body's writes, so a copy or a resend finds it done and
  never publishes a second replacement;
- it raises (``Reject(requeue=False)`` included: the message is dropped or dead-lettered):
  ``failed`` with the traceback, the body's writes rolled back;
- ``Retry`` or ``Reject(requeue=True)``: nothing is kept, and Celery delivers the task again.

A plain Celery task's row is marked done by the signal handlers below once the task returns,
raises, ignores or rejects its message.

This module is named after the library: ``from celery import Task`` is an absolute import of
the real one, never of this file.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, states
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import task_failure, task_postrun, task_success, task_unknown
from django.db import DEFAULT_DB_ALIAS, transaction

from . import clock
from .errors import RelayTargetError
from .inputs import relayed_result
from .logs import emit
from .retries import format_error
from .store import FINISHED, store_for

logger = logging.getLogger("ultimat3_jobs.relay")

#: The message headers ``run_relay`` sets: the row's id, its database, its key.
JOB_HEADER = "ultimat3_job"
DATABASE_HEADER = "ultimat3_database"
KEY_HEADER = "ultimat3_key"


def _header(request: Any, name: str) -> Any:
    # Custom headers arrive as attributes of the request, and in its ``headers`` too.
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def outbox_row(request: Any) -> tuple[int, str] | None:
    """The outbox row a message was relayed from, ``(job id, database)``; None otherwise."""
    job_id = _header(request, JOB_HEADER)
    if job_id is None:
        return None
    return int(job_id), str(_header(request, DATABASE_HEADER) or DEFAULT_DB_ALIAS)


class Replaced(Ignore):
    """The ``Ignore`` that ends a body after ``self.replace(sig)`` published ``sig``.

    Both values are its ``args``: a prefork pool's child sends it to the worker's main process
    pickled, and an exception is rebuilt from its ``args`` alone (one that cannot be stopped
    that process).
    """

    def __init__(self, reason: str, replaced_by: str) -> None:
        super().__init__(reason, replaced_by)
        self.reason = reason
        self.replaced_by = replaced_by


class ExactlyOnceTask(Task):
    """A Celery task whose body and the marking of its outbox row done commit together.

    Use it as ``@shared_task(base=ExactlyOnceTask)``. Called without a relayed message (a
    direct call, an ``apply_async`` of your own) it runs as a plain task.
    """

    @property
    def job_key(self) -> str | None:
        """The job's key (``<task>:<occurrence_ms>:<entry>``), stable across every copy."""
        value = _header(self.request, KEY_HEADER)
        return None if value is None else str(value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        row = outbox_row(self.request)
        if row is None:
            return super().__call__(*args, **kwargs)
        job_id, using = row
        store = store_for(using)
        value: Any = None
        ignored: Ignore | None = None
        failure: Exception | None = None
        with transaction.atomic(using=using):
            job = store.lock_relayed(job_id=job_id)  # Held until this transaction ends.
            if job is None or job.status in FINISHED:
                emit(
                    logger,
                    "jobs.relay.duplicate",
                    job_id=job_id,
                    task=self.name,
                    celery_id=self.request.id,
                    status=None if job is None else job.status,
                )
                return None if job is None else job.return_value
            try:
                # A savepoint: a failure undoes the body's writes, and the row is failed under
                # the same lock, so no copy waiting on it runs the body in between.
                with transaction.atomic(using=using):
                    try:
                        value = super().__call__(*args, **kwargs)
                    except Ignore as error:  # Done, as a return is (self.replace() too).
                        ignored = error
                    store.relayed_done(
                        job_id=job_id,
                        now=clock.now(),
                        # A value the row cannot keep fails the body, its writes undone.
                        return_value=relayed_result(self.name, value),
                        engine_id=str(self.request.id or ""),
                    )
            except Retry:
                raise  # Celery sends it again: nothing is kept.
            except Reject as error:
                if error.requeue:
                    raise  # Back in the queue: nothing is kept.
                failure = error
            except Exception as error:
                failure = error
            if failure is not None:
                store.relayed_done(
                    job_id=job_id, now=clock.now(), ok=False, error=format_error(failure)
                )
        if failure is not None:
            raise failure
        if ignored is not None:
            self._ended_without_result(job_id, ignored)
            raise ignored
        return value

    def on_replace(self, sig: Any) -> Any:
        """Celery's hand-over to ``sig`` (it publishes it, then raises ``Ignore``), its
        ``Ignore`` naming the replacement for the row's log line."""
        try:
            return super().on_replace(sig)
        except Ignore as ignored:
            raise Replaced(str(ignored), str(getattr(sig, "name", None) or sig)) from None

    def _ended_without_result(self, job_id: int, ignored: Ignore) -> None:
        replaced = ignored if isinstance(ignored, Replaced) else None
        emit(
            logger,
            "jobs.relay.replaced" if replaced else "jobs.relay.ignored",
            job_id=job_id,
            task=self.name,
            celery_id=self.request.id,
            replaced_by=replaced.replaced_by if replaced else None,
            reason=replaced.reason if replaced else str(ignored),
        )


def named(name: str) -> Any:
    """The Celery task registered as ``name`` in the current app, for a schedule's entries.

    Looked up when the entries are built, so the module declaring it need not be imported
    first; ``KeyError`` names a task that is not registered (the round retries it).
    """
    from celery import current_app

    return current_app.tasks[name]


def _plain_task_row(sender: Any) -> tuple[int, str] | None:
    if sender is None or isinstance(sender, ExactlyOnceTask):
        return None  # Its row was marked in the body's own transaction.
    return outbox_row(sender.request)


@task_success.connect
def _plain_task_succeeded(sender: Any = None, result: Any = None, **kwargs: Any) -> None:
    row = _plain_task_row(sender)
    if row is not None:
        store_for(row[1]).relayed_done(
            job_id=row[0], now=clock.now(), return_value=result, name=sender.name
        )


@task_failure.connect
def _plain_task_failed(
    sender: Any = None, exception: BaseException | None = None, **kwargs: Any
) -> None:
    row = _plain_task_row(sender)
    if row is not None and exception is not None:
        store_for(row[1]).relayed_done(
            job_id=row[0], now=clock.now(), ok=False, error=format_error(exception)
        )


@task_postrun.connect
def _plain_task_ended_otherwise(
    sender: Any = None, state: str | None = None, retval: Any = None, **kwargs: Any
) -> None:
    # Ignore (self.replace() too) and Reject send neither task_success nor task_failure: without
    # this their rows would stay relayed, and hold an overlap="skip" task back for good.
    row = _plain_task_row(sender)
    if row is None:
        return
    if state == states.IGNORED:
        store_for(row[1]).relayed_done(job_id=row[0], now=clock.now())
    elif state == states.REJECTED and not getattr(retval, "requeue", False):
        error = retval if isinstance(retval, BaseException) else Reject(retval, requeue=False)
        store_for(row[1]).relayed_done(
            job_id=row[0], now=clock.now(), ok=False, error=format_error(error)
        )


@task_unknown.connect
def _plain_task_unknown_to_its_worker(
    sender: Any = None, message: Any = None, name: str | None = None, **kwargs: Any
) -> None:
    # The worker drops a message whose task it does not know (one of the last release during a
    # rolling deploy): a plain task's row would stay relayed for good, and hold an
    # overlap="skip" task back. An ExactlyOnceTask's row is sent again after RELAY_RESEND_AFTER.
    headers = getattr(message, "headers", None) or {}
    if headers.get(JOB_HEADER) is None:
        return
    job_id, using = int(headers[JOB_HEADER]), str(headers.get(DATABASE_HEADER) or DEFAULT_DB_ALIAS)
    hostname = getattr(sender, "hostname", None) or "a Celery worker"
    error = RelayTargetError(
        f'{hostname} does not know the Celery task "{name}" and dropped its message',
        fix="deploy the code that declares it to every Celery worker consuming its queue, then "
        "retry the row from the admin (Retry failed)",
        cause=name,
    )
    # A plain task's relay kind, outbox.CELERY (which imports this module for ExactlyOnceTask).
    store_for(using).relayed_done(
        job_id=job_id, now=clock.now(), ok=False, error=str(error), relay="celery"
    )


def reports_plain_tasks() -> bool:
    """Whether plain Celery tasks' rows are marked done from this process: the handlers above
    are connected to Celery's signals (as they are once this module is imported)."""
    handlers = (
        (task_success, _plain_task_succeeded),
        (task_failure, _plain_task_failed),
        (task_postrun, _plain_task_ended_otherwise),
    )
    # A receiver's lookup key starts with id(receiver), as in Django's dispatcher.
    return all(
        any(key[0] == id(handler) for key, _ in signal.receivers) for signal, handler in handlers
    )


__all__ = [
    "DATABASE_HEADER",
    "JOB_HEADER",
    "KEY_HEADER",
    "ExactlyOnceTask",
    "named",
    "outbox_row",
    "reports_plain_tasks",
]
