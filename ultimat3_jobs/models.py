"""The tables: declared tasks with their watermarks, jobs, occurrence records, leases, nodes."""

from __future__ import annotations

from django.db import models


class Task(models.Model):
    """A task as last declared in code, and the scheduler's watermark for it.

    Declarations are mirrored here when a scheduler starts; code stays the source of truth. A
    task no longer declared keeps its row (``declared=False``) and is never dispatched.
    """

    # Unique through ``u3j_task_name`` below, without the LIKE index a unique field brings:
    # every new task row would write to it too, and nothing searches with it.
    name = models.CharField(max_length=200)
    cron = models.CharField(max_length=200)
    tz = models.CharField(max_length=64)
    catch_up = models.CharField(max_length=16, default="skip")
    max_catch_up = models.PositiveIntegerField(default=10)
    #: "allow", or "skip": an occurrence is not fired while an earlier one still has a job.
    overlap = models.CharField(max_length=16, default="allow")
    jobs = models.JSONField(default=list, blank=True)
    #: The latest occurrence dealt with (fired or deliberately dropped). Never fired again.
    last_fired_at = models.DateTimeField(null=True, blank=True)
    #: The latest occurrence a backfill enqueued before the scheduler reached it: a round that
    #: fires occurrences up to it first looks for their jobs, and creates none of its own.
    backfilled_to = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    paused_note = models.CharField(max_length=500, blank=True)
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    declared = models.BooleanField("declared in code", default=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    synced_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["name"], name="u3j_task_name")]
        permissions = [("run_task", "Can run a task now")]

    def __str__(self) -> str:
        return self.name


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: An outbox row: a Celery task or another backend's Django Task, waiting for ``run_relay``.
    OUTBOX = "outbox"
    #: An outbox row handed to its engine, not yet reported done.
    RELAYED = "relayed"


class Job(models.Model):
    """One run of a job. ``key`` is unique: enqueueing an existing key returns that job."""

    name = models.CharField(max_length=200)
    # Unique through ``u3j_job_key`` below: a unique field would add a second index for LIKE
    # that nothing searches with and that every update of a row writes to.
    key = models.CharField(max_length=255)
    input = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    queue = models.CharField(max_length=100, default="default")
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    run_at = models.DateTimeField()
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    #: The task whose occurrence produced this job, empty for a direct enqueue.
    task = models.CharField(max_length=200, blank=True)
    occurrence = models.DateTimeField(null=True, blank=True)
    catch_up = models.BooleanField(default=False)
    #: "scheduler", "code", "admin:<username>" or "backfill:<user>".
    enqueued_by = models.CharField(max_length=200, default="code")
    #: The worker node running it, so a dead worker's jobs can be found and recovered.
    worker = models.CharField(max_length=64, blank=True)
    # Django Tasks (``backends.JobsBackend``). Database defaults too, so a row inserted by raw
    # SQL that does not name these columns is a plain @job of priority 0.
    #: Claimed highest first; a @job is 0, a Django Task -100..100.
    priority = models.IntegerField(default=0, db_default=0)
    #: The ``TASKS`` alias of a Django Task's row; empty for a @job.
    backend = models.CharField(max_length=100, blank=True, default="", db_default="")
    #: A Django Task's positional arguments (``input`` holds its keyword arguments).
    args = models.JSONField(null=True, blank=True)
    #: A Django Task's JSON return value, once it succeeded.
    return_value = models.JSONField(null=True, blank=True)
    #: A failed Django Task's exception class path and traceback (``TaskError``).
    error_class = models.CharField(max_length=255, blank=True, default="", db_default="")
    traceback = models.TextField(blank=True, default="", db_default="")
    # Relaying (``relay.py``): an outbox row is run by another engine, never by our worker.
    #: "celery" or "tasks" (another Django Tasks backend); empty for a row our worker runs.
    relay = models.CharField(max_length=16, blank=True, default="", db_default="")
    #: When it was last handed to its engine, and the id the engine gave it.
    relayed_at = models.DateTimeField(null=True, blank=True)
    engine_id = models.CharField(max_length=255, blank=True, default="", db_default="")
    #: When the engine reported it done (an ``ExactlyOnceTask`` in its own transaction).
    done_at = models.DateTimeField(null=True, blank=True)
    #: The W3C ``traceparent`` its run continues (``tracing.py``): the span of the occurrence
    #: that fired it, or of the code that enqueued it; empty while tracing is off.
    trace_context = models.TextField(blank=True, default="", db_default="")
    #: When a relay first found its Celery task or Django Task unknown: the row waits
    #: ``RELAY_UNKNOWN_TASK_GRACE`` from then for a relay that knows it (a rolling deploy).
    target_unknown_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The claim's order (priority, then due time, then id) over queued rows only: it
            # stays small and flat however much finished history the table keeps, and a finish
            # has one index less to update.
            models.Index(
                models.F("priority").desc(),
                "run_at",
                "id",
                condition=models.Q(status="queued"),
                name="u3j_job_ready",
            ),
            # The same behind the queue's name, for a worker of given queues: on the ready
            # index alone, its claim read every due row of the other queues first. Its
            # predicate is the status as a range of one value, which that claim matches and
            # which does not imply the ready index's (``store/sql.py``).
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                condition=models.Q(status__gte="queued", status__lte="queued"),
                name="u3j_job_queue_ready",
            ),
            # The running rows by worker: finishes, recovery, release. A status index over
            # every row would take an entry at each claim and each finish, and its scan
            # through the entries of finished rows cost a busy worker more than the jobs.
            models.Index(
                fields=["worker"], condition=models.Q(status="running"), name="u3j_job_running"
            ),
            # A task's jobs: its admin list, the overlap check of its live occurrences, and the
            # jobs of one occurrence, which a Sentry check-in closes once they have all ended.
            models.Index(fields=["task", "occurrence"], name="u3j_job_task_occurrence"),
            # Jobs that ended failed or cancelled, newest first: the admin's lists of them and
            # their counts, which would otherwise walk every finished job. Only such rows enter.
            models.Index(
                fields=["status", "-id"],
                condition=models.Q(status__in=["failed", "cancelled"]),
                name="u3j_job_failed",
            ),
            # The relay's claim: outbox rows, oldest first, and relayed ones to resend.
            models.Index(
                "status",
                "run_at",
                "id",
                condition=models.Q(status__in=["outbox", "relayed"]),
                name="u3j_job_outbox",
            ),
        ]
        constraints = [models.UniqueConstraint(fields=["key"], name="u3j_job_key")]

    def __str__(self) -> str:
        return f"{self.name} [{self.key}]"


