"""Backfill: enqueue every occurrence of a task in a range, under the scheduler's own keys.

Each occurrence in ``[start, end]`` (both included, walked with ``cron.between`` so the DST rule
is the scheduler's) is passed to the task's function and its jobs get the occurrence key the
scheduler would give them (``planner.plan_jobs``). A backfill and a scheduled run of the same
occurrence, or two backfills over one range, therefore share their jobs: the database keeps one.
An occurrence that already fired (a job or a record of it, ``JobStore.fired_occurrences``) is
not fired again, whatever its payload is now, unless asked to (``again``). One still ahead is
enqueued to run at its own time, and the scheduler's round for it creates nothing more. A paused
task is refused unless asked (``include_paused``), and so is an entry the round would refuse.

The write holds the task row's lock, the one a round's compare-and-set takes, so a backfill and
a round of one task decide what already fired one after the other. The watermark is never
touched; the row's ``backfilled_to`` tells the rounds up to where occurrences were enqueued
ahead of them. Kept apart from the admin and the command, which both call it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.db import DEFAULT_DB_ALIAS, transaction

from . import clock, history
from .catchup import Span
from .cron import between, wall_instant
from .errors import (
    BackfillHistoryPrunedError,
    BackfillPausedError,
    BackfillRangeError,
    BackfillTooLargeError,
    TaskEntriesError,
    UnknownTaskError,
)
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

    ``present`` maps the keys already in the job table to their job ids, and ``fired`` holds
    the occurrences that already fired, both as read at ``now``, when it was planned. Those
    are not enqueued unless ``again``; an occurrence after ``now`` is due at its own time.
    """

    task: str
    start: datetime
    end: datetime
    occurrences: list[PlannedOccurrence]
    present: dict[str, int]
    fired: frozenset[datetime]
    now: datetime
    again: bool = False

    @property
    def keys(self) -> list[str]:
        """Every job key of the range's occurrences, those that already fired included."""
        return [job.key for o in self.occurrences for job in o.jobs]

    @property
    def due(self) -> list[PlannedOccurrence]:
        """The occurrences it enqueues: all of them with ``again``, else those not yet fired."""
        if self.again:
            return list(self.occurrences)
        return [o for o in self.occurrences if o.occurrence not in self.fired]

    @property
    def already_fired(self) -> list[PlannedOccurrence]:
        """The occurrences that already fired (enqueued all the same with ``again``)."""
        return [o for o in self.occurrences if o.occurrence in self.fired]

    def withheld(self, occurrence: PlannedOccurrence) -> bool:
        """Whether ``occurrence`` is not enqueued because it already fired."""
        return not self.again and occurrence.occurrence in self.fired

    def ahead(self, occurrence: PlannedOccurrence) -> bool:
        """Whether ``occurrence`` is still to come: its jobs run at its own time."""
        return occurrence.occurrence > self.now

    @property
    def new(self) -> int:
        """The jobs it would create: those of the occurrences it enqueues whose keys are new."""
        return sum(1 for o in self.due for job in o.jobs if job.key not in self.present)

    @property
    def already_present(self) -> int:
        """The jobs whose keys are already in the job table, of any occurrence of the range."""
        return sum(1 for key in self.keys if key in self.present)

    @property
    def left_out(self) -> int:
        """Jobs of occurrences that already fired whose keys are not there (their payload
        changed since): not enqueued unless ``again``."""
        return sum(
            1
            for o in self.occurrences
            if self.withheld(o)
            for j in o.jobs
            if j.key not in self.present
        )


