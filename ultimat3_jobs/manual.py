"""Running a task by hand ("Run now"): preview what it would enqueue, enqueue it, record who.

Kept apart from the admin so a shell, a command or an API can do exactly what the button does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from . import clock, history
from .catchup import Span, span_between
from .errors import UltimateError
from .handles import TaskHandle, TaskJobResult
from .models import Occurrence, Outcome
from .store import JobStore, store_for


@dataclass(frozen=True)
class ManualRun:
    """One "Run now": the jobs it produced and the occurrence record that tells of it."""

    task: str
    results: list[TaskJobResult]
    record: Occurrence

    @property
    def created(self) -> list[TaskJobResult]:
        return [r for r in self.results if r.result.created]

    @property
    def present(self) -> list[TaskJobResult]:
        return [r for r in self.results if not r.result.created]


@dataclass(frozen=True)
class PreviewEntry:
    """One job a run would enqueue: its key (None: a new one each run) and the job holding it."""

    job: str
    key: str | None
    present_id: int | None


@dataclass(frozen=True)
class Preview:
    """What running a task now would enqueue, or why it cannot run."""

    task: str
    entries: list[PreviewEntry] = field(default_factory=list)
    problem: str = ""
    #: Paused: the schedule skips it, but running it now still enqueues its jobs.
    paused: bool = False

    @property
    def runnable(self) -> bool:
        return not self.problem


def preview(
    handle: TaskHandle | None, name: str, *, paused: bool = False, store: JobStore | None = None
) -> Preview:
    """What running ``handle`` now would enqueue, and which of those jobs already exist.

    Calls the task's function, which only returns entries: nothing is written. ``None`` is a
    task no longer declared in code; ``paused`` is said on the page, as it changes nothing.
    ``store``: where to look for the jobs (default: the default database's).
    """
    if handle is None:
        return Preview(name, problem="It is no longer declared in code, so it cannot run.")
    try:
        keys = [(job.name, job.declared_key(data)) for job, data in handle.entries()]
    except UltimateError as error:
        return Preview(name, problem=f"{error.message}. Fix: {error.fix}.", paused=paused)
    except Exception as error:  # Whatever the task's code raised: show it rather than fail.
        return Preview(name, problem=f"{type(error).__name__}: {error}", paused=paused)
    present = (store or store_for()).ids_of(key for _, key in keys if key)
    entries = [PreviewEntry(job, key, present.get(key) if key else None) for job, key in keys]
    return Preview(name, entries, paused=paused)


def settle_pause(
    handle: TaskHandle, paused_at: datetime, *, user: str, store: JobStore
) -> Span | None:
    """On resuming ``handle``: record as skipped (paused) what came due since ``paused_at``
    that no round recorded (none ran, or its leader died) and move the watermark past it, as a
    round would have done, so the resumed task replays none of it. Call it in the resume's
    transaction; the task row is locked as a round locks it.

    Only when every occurrence since the watermark came due while paused: one missed before
    the pause (no scheduler ran then either) is the catch-up policy's, and the rest with it.
    """
    now = clock.now()
    watermark = store.lock_task(handle).watermark
    if watermark is None:
        return None  # Never armed: the first round arms it at its next occurrence.
    span, _ = span_between(handle.next_after, watermark, now)
    if span is None or span.first < paused_at:
        return None
    row = history.decided(handle.name, Outcome.PAUSED, span, detail="task paused", at=now, node="")
    store.insert_record({**row, "user": user})
    store.set_watermarks({handle.name: now})
    return span


def record_run(task: str, results: list[TaskJobResult], enqueued_by: str) -> None:
    """The record of ``task.enqueue()`` called from code: a manual run by ``enqueued_by``."""
    _record(store_for(), task, results, at=clock.now(), user=enqueued_by, detail="task.enqueue()")


#: A record's ``user`` column; a job's ``enqueued_by`` may be longer, and is cut to it.
_USER_LIMIT = Occurrence._meta.get_field("user").max_length or 150


def _record(
    store: JobStore,
    task: str,
    results: list[TaskJobResult],
    *,
    at: datetime,
    user: str,
    detail: str,
) -> Occurrence:
    row = history.manual(
        task,
        [history.RecordedJob(r.job, r.result.key, r.result.created) for r in results],
        at=at,
        user=user[:_USER_LIMIT],
        detail=detail,
    )
    return store.insert_record(row)


def run_now(
    handle: TaskHandle, *, user: str, detail: str = "run now", store: JobStore | None = None
) -> ManualRun:
    """Enqueue ``handle``'s entries now, as ``admin:<user>``, and record a manual occurrence.

    Plain job keys and the watermark untouched (``TaskHandle.enqueue``): a manual run neither
    replaces nor delays the next scheduled occurrence. A job whose key already existed is
    reported as present and left as it was. The jobs and the record commit together; an
    ``UltimateError`` from the task's function propagates and nothing is written. ``store``:
    where the record goes (default: the app database's, ``db.app_database``).
    """
    store = store or store_for()
    # Outside the transaction: its function may be slow, and holds no lock meanwhile.
    entries = handle.entries()
    with transaction.atomic(using=store.using):
        at = clock.now()
        results = handle.enqueue_entries(entries, enqueued_by=f"admin:{user}")
        record = _record(store, handle.name, results, at=at, user=user, detail=detail)
    return ManualRun(task=handle.name, results=results, record=record)
