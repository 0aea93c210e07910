"""The job store through Django's ORM: every database Django supports (SQLite, the default).

``PostgresStore`` (``postgres.py``) replaces what PostgreSQL does in fewer statements or round
trips; what both do alike is written here once. Every transition of a claimed job is
conditional on the row still being the claimer's, so a worker that lost a job (recovered by
another, cancelled) can never overwrite it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DataError, IntegrityError, connections, transaction
from django.db.models import (
    BooleanField,
    Case,
    Count,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Concat, Greatest, Now

from .. import clock, history, tracing
from ..conf import MAX_RETENTION_DAYS, get_settings
from ..errors import ResultUnstorableError, TaskSyncError, WorkerLostError, class_path
from ..inputs import check_key, check_run_at, occurrence_prefix, relayed_result
from ..models import CheckIn, Job, JobStatus, Node, Occurrence, Outcome, Task
from ..retries import bounded, storable
from .columns import (
    CLAIMED_COLUMNS,
    DECLARED,
    build_job,
    declaration,
    declared,
    job_fields,
    job_names,
    scheduled_fields,
    wake_payload,
)
from .values import (
    BUSY,
    CANCELLABLE,
    FINISHED,
    UNSUCCESSFUL,
    ClaimedJob,
    ClosedOccurrence,
    DecidedRecord,
    Enqueued,
    EnqueueResult,
    Finish,
    FiredOccurrence,
    LockedTask,
    Progress,
    Recovered,
    Rows,
    Swapped,
    Synced,
    TaskState,
)

if TYPE_CHECKING:
    from ..handles import JobHandle, TaskHandle

#: Orphaned jobs recovered per pass; the rest wait for the next pass.
RECOVER_BATCH = 1000
#: Past this many names, ``task_states`` reads every row: a long IN list costs more to build
#: and plan than reading every row does.
EVERY_TASK_FROM = 500
#: Task rows a sync reads at a time (``_every_declaration``).
DECLARATIONS_READ = 20_000

#: Task rows a sync's ``UPDATE`` names at most (``_update_declarations``): below the bound
#: on parameters of the oldest SQLite.
DECLARATIONS_UPDATED = 500

#: The latest prune jobs ``pruned_before`` reads, of those still in the table.
PRUNE_JOBS_READ = 30

# Where ``_declarations`` puts each column after the name and the declaration.
DECLARED_AT = 1 + len(DECLARED)
HAS_JOBS_AT = DECLARED_AT + 1
WATERMARK_AT = DECLARED_AT + 2
PAUSED_AT = DECLARED_AT + 3


def shared_states(rows: Iterable[tuple[str, datetime | None, bool]]) -> dict[str, TaskState]:
    """Task states by name from (name, watermark, paused) rows, one record per watermark and
    pause, shared (it is never changed): tasks that fire together share their watermark, and
    a record each is memory a round holds for every task."""
    shared: dict[tuple[datetime | None, bool], TaskState] = {}
    states = {}
    for name, watermark, paused in rows:
        state = shared.get((watermark, paused))
        if state is None:
            state = shared[watermark, paused] = TaskState(watermark, paused)
        states[name] = state
    return states


def _as_read(watermark: datetime | None) -> datetime | None:
    return watermark


def _schedule_changed(row: Sequence[Any], handle: TaskHandle) -> bool:
    """Whether the stored ``row`` (as ``_declarations`` reads it) fires on other instants than
    ``handle`` declares, or was not declared until now. Its watermark then says nothing of the
    schedule it has now: kept, it would fire that schedule's past instants since the last
    firing (the old schedule ran then), or nothing until the old one's first instant (a task
    armed for next month)."""
    return not row[DECLARED_AT] or (row[1], row[2]) != (handle.cron, handle.tz)


@dataclass(frozen=True, slots=True)
class _SyncRead:
    """What ``PortableStore._sync`` read and did: every row's state, by name; the rows still
    marked declared whose task no longer is; whether it added a row (which it did not read)."""

    states: dict[str, TaskState]
    gone: list[str]
    added: bool


#: The tables a migrated database has, which every command looks for first.
APP_TABLES = (Task._meta.db_table, Job._meta.db_table)


class PortableStore:
    """The job store of the database ``using``, through the ORM (see ``JobStore``)."""

    #: No NOTIFY here: workers and relays poll.
    notifies = False

    def __init__(self, using: str) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.using}>"

    def _jobs(self) -> QuerySet[Job]:
        return Job.objects.using(self.using)

    def _notify(self, payloads: Iterable[str]) -> None:
        """Wake the workers of these queues (or the relays) at commit; here, nobody listens."""

    def can_stream(self) -> bool:
        return False

    def missing_tables(self) -> list[str]:
        present = set(connections[self.using].introspection.table_names())
        return [table for table in APP_TABLES if table not in present]

    # -- new jobs ---------------------------------------------------------------------------------

    def enqueue(
        self,
        handle: JobHandle,
        data: dict[str, Any],
        *,
        key: str,
        run_at: datetime | None = None,
        queue: str | None = None,
        enqueued_by: str = "code",
        task: str = "",
    ) -> EnqueueResult:
        check_key(handle.name, key)
        check_run_at(handle.name, run_at)
        job = build_job(
            handle,
            data,
            key=key,
            run_at=run_at,
            queue=queue,
            enqueued_by=enqueued_by,
            now=clock.now(),
            task=task,
            trace_context=tracing.caller_context(),
        )
        try:
            with transaction.atomic(using=self.using):
                job.save(force_insert=True, using=self.using)
                self._notify([wake_payload(job.queue, job.relay)])
        except IntegrityError:
            existing = self._jobs().filter(key=key).values_list("pk", flat=True).first()
            if existing is None:
                raise
            return EnqueueResult(created=False, job_id=existing, key=key)
        return EnqueueResult(created=True, job_id=job.pk, key=key)

    def enqueue_task(
        self,
        handle: JobHandle,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        run_at: datetime | None,
    ) -> Job:
        job = Job(**self._task_fields(handle, kwargs, run_at=run_at))
        job.args = args
        job.save(force_insert=True, using=self.using)
        self._notify([job.queue])
        return job

    def _task_fields(
        self, handle: JobHandle, kwargs: dict[str, Any], *, run_at: datetime | None
    ) -> dict[str, Any]:
        # A fresh key: the framework has no idempotency key, so every enqueue is a run.
        key = f"{handle.name}:{uuid.uuid4().hex}"[-255:]
        return job_fields(
            handle,
            kwargs,
            key=key,
            run_at=run_at,
            queue=None,
            enqueued_by="code",
            now=clock.now(),
            trace_context=tracing.caller_context(),
        )

    def insert_round(self, rows: Rows) -> Enqueued:
        if not len(rows):
            return {}
        jobs = [Job(**row) for row in rows]
        enqueued = self.insert_many(jobs)
        self._notify({wake_payload(job.queue, job.relay) for job in jobs})
        return enqueued

    def insert_reporting(self, rows: Sequence[dict[str, Any]]) -> Enqueued:
        return self.insert_round(rows)

    def insert_streamed(
        self, fired: Iterable[FiredOccurrence], expected: int, *, now: datetime
    ) -> Enqueued | None:
        # The rows are made once every occurrence is read: nothing is written meanwhile.
        config = get_settings()
        rows = [
            scheduled_fields(
                f,
                p,
                json.loads(p.data) if isinstance(p.data, str) else p.data,
                now=now,
                config=config,
            )
            for f in fired
            for p in f.jobs
        ]
        return self.insert_round(rows)

    def insert_many(self, jobs: Sequence[Job]) -> Enqueued:
        """Insert unsaved ``jobs``, skipping keys that exist; ``{key: (id, created)}``.

        Three statements whatever the count: the keys already there, one insert with ON
        CONFLICT DO NOTHING, the ids. Wakes nobody: ``insert_round`` does.
        """
        if not jobs:
            return {}
        keys = [job.key for job in jobs]
        rows = self._jobs()
        before = set(rows.filter(key__in=keys).values_list("key", flat=True))
        rows.bulk_create(jobs, ignore_conflicts=True)
        ids = dict(rows.filter(key__in=keys).values_list("key", "pk"))
        return {key: (ids[key], key not in before) for key in keys if key in ids}

    # -- reads ------------------------------------------------------------------------------------

    def read_task(self, job_id: int, *, backend: str) -> Job | None:
        return self._jobs().filter(pk=job_id, backend=backend).first()

    def ids_of(self, keys: Iterable[str]) -> dict[str, int]:
        wanted = [key for key in keys if key]
        if not wanted:
            return {}
        return dict(self._jobs().filter(key__in=wanted).values_list("key", "pk"))

    def busy_occurrences(self, tasks: Iterable[str]) -> dict[str, datetime]:
        names = sorted(set(tasks))
        if not names:
            return {}
        return self._busy_occurrences(names)

    def _busy_occurrences(self, names: list[str]) -> dict[str, datetime]:
        rows = (
            self._jobs()
            .filter(
                task__in=names,
                status__in=BUSY,
                occurrence__isnull=False,
            )
            .values("task")
            .annotate(earliest=Min("occurrence"))
            .order_by()
        )
        return {row["task"]: row["earliest"] for row in rows}

    def fired_occurrences(
        self, wanted: Mapping[str, Collection[datetime]]
    ) -> dict[str, set[datetime]]:
        # Each task's span is read, then matched to the instants asked: an IN list of a
        # hundred thousand instants is more than some databases take in one statement.
        asked = {task: {at: at for at in instants} for task, instants in wanted.items() if instants}
        if not asked:
            return {}
        found: dict[str, set[datetime]] = {task: set() for task in asked}

        def within(first: str, last: str) -> Q:
            spans = Q()
            for task, instants in asked.items():
                spans |= Q(task=task, **{f"{first}__gte": min(instants)}) & Q(
                    **{f"{last}__lte": max(instants)}
                )
            return spans

        def add(task: str, at: datetime | None) -> None:
            mine = asked.get(task)
            if mine is not None and at is not None and at in mine:
                found[task].add(mine[at])

        jobs = self._jobs().filter(within("occurrence", "occurrence")).order_by()
        for task, at in jobs.values_list("task", "occurrence").distinct():
            add(task, at)
        records = Occurrence.objects.using(self.using).order_by()
        decided = records.filter(
            within("occurrence", "occurrence"), outcome__in=[Outcome.FIRED, Outcome.MANUAL]
        )
        for task, at in decided.values_list("task", "occurrence"):
            add(task, at)
        # A backfill's record spans its whole range; its keys name the occurrences it enqueued.
        overlapping = Q()
        for task, instants in asked.items():
            overlapping |= Q(
                task=task, occurrence__lte=max(instants), last_occurrence__gte=min(instants)
            )
        backfills = records.filter(overlapping, outcome=Outcome.BACKFILL).only("task", "jobs")
        prefixes: dict[str, dict[str, datetime]] = {}
        for record in backfills:
            task = record.task
            if task not in prefixes:
                prefixes[task] = {occurrence_prefix(task, at): at for at in asked[task]}
            named = prefixes[task]
            start = len(task) + 1
            for job in history.recorded_jobs(record):
                end = job.key.find(":", start)
                at = named.get(job.key[: end + 1]) if end > 0 else None
                if at is not None:
                    found[task].add(at)
        return found

    def recent_records(
        self, task: str, limit: int, *, jobs_per_record: int | None = None
    ) -> list[history.HistoryEntry]:
        records = list(Occurrence.objects.using(self.using).filter(task=task)[:limit])
        parsed = [(record, history.recorded_jobs(record)[:jobs_per_record]) for record in records]
        ids = self.ids_of({job.key for _, jobs in parsed for job in jobs})
        return [
            history.HistoryEntry(record, [(job, ids.get(job.key)) for job in jobs])
            for record, jobs in parsed
        ]

    # -- the worker's transitions -----------------------------------------------------------------

    def claim(
        self,
        *,
        worker: str,
        limit: int,
        now: datetime,
        queues: frozenset[str] | None = None,
        start: int | None = None,
    ) -> list[ClaimedJob]:
        return self.finish_and_claim(
            worker=worker, finishes=(), limit=limit, now=now, queues=queues, start=start
        )[1]

    def finish(self, *, worker: str, finishes: Sequence[Finish]) -> set[int]:
        return self.finish_and_claim(worker=worker, finishes=finishes, limit=0)[0]

    def finish_and_claim(
        self,
        *,
        worker: str,
        finishes: Sequence[Finish],
        limit: int,
        now: datetime | None = None,
        queues: frozenset[str] | None = None,
        start: int | None = None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        limit = max(limit, 0)
        if not finishes and not limit:
            return set(), []
        return self._finish_and_claim(worker, finishes, limit, now, queues, start)

    def _finish_and_claim(
        self,
        worker: str,
        finishes: Sequence[Finish],
        limit: int,
        now: datetime | None,
        queues: frozenset[str] | None,
        start: int | None,
    ) -> tuple[set[int], list[ClaimedJob]]:
        """``finish_and_claim`` of at least one finish or a ``limit`` above 0."""
        rows = self._jobs()
        written = set()
        for done in finishes:
            ours = rows.filter(
                pk=done.job_id, status=JobStatus.RUNNING, worker=worker, attempts=done.attempts
            )
            changes: dict[str, Any] = {
                "status": done.status,
                "finished_at": done.finished_at,
                "last_error": done.error,
            }
            if done.status == JobStatus.QUEUED:
                changes.update(run_at=done.run_at, worker="")
            if done.result is not None:
                changes.update(
                    return_value=done.result.return_value,
                    error_class=done.result.error_class,
                    traceback=done.result.traceback,
                )
            if ours.update(**changes):
                written.add(done.job_id)
        if not limit:
            return written, []
        now = now or clock.now()
        # Without SKIP LOCKED: each row is taken by a conditional update of its own, which only
        # one claimer can win, so a job is never claimed twice even by racing workers.
        due = rows.filter(status=JobStatus.QUEUED, run_at__lte=now)
        if queues is not None:
            due = due.filter(queue__in=sorted(queues))
        ids = list(due.order_by("-priority", "run_at", "pk").values_list("pk", flat=True)[:limit])
        # The first ``start`` won, in claim order, go straight to idle threads: started.
        unstarted = limit if start is None else max(start, 0)
        won: list[int] = []
        for pk in ids:
            started_at = now if len(won) < unstarted else None
            if rows.filter(pk=pk, status=JobStatus.QUEUED).update(
                status=JobStatus.RUNNING,
                attempts=F("attempts") + 1,
                started_at=started_at,
                finished_at=None,
                worker=worker,
            ):
                won.append(pk)
        claimed = (
            rows.filter(pk__in=won)
            .order_by("-priority", "run_at", "pk")
            .values_list(*CLAIMED_COLUMNS, "started_at")
        )
        # ``created_at`` (the last claimed column) only for a Django Task, whose run reads it.
        return written, [
            replace(
                ClaimedJob(*row[:-1]),
                created_at=row[-2] if row[9] else None,
                started_at=row[-1],
            )
            for row in claimed
        ]

    def mark_started(self, *, jobs: Sequence[ClaimedJob], worker: str, now: datetime) -> set[int]:
        return {job.id for job in jobs if self._attempt(job, worker).update(started_at=now)}

    def _attempt(self, job: ClaimedJob, worker: str) -> QuerySet[Job]:
        """The row of ``job``'s claim, while it is still ``worker``'s same attempt."""
        return self._jobs().filter(
            pk=job.id, status=JobStatus.RUNNING, worker=worker, attempts=job.attempts
        )

    def release(self, *, jobs: Sequence[ClaimedJob], worker: str) -> int:
        if not jobs:
            return 0
        attempt = Q()
        for job in jobs:
            attempt |= Q(pk=job.id, attempts=job.attempts)
        ours = self._jobs().filter(attempt, status=JobStatus.RUNNING, worker=worker)
        count = _release(ours)
        self._notify([job.queue for job in jobs])
        return count

    def release_unheld(self, *, worker: str, held: Iterable[int], ran: Iterable[int] = ()) -> int:
        unheld = self._jobs().filter(status=JobStatus.RUNNING, worker=worker)
        unheld = unheld.exclude(pk__in=list(held))
        ran = list(ran)
        requeued, failed = _requeue_or_fail(
            unheld.filter(pk__in=ran),
            now=clock.now(),
            note=Value(f"worker {worker} could not record how this attempt ended"),
            exhausted="; no attempts left",
            fix="the database refused or lost the worker's writes: its log names the error "
            "(its code and fix)",
        )
        return requeued + failed + _release(unheld.exclude(pk__in=ran))

    def recover(self, *, stale_after: timedelta, now: datetime) -> Recovered:
        stale_before = ExpressionWrapper(
            Now() - Value(stale_after, output_field=DurationField()), output_field=DateTimeField()
        )
        alive = Node.objects.using(self.using).filter(
            role="worker", stopped_at__isnull=True, last_seen_at__gte=stale_before
        )
        orphans = (
            self._jobs()
            .filter(status=JobStatus.RUNNING)
            .exclude(worker__in=alive.values("node_id"))
        )
        found = list(orphans.values_list("pk", flat=True)[:RECOVER_BATCH])
        if not found:
            return Recovered(0, 0)
        # Re-checked in the updates: a job finished and claimed again by a live worker since
        # the read above is no longer an orphan.
        found_orphans = orphans.filter(pk__in=found)
        # Claimed ahead and never started: its worker's death is not the job's doing.
        released = _release(found_orphans.filter(started_at__isnull=True))
        died = Concat(
            Value("worker "), F("worker"), Value(" stopped heartbeating during this attempt")
        )
        started = found_orphans.filter(started_at__isnull=False)
        exhausted = started.filter(attempts__gte=F("max_attempts"))
        failed_jobs = tuple(exhausted.values_list("name", "queue"))
        requeued, failed = _requeue_or_fail(
            started,
            now=now,
            note=died,
            exhausted=(
                "; no attempts left: its worker died during each of them (this job killed it, "
                "or in the thread pool a job running beside it)"
            ),
        )
        return Recovered(requeued, failed, tuple(found), released, failed_jobs)

    def put_off_unknown(
        self,
        job: ClaimedJob,
        *,
        worker: str,
        now: datetime,
        until: datetime,
        grace: timedelta,
        note: str,
    ) -> bool:
        waited = Q(target_unknown_since__isnull=True) | Q(target_unknown_since__gt=now - grace)
        ours = self._jobs().filter(
            waited, pk=job.id, status=JobStatus.RUNNING, worker=worker, attempts=job.attempts
        )
        return bool(
            ours.update(
                status=JobStatus.QUEUED,
                attempts=Greatest(F("attempts") - 1, 0),
                started_at=None,
                worker="",
                run_at=until,
                last_error=note,
                target_unknown_since=Coalesce(F("target_unknown_since"), Value(now)),
            )
        )

    def give_back(self, *, job_ids: Sequence[int], worker: str, now: datetime) -> None:
        if not job_ids:
            return
        ours = self._jobs().filter(pk__in=list(job_ids), status=JobStatus.RUNNING, worker=worker)
        _release(ours.filter(started_at__isnull=True))
        note = Value(f"worker {worker} stopped before this attempt finished")
        _requeue_or_fail(
            ours.filter(started_at__isnull=False),
            now=now,
            note=note,
            exhausted="; no attempts left",
        )

    def close_occurrences(
        self, job_ids: Iterable[int], *, tasks: Iterable[str]
    ) -> list[ClosedOccurrence]:
        """Per occurrence, a read of its jobs and an insert the unique key lets one caller win."""
        fired = Occurrence.objects.using(self.using).filter(
            task=OuterRef("task"),
            recorded_at__gte=OuterRef("created_at"),
            occurrence=OuterRef("occurrence"),
            outcome=Outcome.FIRED,
        )
        # The jobs of the occurrence's scheduled run (``sql.CLOSE_OCCURRENCES``).
        scheduled = Q(enqueued_by="scheduler") | Q(enqueued_by__startswith="backfill:") & Exists(
            fired
        )
        ended = (
            self._jobs()
            .filter(scheduled, pk__in=list(job_ids), task__in=list(tasks))
            .exclude(occurrence=None)
            .order_by("task", "occurrence")
            .values_list("task", "occurrence")
            .distinct()
        )
        closed = []
        for task, occurrence in ended:
            assert occurrence is not None  # Excluded above.
            summary = (
                self._jobs()
                .filter(scheduled, task=task, occurrence=occurrence)
                .aggregate(
                    live=Count("pk", filter=~Q(status__in=FINISHED)),
                    failed=Count("pk", filter=Q(status__in=UNSUCCESSFUL)),
                    started_at=Min("created_at"),
                    finished_at=Max("finished_at"),
                )
            )
            if summary["live"]:
                continue
            row = ClosedOccurrence(
                task,
                occurrence,
                "error" if summary["failed"] else "ok",
                summary["started_at"],
                summary["finished_at"] or clock.now(),
            )
            try:
                with transaction.atomic(using=self.using):
                    CheckIn.objects.using(self.using).create(
                        task=row.task,
                        occurrence=row.occurrence,
                        status=row.status,
                        started_at=row.started_at,
                        finished_at=row.finished_at,
                    )
            except IntegrityError:
                continue  # Another process closed it first, and sends its check-in.
            closed.append(row)
        return closed

    # -- the relay's outbox -----------------------------------------------------------------------

    def claim_outbox(
        self, *, limit: int, now: datetime, resend: Sequence[str], resend_before: datetime
    ) -> list[Job]:
        if limit < 1:
            return []
        # One relay at a time: SQLite's write lock serialises whole transactions.
        due = Q(status=JobStatus.OUTBOX, run_at__lte=now) | Q(
            status=JobStatus.RELAYED,
            relay__in=list(resend),
            relayed_at__lt=resend_before,
            run_at__lte=now,
        )
        return list(self._jobs().select_for_update().filter(due).order_by("run_at", "pk")[:limit])

    def record_relayed(self, *, job_id: int, engine_id: str, now: datetime) -> bool:
        rows = self._jobs().filter(pk=job_id)
        changed = rows.filter(status=JobStatus.OUTBOX).update(
            status=JobStatus.RELAYED,
            relayed_at=now,
            engine_id=engine_id,
            attempts=F("attempts") + 1,
            last_error="",
            target_unknown_since=None,
        )
        if not changed:
            changed = rows.update(relayed_at=now, engine_id=engine_id, attempts=F("attempts") + 1)
        return bool(changed)

    def relay_refused(self, *, job_id: int, now: datetime, error: str) -> bool:
        rows = self._jobs().filter(pk=job_id, status__in=[JobStatus.OUTBOX, JobStatus.RELAYED])
        return bool(rows.update(status=JobStatus.FAILED, finished_at=now, last_error=error))

    def relay_deferred(
        self, *, job_id: int, until: datetime, error: str, since: datetime | None
    ) -> bool:
        rows = self._jobs().filter(pk=job_id, status__in=[JobStatus.OUTBOX, JobStatus.RELAYED])
        changes: dict[str, Any] = {"run_at": until, "last_error": error}
        if since is not None:
            changes["target_unknown_since"] = since
        return bool(rows.update(**changes))

    def lock_relayed(self, *, job_id: int) -> Job | None:
        return self._jobs().select_for_update().filter(pk=job_id).first()

    def relayed_done(
        self,
        *,
        job_id: int,
        now: datetime,
        ok: bool = True,
        return_value: Any = None,
        error: str = "",
        engine_id: str = "",
        name: str = "",
        relay: str | None = None,
    ) -> bool:
        if ok:
            try:
                return_value = relayed_result(name or f"job {job_id}", return_value)
            except ResultUnstorableError as unstorable:
                ok, return_value, error = False, None, str(unstorable)
        else:
            return_value = None
        changes: dict[str, Any] = {
            "status": JobStatus.SUCCEEDED if ok else JobStatus.FAILED,
            "done_at": now,
            "finished_at": now,
            "return_value": return_value,
            "last_error": bounded(storable(error)),
        }
        if engine_id:
            changes["engine_id"] = engine_id
        rows = self._jobs().filter(pk=job_id, relay__gt="")
        if relay is not None:
            rows = rows.filter(relay=relay)
        return bool(rows.exclude(status__in=FINISHED).update(**changes))

    def relayed_tasks(self, *, backends: Sequence[str], after: int, limit: int) -> list[Job]:
        rows = self._jobs().filter(
            relay="tasks", status=JobStatus.RELAYED, backend__in=list(backends), pk__gt=after
        )
        if connections[self.using].features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True)
        return list(rows.order_by("pk")[:limit])

    def relay_counts(self, *, stuck_before: datetime) -> dict[str, int]:
        rows = self._jobs().exclude(relay="")
        grouped = rows.order_by().values("status").annotate(n=Count("pk"))
        by_status = {row["status"]: row["n"] for row in grouped}
        return self._relay_states(by_status, stuck_before)

    def job_counts(
        self, *, stuck_before: datetime
    ) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        # Each count reads every row of the table (README, "Figures"), so the relay's come
        # from the same read, grouped by whether a row is relayed too.
        relayed = ExpressionWrapper(~Q(relay=""), output_field=BooleanField())
        rows = (
            self._jobs()
            .order_by()
            .annotate(relayed=relayed)
            .values_list("status", "queue", "relayed")
            .annotate(n=Count("*"))
        )
        by_queue: dict[tuple[str, str], int] = {}
        by_status: dict[str, int] = {}
        for status, queue, is_relayed, count in rows:
            by_queue[status, queue] = by_queue.get((status, queue), 0) + count
            if is_relayed:
                by_status[status] = by_status.get(status, 0) + count
        return by_queue, self._relay_states(by_status, stuck_before)

    def _relay_states(self, by_status: Mapping[str, int], stuck_before: datetime) -> dict[str, int]:
        return {
            "outbox": by_status.get(JobStatus.OUTBOX, 0),
            "relayed": by_status.get(JobStatus.RELAYED, 0),
            "done": by_status.get(JobStatus.SUCCEEDED, 0),
            "failed": by_status.get(JobStatus.FAILED, 0),
            "stuck": self.stuck_relayed(before=stuck_before),
        }

    def stuck_relayed(self, *, before: datetime) -> int:
        return (
            self._jobs()
            .filter(status=JobStatus.RELAYED, relay__startswith="celery", relayed_at__lt=before)
            .count()
        )

    # -- what staff do from the admin -------------------------------------------------------------

    def retry_failed(self, jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
        failed = self._of(jobs).filter(status=JobStatus.FAILED)
        # Unordered: the model's ordering would add the id, a row per job to the DISTINCT.
        queues = list(failed.order_by().values_list("queue", "relay").distinct())
        changes: dict[str, Any] = {
            "attempts": 0,
            "run_at": now or clock.now(),
            "started_at": None,
            "finished_at": None,
            "worker": "",
        }
        count = failed.filter(relay="").update(status=JobStatus.QUEUED, **changes)
        # A relayed job goes back to the outbox, to be sent to its engine again.
        count += failed.exclude(relay="").update(
            status=JobStatus.OUTBOX,
            relayed_at=None,
            done_at=None,
            target_unknown_since=None,
            **changes,
        )
        self._notify([wake_payload(queue, relay) for queue, relay in queues])
        return count

    def cancel_queued(self, jobs: QuerySet[Job], *, now: datetime | None = None) -> int:
        return (
            self._of(jobs)
            .filter(status__in=CANCELLABLE)
            .update(status=JobStatus.CANCELLED, finished_at=now or clock.now())
        )

    def delete_finished(self, jobs: QuerySet[Job]) -> int:
        # Re-checked in the statement: a worker may have claimed one since the caller read it.
        count, _ = self._of(jobs).filter(status__in=FINISHED).delete()
        return count

    def delete_removed_tasks(self, tasks: QuerySet[Task]) -> int:
        with transaction.atomic(using=self.using):
            # Re-checked under the rows' locks: a scheduler may have declared one again since.
            removed = tasks.using(self.using).filter(declared=False)
            if not list(removed.select_for_update().values_list("pk", flat=True)):
                return 0
            count, _ = removed.delete()
        return count

    def _of(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        """``jobs`` on this store's database."""
        return jobs.using(self.using)

    # -- retention --------------------------------------------------------------------------------

    def prune(
        self,
        cutoff: datetime,
        *,
        batch_size: int,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> tuple[int, int, int]:
        # A job cancelled before it ever ran has no finished_at: its age is its creation.
        old = Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, created_at__lt=cutoff)
        jobs = self._jobs().filter(old, status__in=FINISHED)
        occurrences = Occurrence.objects.using(self.using).filter(recorded_at__lt=cutoff)
        last_fired = self._last_fired_before(cutoff)
        # A node silent for the whole retention period is long dead; its jobs were recovered.
        nodes = Node.objects.using(self.using).filter(last_seen_at__lt=cutoff)
        # A closed check-in is a record of its occurrence, counted with them.
        check_ins = CheckIn.objects.using(self.using).filter(finished_at__lt=cutoff)
        if dry_run:
            records = occurrences.count() - len(last_fired) + check_ins.count()
            return jobs.count(), records, nodes.count()
        jobs_deleted = _delete_in_batches(jobs, batch_size, progress, "finished jobs")
        return (
            jobs_deleted,
            _delete_in_batches(
                occurrences, batch_size, progress, "occurrence records", keep=last_fired
            )
            + _delete_in_batches(check_ins, batch_size, progress, "check-ins"),
            _delete_in_batches(nodes, batch_size, progress, "nodes"),
        )

    def _last_fired_before(self, cutoff: datetime) -> set[int]:
        """The ids of the tasks' last fired records, of those recorded before ``cutoff``: a prune
        keeps them, however old, so a task that fires less often than the retention period
        does not read as never fired (its last fired occurrence, in ``jobs_status``). One
        statement: a look-up of each task's newest records in their index."""
        newest = (
            Occurrence.objects.using(self.using)
            .filter(task=OuterRef("name"), outcome=Outcome.FIRED)
            .order_by("-recorded_at", "-id")
        )
        rows = (
            self._tasks()
            .annotate(
                last_id=Subquery(newest.values("id")[:1]),
                last_at=Subquery(newest.values("recorded_at")[:1]),
            )
            .filter(last_at__lt=cutoff)
            .values_list("last_id", flat=True)
        )
        return set(rows)

    # -- occurrence records -----------------------------------------------------------------------

    def write_records(
        self,
        fired: Iterable[FiredOccurrence],
        decided: Iterable[DecidedRecord],
        enqueued: Enqueued,
        *,
        at: datetime,
        node: str,
    ) -> None:
        records = [
            history.fired(
                f.task,
                f.occurrence,
                catch_up=f.catch_up,
                jobs=[history.RecordedJob(p.job.name, p.key, enqueued[p.key][1]) for p in f.jobs],
                at=at,
                node=node,
            )
            for f in fired
        ]
        records.extend(
            history.decided(r.task, r.outcome, r.span, detail=r.detail, at=at, node=node)
            for r in decided
        )
        Occurrence.objects.using(self.using).bulk_create([Occurrence(**row) for row in records])

    def insert_record(self, row: dict[str, Any]) -> Occurrence:
        return Occurrence.objects.using(self.using).create(**row)

    def pruned_before(self, task: str) -> datetime | None:
        first_seen = self._tasks().filter(name=task).values_list("first_seen_at", flat=True)
        seen = first_seen.first()
        if seen is None:
            return None  # No row: neither a round nor a backfill ever wrote of it.
        prunes = Occurrence.objects.using(self.using).filter(
            task=history.PRUNE_TASK, outcome=Outcome.PRUNED
        )
        cutoffs = [prunes.aggregate(cutoff=Max("occurrence"))["cutoff"]]
        # A prune job's row says when it ran, its input how far back (its recent rows: a
        # prune deletes the older ones with the rest).
        jobs = self._jobs().filter(name=history.PRUNE_TASK, status=JobStatus.SUCCEEDED)
        default = get_settings().retention_days
        for finished, data in jobs.order_by("-finished_at").values_list("finished_at", "input")[
            :PRUNE_JOBS_READ
        ]:
            days = data.get("days") if isinstance(data, dict) else None
            if finished is not None:
                kept = days if isinstance(days, int) and 0 < days <= MAX_RETENTION_DAYS else default
                cutoffs.append(finished - timedelta(days=kept))
        cutoff = max((at for at in cutoffs if at is not None), default=None)
        return cutoff if cutoff is not None and seen < cutoff else None

    # -- the task table ---------------------------------------------------------------------------

    def sync_tasks(self, tasks: Sequence[TaskHandle]) -> Synced:
        try:
            with transaction.atomic(using=self.using):
                read = self._sync(tasks, every=True)
                if read.gone:
                    self._tasks().filter(name__in=read.gone).update(declared=False)
            # A new row is not among the rows read: the caller then reads every state again.
            return Synced({}, None if read.added else read.states)
        except (DataError, IntegrityError):
            pass
        refused: dict[str, TaskSyncError] = {}
        with transaction.atomic(using=self.using):
            for handle in tasks:
                try:
                    with transaction.atomic(using=self.using):
                        self._sync([handle], every=False)
                except (DataError, IntegrityError) as error:
                    refused[handle.name] = TaskSyncError(
                        f'the database refused the declaration of task "{handle.name[:80]}": '
                        f"{error}".strip(),
                        fix="keep the task's name to 200 characters and max_catch_up below "
                        "2**31 (the task table's limits); the other tasks run meanwhile",
                        cause=error,
                    )
            self._mark_gone(tasks)
        return Synced(refused)

    def _tasks(self) -> QuerySet[Task]:
        return Task.objects.using(self.using)

    def _sync(self, tasks: Sequence[TaskHandle], *, every: bool) -> _SyncRead:
        """Create or update the rows of ``tasks``, reading ``every`` row or only theirs.

        The rows are compared as they are read and let go: what is kept of each is its state
        (under the name its handle holds, when declared). Declarations are compared as plain
        tuples: model instances for every row would cost most of a start with many tasks.
        """
        rows = (
            self._every_declaration(len(tasks))
            if every
            else self._declarations([handle.name for handle in tasks])
        )
        unseen = {handle.name: handle for handle in tasks}
        changed: list[TaskHandle] = []
        rearmed: set[str] = set()
        gone: list[str] = []
        instant = self._watermarks()

        def compared() -> Iterator[tuple[str, datetime | None, bool]]:
            for row in rows:
                name = row[0]
                watermark = instant(row[WATERMARK_AT])
                handle = unseen.pop(name, None)
                if handle is not None:
                    name = handle.name  # Kept rather than the row's own copy.
                    # Unchanged: a restart does not call every task's function.
                    if not (
                        row[HAS_JOBS_AT]
                        and row[DECLARED_AT]
                        and tuple(row[1:DECLARED_AT]) == declared(handle)
                    ):
                        changed.append(handle)
                    if watermark is not None and _schedule_changed(row, handle):
                        # Armed anew, as a task seen for the first time: from now, by the
                        # schedule it has now.
                        rearmed.add(name)
                        watermark = None
                elif row[DECLARED_AT]:
                    gone.append(name)
                yield name, watermark, row[PAUSED_AT]

        states = shared_states(compared())
        new = list(unseen.values())
        if new:
            self._insert_tasks(new)
        if changed:
            self._update_declarations(changed, rearmed)
        return _SyncRead(states, gone, bool(new))

    def _update_declarations(self, changed: list[TaskHandle], rearmed: set[str]) -> None:
        """Write what ``changed`` declare now on their rows, and clear the watermarks of those
        ``rearmed``: one ``UPDATE`` for the rows that take the same values, up to
        ``DECLARATIONS_UPDATED`` names each (a deploy that moves every task to one cron is a
        few statements). Not ``bulk_update``: its ``CASE`` has a branch per row for each
        column, a statement that grows with the square of the rows."""
        at = clock.now()
        alike: dict[tuple[Any, ...], list[str]] = {}
        for handle in changed:
            made = (declared(handle), tuple(job_names(handle, at)), handle.name in rearmed)
            alike.setdefault(made, []).append(handle.name)
        query = self._tasks().order_by()
        for (values, jobs, rearm), names in alike.items():
            fields: dict[str, Any] = {**dict(zip(DECLARED, values, strict=True))}
            fields.update(jobs=list(jobs), declared=True)
            if rearm:
                fields["last_fired_at"] = None
            for start in range(0, len(names), DECLARATIONS_UPDATED):
                query.filter(name__in=names[start : start + DECLARATIONS_UPDATED]).update(**fields)

    def _every_declaration(self, expected: int) -> Iterable[Sequence[Any]]:
        """Every task row as ``_declarations`` reads them, a slice at a time (``expected``:
        how many tasks are declared): with many tasks, the rows read at once were most of a
        restart's peak (README, "Figures")."""
        return self._declarations(None).iterator(chunk_size=DECLARATIONS_READ)

    def _declarations(self, names: list[str] | None) -> QuerySet[Task, tuple[Any, ...]]:
        """Task rows as (name, *DECLARED, declared, jobs or anything that is as truthy,
        watermark, paused)."""
        # Unordered: sorting every row by name is work nobody reads.
        rows = self._tasks().order_by()
        if names is not None:
            rows = rows.filter(name__in=names)
        return rows.values_list("name", *DECLARED, "declared", "jobs", "last_fired_at", "paused")

    def _watermarks(self) -> Callable[[Any], datetime | None]:
        """The aware instant of a watermark as ``_declarations`` reads it."""
        return _as_read

    def _mark_gone(self, tasks: Sequence[TaskHandle]) -> None:
        rows = self._tasks()
        names = {handle.name for handle in tasks}
        stored = rows.filter(declared=True).values_list("name", flat=True)
        rows.filter(name__in=[name for name in stored if name not in names]).update(declared=False)

    def _insert_tasks(self, handles: Sequence[TaskHandle]) -> None:
        """Rows for tasks seen for the first time; one another node just wrote is left alone."""
        at = clock.now()
        self._tasks().bulk_create(
            [
                Task(name=handle.name, jobs=job_names(handle, at), **declaration(handle))
                for handle in handles
            ],
            ignore_conflicts=True,
        )

    def task_states(self, names: Sequence[str] | None = None) -> dict[str, TaskState]:
        every = names is None or len(names) > EVERY_TASK_FROM
        found = self._every_task_state() if every else self._task_states(list(names or ()))
        if names is not None:
            wanted = set(names)
            found = (row for row in found if row[0] in wanted)
        return shared_states(found)

    def _every_task_state(self) -> Iterable[tuple[str, datetime | None, bool]]:
        return self._task_states(None)

    def _task_states(self, names: list[str] | None) -> Iterable[tuple[str, datetime | None, bool]]:
        rows = self._tasks().order_by()
        if names is not None:
            rows = rows.filter(name__in=names)
        return rows.values_list("name", "last_fired_at", "paused")

    def swap_watermarks(
        self, watermarks: Mapping[str, tuple[datetime | None, datetime]]
    ) -> Swapped:
        tasks = self._tasks()
        locked = list(
            tasks.select_for_update()
            .filter(name__in=list(watermarks))
            .only("pk", "name", "last_fired_at", "backfilled_to")
        )
        stored = {row.name: row.last_fired_at for row in locked}
        for name, (expected, _) in watermarks.items():
            if name not in stored or stored[name] != expected:
                return Swapped(moved=name)
        backfilled = {}
        for row in locked:
            expected, ahead = row.last_fired_at, row.backfilled_to
            if ahead is not None and expected is not None and ahead > expected:
                backfilled[row.name] = ahead
            row.last_fired_at = watermarks[row.name][1]
        tasks.bulk_update(locked, ["last_fired_at"])
        return Swapped(backfilled=backfilled)

    def set_watermarks(self, watermarks: Mapping[str, datetime]) -> None:
        rows = list(self._tasks().filter(name__in=list(watermarks)).only("pk", "name"))
        for row in rows:
            row.last_fired_at = watermarks[row.name]
        self._tasks().bulk_update(rows, ["last_fired_at"])

    def lock_task(self, handle: TaskHandle) -> LockedTask:
        locked = self._locked_task(handle.name)
        if locked is None:
            # Not mirrored yet (no scheduler has started since it was declared): a row to lock
            # and to mark, which the scheduler's sync then finds as it would have written it.
            self._insert_tasks([handle])
            locked = self._locked_task(handle.name)
        assert locked is not None  # Inserted, or inserted by another node meanwhile.
        return locked

    def _locked_task(self, name: str) -> LockedTask | None:
        row = (
            self._tasks()
            .select_for_update()
            .filter(name=name)
            .order_by()
            .values_list("last_fired_at", "paused", "backfilled_to")
            .first()
        )
        return None if row is None else LockedTask(*row)

    def mark_backfilled(self, task: str, through: datetime) -> None:
        earlier = Q(backfilled_to__isnull=True) | Q(backfilled_to__lt=through)
        self._tasks().filter(earlier, name=task).update(backfilled_to=through)


