"""Backfill: enqueue every occurrence of a task in a range, under the scheduler's own keys.

Each occurrence in ``[start, end]`` (both included, walked with ``cron.between`` so the DST rule
is the scheduler's) is passed to the task's function and its jobs get the occurrence key the
scheduler would give them (``planner.plan_jobs``). A backfill and a scheduled run of the same
occurrence, or two backfills over one range, therefore share their jobs: the database keeps one.
The watermark is never touched. Kept apart from the admin and the command, which both call it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.db import DEFAULT_DB_ALIAS, transaction

from . import clock, history
from .catchup import Span
from .cron import between
from .errors import BackfillRangeError, BackfillTooLargeError, UnknownTaskError
from .handles import TaskHandle
from .models import Occurrence
from .planner import PlannedOccurrence, plan_jobs
from .registry import registry
from .store import Enqueued, JobStore, store_for
from .store.columns import job_fields

#: The most occurrences one backfill enqueues unless told otherwise.
DEFAULT_LIMIT = 1000

_JUST_BEFORE = timedelta(microseconds=1)

#: A backfill range lies within ``[EARLIEST, LATEST)``: ``datetime`` ends with the years 1 and
#: 9999, and the walk that finds a range's occurrences looks up to decades past its end.
EARLIEST = datetime(2, 1, 1, tzinfo=UTC)
LATEST = datetime(9900, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill of ``task`` over ``[start, end]`` enqueues, before anything is written.

    ``present`` maps the keys already in the job table to their job ids, as read when planned.
    """

    task: str
    start: datetime
    end: datetime
    occurrences: list[PlannedOccurrence]
    present: dict[str, int]

    @property
    def keys(self) -> list[str]:
        return [job.key for o in self.occurrences for job in o.jobs]

    @property
    def new(self) -> int:
        return sum(1 for key in self.keys if key not in self.present)


@dataclass(frozen=True)
class Backfill:
    """A backfill done: its plan, each key's ``(job id, created)``, and its history record."""

    plan: BackfillPlan
    enqueued: Enqueued
    record: Occurrence | None

    @property
    def created(self) -> int:
        return sum(1 for _, created in self.enqueued.values() if created)

    @property
    def existing(self) -> int:
        return len(self.enqueued) - self.created


def find_task(name: str) -> TaskHandle:
    """The task declared as ``name``, or an error whose fix names the closest ones."""
    handle = registry.get_task(name)
    if handle is not None:
        return handle
    names = [t.name for t in registry.tasks()]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"declared: {', '.join(names) or '-'}"
    raise UnknownTaskError(
        f'no task "{name}" is declared in code',
        fix=f"pass the name of a @task ({hint}); the admin's task list shows every name",
        cause=name,
    )


