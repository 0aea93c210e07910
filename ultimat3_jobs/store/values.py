"""What the job store takes and returns: plain records, none of them tied to a database."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..handles import EnqueueResult
from ..models import JobStatus

if TYPE_CHECKING:
    from ..catchup import Span
    from ..handles import JobHandle

__all__ = ["EnqueueResult"]  # Declared with the handles that return it; re-exported here.

#: key -> (job id, created)
Enqueued = Mapping[str, tuple[int, bool]]
#: Told, during a long delete, what it deletes ("finished jobs", "occurrence records",
#: "check-ins", "nodes") and how many of those went so far.
Progress = Callable[[str, int], None]

#: Done with: never claimed or sent again unless retried by hand; only these are deleted.
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
#: Finished without succeeding: a monitored occurrence with one closes as an ``error``.
UNSUCCESSFUL = (JobStatus.FAILED, JobStatus.CANCELLED)
#: What Cancel cancels: not yet claimed by a worker, nor handed to an engine.
CANCELLABLE = (JobStatus.QUEUED, JobStatus.OUTBOX)
#: Not done yet, for the overlap policy: waiting, running, or with the engine it was relayed to.
BUSY = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.OUTBOX, JobStatus.RELAYED)


class Copied(Mapping[str, tuple[int, bool]]):
    """The jobs one COPY created, ``Enqueued`` without a tuple per job until one is read: a
    round's thousands of jobs hold one id each for the rest of the round."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __getitem__(self, key: str) -> tuple[int, bool]:
        return self.ids[key], True

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class Recovered:
    """How the jobs of dead workers went back: started ones requeued with their attempt counted
    (or failed, out of attempts), and claimed ones that never started released uncounted."""

    requeued: int
    failed: int
    jobs: tuple[int, ...] = ()
    released: int = 0
    #: The name and queue of each job failed (for the worker's counters).
    failed_jobs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker claimed: what running it needs, read in the claim itself.

    A plain record rather than a model instance: a busy worker claims thousands a second.
    The claim's statements return these fields, in this order (``columns.CLAIMED_COLUMNS``,
    then ``started``).
    """

    id: int
    name: str
    key: str
    input: dict[str, Any]
    queue: str
    #: This attempt's number, counted at claim time.
    attempts: int
    max_attempts: int
    run_at: datetime
    priority: int = 0
    #: The TASKS alias of a Django Task's row (run through ``backends``); empty for a @job.
    backend: str = ""
    #: The ``traceparent`` its run continues; empty while tracing is off.
    trace_context: str = ""
    #: A Django Task's positional arguments; None for a @job.
    args: list[Any] | None = None
    #: When a Django Task's row was made (its result's ``enqueued_at``); None for a @job.
    created_at: datetime | None = None
    #: When the claim marked it started: it went straight to an idle thread. None for one
    #: claimed ahead, until ``JobStore.mark_started`` says its function may run; only a
    #: started attempt is counted when its worker dies.
    started_at: datetime | None = None
    #: Why a row the claim returned cannot be read (a value written around the app: an instant
    #: past Python's years, JSON nested past its recursion limit); empty for a readable one.
    #: Such a job is failed alone, unrun, and the rest of its batch goes on.
    unreadable: str = ""


@dataclass(frozen=True, slots=True)
class StartedTask:
    """A started Django Task's row as its run and its ``TaskResult`` read it, made from its
    claim (``columns.started_task``) rather than read again: a plain record, as ``ClaimedJob``
    is, not a model instance (whose ``__init__`` and init signals cost a busy worker more than
    the run of a no-op task). The columns a result reads keep their ``Job`` names.
    """

    id: int
    name: str
    backend: str
    args: list[Any]
    input: dict[str, Any]
    queue: str
    priority: int
    attempts: int
    created_at: datetime
    started_at: datetime
    worker: str
    status: str = JobStatus.RUNNING
    finished_at: datetime | None = None
    error_class: str = ""
    traceback: str = ""
    return_value: Any = None


@dataclass(frozen=True, slots=True)
class Finish:
    """How one attempt ended, to be written by ``finish`` (or with the next claim).

    ``status`` is succeeded or failed (``finished_at`` set), or queued for a retry at
    ``run_at``. ``attempts`` names the attempt, so a stale finish never lands on a later one.
    """

    job_id: int
    attempts: int
    status: str
    finished_at: datetime | None = None
    run_at: datetime | None = None
    error: str = ""
    #: A Django Task's result columns, written with its finish; None leaves them as they are.
    result: TaskResultColumns | None = None

    @classmethod
    def succeeded(cls, job: ClaimedJob, *, now: datetime) -> Finish:
        """Running -> succeeded."""
        return cls(job.id, job.attempts, JobStatus.SUCCEEDED, finished_at=now)

    @classmethod
    def retrying(cls, job: ClaimedJob, *, run_at: datetime, error: str) -> Finish:
        """Running -> queued again at ``run_at``, keeping the error in view until the next try."""
        return cls(job.id, job.attempts, JobStatus.QUEUED, run_at=run_at, error=error)

    @classmethod
    def failed(cls, job: ClaimedJob, *, now: datetime, error: str) -> Finish:
        """Running -> failed for good."""
        return cls(job.id, job.attempts, JobStatus.FAILED, finished_at=now, error=error)


@dataclass(frozen=True, slots=True)
class TaskResultColumns:
    """What a Django Task's row keeps of how its run ended, besides its status: its JSON
    return value, or its exception's class path and traceback."""

    return_value: Any = None
    error_class: str = ""
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class ClosedOccurrence:
    """A monitored occurrence whose jobs have all ended, closed by this call alone: its
    ``ok`` or ``error`` check-in is this caller's to send."""

    task: str
    occurrence: datetime
    #: "ok" when every job succeeded, "error" when one failed or was cancelled.
    status: str
    #: Its first job created, its last job finished.
    started_at: datetime
    finished_at: datetime


