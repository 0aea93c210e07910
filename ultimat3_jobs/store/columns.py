"""The job row's columns, listed once, and the rows made of them.

``NEW_JOB_COLUMNS`` is every column a new job row is written with, in the order of
``sql.COPY_JOBS``; the statements that write new rows (``COPY_JOBS``, ``INSERT_JOBS``,
``INSERT_TASK``) take their column lists from it. A new row is made as ``job_fields`` (a dict
by column name, for the ORM and ``INSERT_JOBS``; a round's through ``scheduled_fields``) or as
a COPY row (``copy_row``, ``scheduled_row``: a tuple in this order, without its id). The
columns a claim reads are ``ClaimedJob``'s fields (``CLAIMED_COLUMNS``). The task row's columns
a declaration sets are ``DECLARED``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from ..conf import Settings, get_settings
from ..db import jsonb_field
from ..listener import RELAY_PAYLOAD
from ..models import Job, JobStatus
from .values import ClaimedJob, StartedTask

if TYPE_CHECKING:
    from ..handles import JobHandle, TaskHandle
    from .values import FiredOccurrence, ScheduledJob


@dataclass(frozen=True, slots=True)
class Column:
    """A column a new job row is written with."""

    name: str
    #: Its type, as ``INSERT_JOBS`` reads it from a row's JSON.
    type: str
    #: What every new row holds (SQL); a row does not carry it.
    new: str | None = None
    #: What a row that leaves it out holds (SQL): older rows, hand-made ones, tests.
    default: str | None = None


#: A new job row's columns, in COPY order (after the id). Those left out (args, return_value,
#: error_class, traceback, relayed_at, engine_id, done_at, started_at, finished_at,
#: target_unknown_since) take their database defaults, empty or NULL.
NEW_JOB_COLUMNS = (
    Column("name", "text"),
    Column("key", "text"),
    Column("input", "jsonb"),
    Column("status", "text", default="'queued'"),
    Column("queue", "text"),
    Column("attempts", "integer", new="0"),
    Column("max_attempts", "integer"),
    Column("run_at", "timestamptz"),
    Column("created_at", "timestamptz"),
    Column("last_error", "text", new="''"),
    Column("task", "text"),
    Column("occurrence", "timestamptz"),
    Column("catch_up", "boolean"),
    Column("enqueued_by", "text"),
    Column("worker", "text", new="''"),
    Column("priority", "integer", default="0"),
    Column("backend", "text", default="''"),
    Column("relay", "text", default="''"),
    Column("trace_context", "text", default="''"),
)
NEW_JOB_NAMES = tuple(column.name for column in NEW_JOB_COLUMNS)
#: The columns a row carries (``job_fields``' keys): all but those every new row holds alike.
CARRIED = tuple(column for column in NEW_JOB_COLUMNS if column.new is None)
#: Where a key, a queue and a relay sit in a COPY row.
KEY, QUEUE, RELAY = (NEW_JOB_NAMES.index(name) for name in ("key", "queue", "relay"))

#: The columns a claim returns, in ``ClaimedJob``'s order; ``started_at`` follows them (NULL
#: unless the claim marked the row started). ``unreadable`` is the reading's, not a column.
CLAIMED_COLUMNS = tuple(
    field.name for field in fields(ClaimedJob) if field.name not in ("started_at", "unreadable")
)


# -- new rows -------------------------------------------------------------------------------------


def job_fields(
    handle: JobHandle,
    data: dict[str, Any] | orjson.Fragment,
    *,
    key: str,
    run_at: datetime | None,
    queue: str | None,
    enqueued_by: str,
    now: datetime,
    task: str = "",
    occurrence: datetime | None = None,
    catch_up: bool = False,
    config: Settings | None = None,
    trace_context: str = "",
) -> dict[str, Any]:
    """The fields of a new job row (``CARRIED``), with the defaults the job and the settings
    give.

    ``config``: the settings, read once by a caller that builds many rows. ``trace_context``:
    the ``traceparent`` the job's run continues (``tracing.py``).
    """
    config = config or get_settings()
    queue, max_attempts, status = _defaults(handle, queue, config)
    return {
        "name": handle.name,
        "key": key,
        "input": data,
        "queue": queue,
        "max_attempts": max_attempts,
        "run_at": run_at or now,
        "created_at": now,
        "task": task,
        "occurrence": occurrence,
        "catch_up": catch_up,
        "enqueued_by": enqueued_by,
        "priority": handle.priority,
        "backend": handle.backend,
        "status": status,
        "relay": handle.relay,
        "trace_context": trace_context,
    }


def _defaults(handle: JobHandle, queue: str | None, config: Settings) -> tuple[str, int, str]:
    """A new row's queue, max_attempts and status, from the job and the settings."""
    # A relayed entry is an outbox row: the relay sends it, our worker never claims it.
    status = JobStatus.OUTBOX if handle.relay else JobStatus.QUEUED
    queue = queue or handle.queue or config.default_queue
    return queue, handle.max_attempts or config.max_attempts, status.value