class Outcome(models.TextChoices):
    FIRED = "fired"
    DROPPED = "dropped"
    PAUSED = "paused"
    MANUAL = "manual"
    #: Not fired: a job of an earlier occurrence of the task was not done yet.
    OVERLAP = "overlap"
    BACKFILL = "backfill"
    #: A prune, recorded under the app's prune task: ``occurrence`` is its cutoff, before which
    #: the jobs and records that said whether an occurrence fired may be gone.
    PRUNED = "pruned"


class Occurrence(models.Model):
    """What the scheduler decided about an occurrence, or a run of consecutive ones.

    A long outage drops many occurrences at once; they are one record with ``count`` and the
    range ``occurrence``..``last_occurrence`` rather than a row each.
    """

    task = models.CharField(max_length=200)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    occurrence = models.DateTimeField(null=True, blank=True)
    last_occurrence = models.DateTimeField(null=True, blank=True)
    count = models.PositiveIntegerField(default=1)
    catch_up = models.BooleanField(default=False)
    #: [{"job": name, "key": key, "created": bool}, ...]
    jobs = models.JSONField(default=list, blank=True)
    recorded_at = models.DateTimeField()
    node = models.CharField(max_length=64, blank=True)
    user = models.CharField(max_length=150, blank=True)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-recorded_at", "-id"]
        indexes = [
            models.Index(fields=["task", "-recorded_at"], name="u3j_occ_task"),
            # The newest records first, whatever the task: the admin's history list, the
            # lateness of jobs_status, the prune, without reading it all.
            models.Index(fields=["-recorded_at"], name="u3j_occ_recorded"),
            # The same for the few records that are not of a fired occurrence (dropped,
            # paused, manual, overlap, backfill): the history list filtered by one of them
            # and its count. A fired occurrence's record writes nothing to it.
            models.Index(
                fields=["-recorded_at"],
                condition=~models.Q(outcome="fired"),
                name="u3j_occ_unfired",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task} {self.outcome} {self.occurrence}"


class CheckIn(models.Model):
    """The closing Sentry check-in of a monitored occurrence (``checkins.py``).

    Written by whichever process saw the occurrence's last job end; its unique key lets that
    process alone send the ``ok`` or ``error``, however many finish the last jobs at once.
    """

    task = models.CharField(max_length=200)
    occurrence = models.DateTimeField()
    #: "ok" (every job succeeded) or "error" (one failed).
    status = models.CharField(max_length=8)
    #: The occurrence's first job created and last job finished: the run Sentry is told of.
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "occurrence"], name="u3j_checkin_occurrence")
        ]

    def __str__(self) -> str:
        return f"{self.task} {self.occurrence} {self.status}"


class Lease(models.Model):
    """A leader lease. Expiry is judged by the database clock, never a node's."""

    name = models.CharField(max_length=100, primary_key=True)
    owner = models.CharField(max_length=64, blank=True)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} -> {self.owner or '-'}"


class Node(models.Model):
    """A running scheduler or worker process, as its heartbeat last described it."""

    node_id = models.CharField(max_length=64, primary_key=True)
    role = models.CharField(max_length=16)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    leader = models.CharField(max_length=16, blank=True)
    is_leader = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    last_round_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    clock_skew_ms = models.BigIntegerField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return f"{self.role} {self.host}:{self.pid}"


class RunToken(models.Model):
    """A "Run now" confirmation form already submitted, so submitting it again runs nothing.

    Inserted before the run: the primary key makes a second, concurrent submit of the same
    form fail to insert. Rows older than the token's lifetime are deleted as new ones come.
    """

    nonce = models.CharField(max_length=64, primary_key=True)
    used_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.nonce