def parse_instant(value: str, zone: ZoneInfo, what: str = "instant") -> datetime:
    """An ISO 8601 date or date-time; one without an offset is read in the task's ``zone``."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BackfillRangeError(
            f"{what} {value!r} is not an ISO 8601 date or date-time",
            fix=f'write it like "2026-03-01", "2026-03-01T02:30" (read in {zone.key}) or '
            '"2026-03-01T02:30:00+00:00"',
            cause=value,
        ) from None
    return parsed if parsed.utcoffset() is not None else parsed.replace(tzinfo=zone)


def occurrences_in(
    handle: TaskHandle, start: datetime, end: datetime, limit: int = DEFAULT_LIMIT
) -> list[datetime]:
    """The task's occurrences in ``[start, end]``, in order; more than ``limit`` is refused, and
    so is a range outside ``[EARLIEST, LATEST)``.

    Walks no further than ``limit + 1`` occurrences, so a year of a per-second task is refused
    at once rather than enumerated.
    """
    if start > end:
        raise BackfillRangeError(
            f"the range of {handle.name} starts at {start.isoformat()}, after its end "
            f"{end.isoformat()}",
            fix="give --start an instant at or before --end (both ends are included)",
            cause=(start, end),
        )
    if start < EARLIEST or end >= LATEST:
        raise BackfillRangeError(
            f"the range of {handle.name} from {start.isoformat()} to {end.isoformat()} reaches "
            "outside the years 2 to 9899, which a backfill can walk",
            fix="give --start and --end between 0002-01-01 and 9899-12-31",
            cause=(start, end),
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise BackfillTooLargeError(
            f"the backfill limit {limit!r} is not a positive whole number",
            fix="pass --limit 1 or more (default 1000)",
            cause=limit,
        )
    found = between(
        handle.schedule,
        handle.zone,
        start - _JUST_BEFORE,
        end,
        limit + 1,
        dst_gap=handle.dst_gap,
        dst_repeat=handle.dst_repeat,
    )
    if len(found) > limit:
        raise BackfillTooLargeError(
            f"{handle.name} has more than {limit} occurrences from {start.isoformat()} to "
            f"{end.isoformat()}",
            fix=f"narrow the range (occurrence {limit} is at "
            f"{found[limit - 1].astimezone(handle.zone).isoformat()}), or raise the limit with "
            "manage.py backfill_task --limit N if you mean to enqueue them all",
            cause=limit,
        )
    return found


def plan(
    handle: TaskHandle,
    start: datetime,
    end: datetime,
    *,
    limit: int = DEFAULT_LIMIT,
    using: str = DEFAULT_DB_ALIAS,
    store: JobStore | None = None,
) -> BackfillPlan:
    """What a backfill would enqueue: writes nothing (``--dry-run`` and the admin's preview).

    Calls the task's function once per occurrence with that occurrence; an ``UltimateError``
    from it (``TaskEntriesError``) propagates. ``store``: the job store of ``using``.
    """
    store = store or store_for(using)
    planned = [
        PlannedOccurrence(handle.name, at, False, plan_jobs(handle.name, at, handle.entries(at)))
        for at in occurrences_in(handle, start, end, limit)
    ]
    keys = [job.key for o in planned for job in o.jobs]
    return BackfillPlan(handle.name, start, end, planned, store.ids_of(keys))


def run(
    handle: TaskHandle,
    start: datetime,
    end: datetime,
    *,
    user: str,
    via: str,
    limit: int = DEFAULT_LIMIT,
    using: str = DEFAULT_DB_ALIAS,
    store: JobStore | None = None,
) -> Backfill:
    """Enqueue the occurrences of ``[start, end]`` and record who did it, in one transaction.

    Keys that exist (a scheduled run, an earlier backfill) are left as they are and counted as
    existing. ``via`` says where it came from ("manage.py", "the admin"). A range without
    occurrences writes nothing. ``store``: the job store of ``using``.
    """
    store = store or store_for(using)
    planned = plan(handle, start, end, limit=limit, using=using, store=store)
    if not planned.occurrences:
        return Backfill(planned, {}, None)
    now = clock.now()
    rows = [
        job_fields(
            job.job,
            job.row_input(),
            key=job.key,
            run_at=None,
            queue=None,
            enqueued_by=f"backfill:{user}",
            now=now,
            task=handle.name,
            occurrence=o.occurrence,
        )
        for o in planned.occurrences
        for job in o.jobs
    ]
    with transaction.atomic(using=store.using):
        enqueued = store.insert_round(rows)
        created = sum(1 for _, new in enqueued.values() if new)
        first, last = planned.occurrences[0].occurrence, planned.occurrences[-1].occurrence
        row = history.backfill(
            handle.name,
            Span(first, last, len(planned.occurrences)),
            [
                history.RecordedJob(job.job.name, job.key, enqueued[job.key][1])
                for o in planned.occurrences
                for job in o.jobs
            ],
            at=now,
            user=user,
            detail=f"backfill {start.isoformat()} to {end.isoformat()} via {via}: "
            f"{created} job(s) created, {len(enqueued) - created} already present",
        )
        record = store.insert_record(row)
    return Backfill(planned, enqueued, record)