@dataclass(frozen=True)
class Backfill:
    """A backfill done: its plan (as read under the task row's lock), each key's ``(job id,
    created)``, and its history record. The keys of occurrences that already fired and were
    left out are not in ``enqueued``."""

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
    """An ISO 8601 date or date-time; one without an offset is read in the task's ``zone``,
    a wall time the clock skipped as the gap's end, where the schedule fires a slot in it
    (``cron.wall_instant``)."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BackfillRangeError(
            f"{what} {value!r} is not an ISO 8601 date or date-time",
            fix=f'write it like "2026-03-01", "2026-03-01T02:30" (read in {zone.key}) or '
            '"2026-03-01T02:30:00+00:00"',
            cause=value,
        ) from None
    return parsed if parsed.utcoffset() is not None else wall_instant(parsed, zone)


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
        # In UTC: a microsecond before 03:00 EDT on a spring-forward night, in the zone's own
        # wall-clock arithmetic, is 02:59:59 of a gap, read an hour later, past the slot at 03:00.
        start.astimezone(UTC) - _JUST_BEFORE,
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
    again: bool = False,
    include_paused: bool = False,
) -> BackfillPlan:
    """What a backfill would enqueue: writes nothing (``--dry-run`` and the admin's preview).

    Refused as ``run`` is (a paused task, an entry the round would refuse). Calls the task's
    function once per occurrence with that occurrence; an ``UltimateError`` from it
    (``TaskEntriesError``) propagates. ``store``: the job store of ``using``.
    """
    store = store or store_for(using)
    found = occurrences_in(handle, start, end, limit)
    _refuse_paused(handle, _paused(handle, store), include_paused)
    return _read(handle, start, end, _entries(handle, found, store), store, again=again)


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
    again: bool = False,
    include_paused: bool = False,
) -> Backfill:
    """Enqueue the occurrences of ``[start, end]`` and record who did it, in one transaction.

    Under the task row's lock (``JobStore.lock_task``), the occurrences that already fired are
    read and left out (all are enqueued with ``again``), and a key that exists (a scheduled
    run, an earlier backfill) is left as it is and counted as existing. An occurrence still
    ahead is due at its own time, and the task row notes it for the rounds (``backfilled_to``).
    A paused task is refused unless ``include_paused`` (``BackfillPausedError``), and an entry
    whose backend the round refuses is refused the same way (``TaskBackendError``). ``via``
    says where it came from ("manage.py", "the admin"). A range without occurrences writes
    nothing. ``store``: the job store of ``using``.
    """
    store = store or store_for(using)
    found = occurrences_in(handle, start, end, limit)
    # Before the task's function runs for every occurrence; again under the lock.
    _refuse_paused(handle, _paused(handle, store), include_paused)
    entries = _entries(handle, found, store)
    if not entries:
        return Backfill(_read(handle, start, end, [], store, again=again), {}, None)
    with transaction.atomic(using=store.using):
        # The lock a round of this task takes: a round writes before this backfill reads what
        # fired, or after it has written, never in between.
        locked = store.lock_task(handle)
        _refuse_paused(handle, locked.paused, include_paused)
        planned = _read(handle, start, end, entries, store, again=again)
        now = planned.now
        rows = [
            job_fields(
                job.job,
                job.row_input(),
                key=job.key,
                run_at=o.occurrence if planned.ahead(o) else None,
                queue=None,
                enqueued_by=f"backfill:{user}",
                now=now,
                task=handle.name,
                occurrence=o.occurrence,
            )
            for o in planned.due
            for job in o.jobs
        ]
        enqueued = dict(store.insert_round(rows))
        for o in planned.occurrences:
            if planned.withheld(o):
                # Left out, yet its jobs already there are reported as a scheduled run's are.
                for job in o.jobs:
                    if job.key in planned.present:
                        enqueued[job.key] = (planned.present[job.key], False)
        reached = locked.watermark
        unreached = [o.occurrence for o in planned.due if reached is None or o.occurrence > reached]
        if unreached:
            # The scheduler has yet to reach these: its round for them looks for their jobs.
            store.mark_backfilled(handle.name, max(unreached))
        record = store.insert_record(_record(planned, enqueued, at=now, user=user, via=via))
    return Backfill(planned, enqueued, record)


def _paused(handle: TaskHandle, store: JobStore) -> bool:
    state = store.task_states([handle.name]).get(handle.name)
    return state is not None and state.paused


def _refuse_paused(handle: TaskHandle, paused: bool, include_paused: bool) -> None:
    if paused and not include_paused:
        raise BackfillPausedError(
            f'task "{handle.name}" is paused: the scheduler fires none of its occurrences, and '
            "a backfill does not either unless told to",
            fix="resume the task on its page in the admin first, or pass --include-paused (in "
            'the admin: tick "Backfill although the task is paused") to enqueue them while it '
            "stays paused",
            cause=handle.name,
        )


def _entries(
    handle: TaskHandle, found: Sequence[datetime], store: JobStore
) -> list[PlannedOccurrence]:
    """The jobs of each occurrence, keyed as the scheduler keys them."""
    planned = []
    for at in found:
        try:
            entries = handle.entries(at)
        except TaskEntriesError as error:
            # Nothing retries a backfill: its fix is to run it again, not to wait for a round.
            error.fix = f'fix the function of task "{handle.name}", then run the backfill again'
            raise
        for job, _ in entries:
            # Refused as the round refuses it: a Django Task whose backend cannot take the row
            # in this transaction (an alias not in TASKS, a JobsBackend on another database).
            job.check_backend(store.using)
        planned.append(
            PlannedOccurrence(handle.name, at, False, plan_jobs(handle.name, at, entries))
        )
    return planned


def _read(
    handle: TaskHandle,
    start: datetime,
    end: datetime,
    planned: list[PlannedOccurrence],
    store: JobStore,
    *,
    again: bool,
) -> BackfillPlan:
    """``planned`` with what the database holds of it now: which occurrences fired, which
    keys exist."""
    fired: set[datetime] = set()
    if planned:
        wanted = {handle.name: [o.occurrence for o in planned]}
        fired = store.fired_occurrences(wanted).get(handle.name, set())
        if not again:
            _refuse_forgotten(handle, planned, fired, store.pruned_before(handle.name))
    present = store.ids_of(job.key for o in planned for job in o.jobs)
    return BackfillPlan(
        handle.name, start, end, planned, present, frozenset(fired), clock.now(), again
    )


def _refuse_forgotten(
    handle: TaskHandle,
    planned: Sequence[PlannedOccurrence],
    fired: Collection[datetime],
    cutoff: datetime | None,
) -> None:
    """Refuse occurrences before a prune's ``cutoff`` with no trace of firing: the jobs and
    records that would say whether they fired may be gone, and "already fired" could no
    longer be told from "never fired" (which is what a backfill fires)."""
    if cutoff is None:
        return
    forgotten = [
        o.occurrence for o in planned if o.occurrence < cutoff and o.occurrence not in fired
    ]
    if not forgotten:
        return
    zone = handle.zone
    raise BackfillHistoryPrunedError(
        f'{len(forgotten)} occurrence(s) of task "{handle.name}", from '
        f"{forgotten[0].astimezone(zone).isoformat()} to "
        f"{forgotten[-1].astimezone(zone).isoformat()}, are older than a prune's cutoff "
        f"({cutoff.astimezone(zone).isoformat()}), and the task was seen before it: whether "
        "they fired can no longer be told",
        fix='pass --again (in the admin: tick "Fire already fired occurrences again") to '
        "enqueue them whether they fired or not, or start the range at "
        f"{cutoff.astimezone(zone).isoformat()} or later",
        cause=handle.name,
    )


def _record(
    planned: BackfillPlan, enqueued: Enqueued, *, at: datetime, user: str, via: str
) -> dict[str, Any]:
    """The backfill's history record: who, the range, and every job it enqueued or found."""
    created = sum(1 for _, new in enqueued.values() if new)
    fired = len(planned.already_fired)
    if not fired:
        note = ""
    elif planned.again:
        note = f" ({fired} occurrence(s) already fired, fired again)"
    else:
        note = f" ({fired} occurrence(s) already fired, not fired again)"
    first, last = planned.occurrences[0].occurrence, planned.occurrences[-1].occurrence
    return history.backfill(
        planned.task,
        Span(first, last, len(planned.occurrences)),
        [
            history.RecordedJob(job.job.name, job.key, enqueued[job.key][1])
            for o in planned.occurrences
            for job in o.jobs
            if job.key in enqueued
        ],
        at=at,
        user=user,
        detail=f"backfill {planned.start.isoformat()} to {planned.end.isoformat()} via {via}"
        f"{note}: {created} job(s) created, {len(enqueued) - created} already present",
    )