@dataclass(slots=True)
class TaskState:
    """A task's row as a round reads it: its watermark and whether it is paused."""

    watermark: datetime | None
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Synced:
    """What ``JobStore.sync_tasks`` did: the declarations the database refused, and every
    stored task's state as the sync read it, for the round that follows to plan from rather
    than read every row again; None when it added a row, which that read did not see."""

    refused: Mapping[str, Exception]
    states: dict[str, TaskState] | None = None


@dataclass(frozen=True, slots=True)
class LockedTask:
    """A task's row as ``JobStore.lock_task`` read it, locked until the caller's transaction
    ends: its watermark, whether it is paused, and ``Task.backfilled_to``."""

    watermark: datetime | None
    paused: bool
    backfilled_to: datetime | None


@dataclass(frozen=True, slots=True)
class Swapped:
    """What a round's compare-and-set found (``JobStore.swap_watermarks``)."""

    #: A task that did not hold the watermark the round expected (the round then writes
    #: nothing), or None: every row held it and now holds its new one.
    moved: str | None = None
    #: Per task swapped, the latest occurrence a backfill enqueued past the watermark the round
    #: expected (``Task.backfilled_to``): the round's occurrences up to it may have fired.
    backfilled: Mapping[str, datetime] = field(default_factory=dict)


class Rows(Protocol):
    """Rows that know their count and may be made as they are read (a round's thousands need
    not all exist at once). Reading them twice makes them twice."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[dict[str, Any]]: ...


# What a round hands the store to write, as the planner makes it (``planner.PlannedOccurrence``,
# ``PlannedJob`` and ``PlannedRecord`` fit): the store reads these fields and nothing else.


class ScheduledJob(Protocol):
    """One job an occurrence enqueues: its declaration, input (or the input's JSON text) and key."""

    @property
    def job(self) -> JobHandle: ...
    @property
    def data(self) -> dict[str, Any] | str: ...
    @property
    def key(self) -> str: ...


class FiredOccurrence(Protocol):
    """An occurrence a round fires, with the jobs it enqueues."""

    @property
    def task(self) -> str: ...
    @property
    def occurrence(self) -> datetime: ...
    @property
    def catch_up(self) -> bool: ...
    @property
    def jobs(self) -> Sequence[ScheduledJob]: ...
    @property
    def trace_context(self) -> str:
        """The ``traceparent`` of the occurrence's span, for each of its jobs; "" untraced."""
        ...


class DecidedRecord(Protocol):
    """Occurrences a round decided not to fire: dropped, paused or overlapping."""

    @property
    def task(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def span(self) -> Span: ...
    @property
    def detail(self) -> str: ...