def scheduled_fields(
    fired: FiredOccurrence,
    job: ScheduledJob,
    data: dict[str, Any] | orjson.Fragment,
    *,
    now: datetime,
    config: Settings,
) -> dict[str, Any]:
    """``job_fields`` of a scheduler round's ``job`` of the occurrence ``fired``, its input as
    ``data``."""
    return job_fields(
        job.job,
        data,
        key=job.key,
        run_at=None,
        queue=None,
        enqueued_by="scheduler",
        now=now,
        task=fired.task,
        occurrence=fired.occurrence,
        catch_up=fired.catch_up,
        config=config,
        trace_context=fired.trace_context,
    )


def build_job(handle: JobHandle, data: dict[str, Any], **fields: Any) -> Job:
    """An unsaved job row: ``job_fields`` as a model instance."""
    return Job(**job_fields(handle, data, **fields))


# The two COPY row builders below put the values in ``NEW_JOB_COLUMNS``' order by hand: a round
# makes its rows by the thousand, and a tuple written out costs a fraction of one assembled
# column by column. tests/integration/test_store.py holds them to the list, column by column.


def copy_row(r: dict[str, Any]) -> tuple[Any, ...]:
    """A ``job_fields`` dict as a binary COPY row (``db.copy_rows``).

    A column's ``default`` stands in for what the dict leaves out; str(): a status may be a
    ``JobStatus``.
    """
    return (r["name"], r["key"], jsonb_field(r["input"]), str(r.get("status") or JobStatus.QUEUED),
            r["queue"], 0, r["max_attempts"], r["run_at"], r["created_at"], "",
            r["task"], r["occurrence"], r["catch_up"], r["enqueued_by"], "",
            r.get("priority", 0), r.get("backend", ""), r.get("relay", ""),
            r.get("trace_context", ""))  # fmt: skip


def scheduled_row(
    handle: JobHandle,
    data: dict[str, Any] | str,
    *,
    key: str,
    task: str,
    occurrence: datetime,
    catch_up: bool,
    now: datetime,
    config: Settings,
    trace_context: str = "",
    defaults: dict[JobHandle, tuple[str, int, str]] | None = None,
) -> tuple[Any, ...]:
    """``copy_row(job_fields(...))`` of a scheduler round's job, made without the dict: the
    same defaults, the same columns. ``defaults``: each job's, kept there across a round's
    rows (the job's status is an enum member, slow to read)."""
    found = None if defaults is None else defaults.get(handle)
    if found is None:
        found = _defaults(handle, None, config)
        if defaults is not None:
            defaults[handle] = found
    queue, max_attempts, status = found
    return (handle.name, key, jsonb_field(data), status, queue, 0, max_attempts, now, now, "",
            task, occurrence, catch_up, "scheduler", "", handle.priority, handle.backend,
            handle.relay, trace_context)  # fmt: skip


def started_task(job: ClaimedJob, *, worker: str, started_at: datetime) -> StartedTask:
    """A started Django Task's row as its run reads it, made from its claim, not read again:
    the claim returned every column the run and its ``TaskResult`` need."""
    assert job.created_at is not None  # Claimed with a Django Task's row.
    return StartedTask(
        id=job.id,
        name=job.name,
        backend=job.backend,
        args=job.args or [],
        input=job.input,
        queue=job.queue,
        priority=job.priority,
        attempts=job.attempts,
        created_at=job.created_at,
        started_at=started_at,
        worker=worker,
    )


def wake_payload(queue: str, relay: str) -> str:
    """Whom a new row's NOTIFY wakes: the workers of its queue, or the relays."""
    return RELAY_PAYLOAD if relay else queue


# -- the task row ---------------------------------------------------------------------------------

#: The task row's columns a declaration sets, in the order ``declared`` gives them.
DECLARED = ("cron", "tz", "catch_up", "max_catch_up", "overlap")


def declared(handle: TaskHandle) -> tuple[str, str, str, int, str]:
    """What ``handle`` declares of its row, in ``DECLARED``'s order."""
    return (handle.cron, handle.tz, handle.catch_up, handle.max_catch_up, handle.overlap)


def declaration(handle: TaskHandle) -> dict[str, Any]:
    """``declared`` by column name."""
    return dict(zip(DECLARED, declared(handle), strict=True))


def job_names(handle: TaskHandle, at: datetime | None = None) -> list[str]:
    """The jobs a task enqueues, for the admin; a task whose function fails shows none.

    The function is called for ``at`` (default: now): one instant for many tasks, read once,
    is converted to each zone once rather than read and converted for every task.
    """
    try:
        # Only the names: checking every input of every task at start costs more than the
        # admin's list is worth.
        return [job.name for job, _ in handle.entries(at, check_inputs=False)]
    except Exception:
        return []