def _release(rows: QuerySet[Job]) -> int:
    """Send claimed ``rows`` back to the queue as they were before the claim: their attempt
    uncounted (never below 0, whatever a hand-made row holds), not started, no worker."""
    return rows.update(
        status=JobStatus.QUEUED,
        attempts=Greatest(F("attempts") - 1, 0),
        started_at=None,
        worker="",
    )


def _requeue_or_fail(
    rows: QuerySet[Job], *, now: datetime, note: Any, exhausted: str, fix: str = ""
) -> tuple[int, int]:
    """Send ``rows`` back to the queue with their attempts counted; those out of attempts fail.
    Each row's error is ``note`` (then ``exhausted`` for a failed one), ``WorkerLostError``'s
    code and ``fix`` (by default the error's).

    Returns how many were requeued and how many failed.
    """
    lost = f" [{WorkerLostError.code}]\nfix: {fix or WorkerLostError.FIX}"
    requeued = rows.filter(attempts__lt=F("max_attempts")).update(
        status=JobStatus.QUEUED,
        run_at=now,
        worker="",
        last_error=Concat(note, Value(lost)),
    )
    # A job of one attempt (every Django Task) did not "keep" doing anything: say only that.
    said = Case(
        When(max_attempts__gt=1, then=Concat(note, Value(exhausted + lost))),
        default=Concat(note, Value("; no attempts left" + lost)),
        output_field=TextField(),
    )
    # A Django Task's result shows its TaskError: the class, and what happened as its text.
    task = ~Q(backend="")
    failed = rows.filter(attempts__gte=F("max_attempts")).update(
        status=JobStatus.FAILED,
        finished_at=now,
        last_error=said,
        error_class=Case(When(task, then=Value(WORKER_LOST_CLASS)), default=F("error_class")),
        traceback=Case(When(task, then=said), default=F("traceback"), output_field=TextField()),
    )
    return requeued, failed


#: The ``TaskError`` class of a Django Task its worker never finished.
WORKER_LOST_CLASS = class_path(WorkerLostError)


def _delete_in_batches(
    rows: QuerySet[Any],
    batch_size: int,
    progress: Progress | None,
    what: str,
    *,
    keep: Collection[int] = (),
) -> int:
    """Delete ``rows`` a batch at a time, so a first prune of a large table never holds one huge
    transaction; how many went, all but those whose id is in ``keep``. ``progress`` hears of
    each batch as ``what``.

    The delete keeps the filter of ``rows``: a row that stopped matching since its id was read
    (a failed job retried, a node heard from again) is left, as PostgreSQL reads the filter
    again once the row's lock is free. Each batch starts past the last, so rows kept at low ids
    (old queued jobs) are not read again by every batch.
    """
    deleted = 0
    after: Any = None
    while True:
        batch = rows if after is None else rows.filter(pk__gt=after)
        ids = list(batch.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return deleted
        after = ids[-1]
        gone = [pk for pk in ids if pk not in keep] if keep else ids
        if not gone:
            continue
        count, _ = rows.filter(pk__in=gone).delete()
        deleted += count
        if progress is not None:
            progress(what, deleted)
