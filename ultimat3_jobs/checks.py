"""``manage.py check`` messages for what only settings and the database can reveal.

Each hint is the ``fix`` of the matching error, so the wording is the same everywhere.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from django.core import checks
from django.db import DatabaseError, connections, router

from . import clock
from .conf import DEFAULTS, default_leader, get_settings, stale_after_problem
from .errors import ConfigurationError
from .leaders import leader_problem

REAL_TIME_DST_FIX = (
    "remove dst_gap/dst_repeat from the @task: a real-time schedule already fires at every "
    "real instant whose local time matches; or give it a fixed hour field to make it wall-clock"
)


#: The database the running command of the app works on (its ``--database``): its checks
#: judge that one, not "default" (a project may keep the job tables elsewhere).
command_database: ContextVar[str | None] = ContextVar("command_database", default=None)


def judged_databases(named: Sequence[str] | None) -> list[str]:
    """The databases the leader and the stored tasks are judged on: those ``check --database``
    (or ``migrate``'s target) names that may hold the app's tables, else the one the running
    command works on, else where the app writes its tasks. A ``migrate`` of the project's
    own database, the app routed elsewhere (``DATABASE_ROUTERS``), judges the app's."""
    from .models import Task

    if named:
        held = [
            alias
            for alias in named
            if alias in connections.databases and router.allow_migrate_model(alias, Task)
        ]
        if held or not any(alias in connections.databases for alias in named):
            return held
        return [router.db_for_write(Task)]
    own = command_database.get()
    if own is not None and own in connections.databases:
        return [own]
    return [router.db_for_write(Task)]


@checks.register()
def check_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    try:
        config = get_settings()
    except ConfigurationError as error:
        return [checks.Error(error.message, hint=error.fix, id="ultimat3_jobs.E002")]
    messages: list[checks.CheckMessage] = []
    leaders = set()
    for alias in judged_databases(kwargs.get("databases")):
        vendor = connections[alias].vendor
        leader = config.leader or default_leader(vendor)
        leaders.add(leader)
        problem = leader_problem(leader, vendor)
        if problem is not None:
            message = f'{problem.message} (DATABASES["{alias}"])'
            messages.append(checks.Error(message, hint=problem.fix, id="ultimat3_jobs.E001"))
    # The values a hint suggests pass the check they come from, whatever the tick.
    tick = config.tick_interval.total_seconds()
    # A loop runs a round at least once a heartbeat interval, whatever its tick.
    gap = min(config.tick_interval, config.heartbeat_interval)
    gap_named = (
        f"HEARTBEAT_INTERVAL ({gap.total_seconds():g}s), the longest gap between rounds"
        if config.heartbeat_interval < config.tick_interval
        else f"TICK_INTERVAL ({tick:g}s)"
    )
    if config.lease_ttl <= gap and "lease" in leaders:
        messages.append(
            checks.Error(
                f"LEASE_TTL ({config.lease_ttl.total_seconds():g}s) is not longer than "
                f"{gap_named}: the lease would expire between two renewals and "
                "leadership would flap",
                hint='set ULTIMAT3_JOBS["LEASE_TTL"] to several tick intervals, '
                f"e.g. {max(10.0, 3 * gap.total_seconds()):g}",
                id="ultimat3_jobs.E003",
            )
        )
    if config.misfire_grace < config.tick_interval:
        messages.append(
            checks.Warning(
                f"MISFIRE_GRACE ({config.misfire_grace.total_seconds():g}s) is shorter than "
                f"TICK_INTERVAL ({config.tick_interval.total_seconds():g}s): on-time "
                "occurrences would count as missed and skip-policy tasks would never fire",
                hint='set ULTIMAT3_JOBS["MISFIRE_GRACE"] to at least the tick interval, '
                f"e.g. {max(60.0, 2 * tick):g}",
                id="ultimat3_jobs.W001",
            )
        )
    if config.stale_round_warning <= gap:
        messages.append(
            checks.Warning(
                f"STALE_ROUND_WARNING ({config.stale_round_warning.total_seconds():g}s) is not "
                f"longer than {gap_named}: the admin and jobs_status would warn "
                "that no round ran between every two rounds",
                hint='set ULTIMAT3_JOBS["STALE_ROUND_WARNING"] to several tick intervals, '
                f"e.g. {max(60.0, 3 * gap.total_seconds()):g}",
                id="ultimat3_jobs.W013",
            )
        )
    stale = stale_after_problem(config.worker_stale_after, config.heartbeat_interval)
    if stale is not None:
        messages.append(checks.Error(stale.message, hint=stale.fix, id="ultimat3_jobs.E004"))
    for key in config.unknown:
        messages.append(
            checks.Warning(
                f'ULTIMAT3_JOBS has an unknown key "{key}", which is ignored',
                hint=f"remove it or use one of: {', '.join(sorted(DEFAULTS))}",
                id="ultimat3_jobs.W002",
            )
        )
    return messages


#: Past this many, the tasks no longer declared are one warning rather than one each: a
#: project that drops a generated family of tasks would otherwise print thousands of lines at
#: every command's start.
REMOVED_TASKS_LISTED = 10


@checks.register()
def check_removed_tasks(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from .models import Task
    from .registry import registry

    declared = {handle.name for handle in registry.tasks()}
    stored: set[str] = set()
    for alias in judged_databases(kwargs.get("databases")):
        # Not migrated yet, or no database access here: nothing to compare.
        with contextlib.suppress(DatabaseError, RuntimeError):
            stored.update(Task.objects.using(alias).values_list("name", flat=True))
    removed = sorted(stored - declared)
    if len(removed) > REMOVED_TASKS_LISTED:
        named = ", ".join(f'"{name}"' for name in removed[:REMOVED_TASKS_LISTED])
        return [
            checks.Warning(
                f"{len(removed):,} tasks are in the database but no longer declared in code; "
                f"they are never dispatched: {named} and {len(removed) - REMOVED_TASKS_LISTED:,} "
                "more",
                hint="restore their @task declarations, or delete them in the admin (Tasks, "
                'filter "In code: No", then the action "Delete selected tasks") if they are gone '
                "for good (their occurrence records stay until pruned)",
                id="ultimat3_jobs.W003",
            )
        ]
    return [
        checks.Warning(
            f'task "{name}" is in the database but no longer declared in code; it is never '
            "dispatched",
            hint=f'restore its @task declaration, or delete it in the admin if "{name}" is gone '
            "for good (its occurrence records stay until pruned)",
            id="ultimat3_jobs.W003",
        )
        for name in removed
    ]


@checks.register()
def check_dst_options(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from .registry import registry

    return [
        checks.Warning(
            f'task "{handle.name}" sets dst_gap="{handle.dst_gap}" / '
            f'dst_repeat="{handle.dst_repeat}", which have no effect: its hour field '
            f'("{handle.cron}") starts with "*", so it is a real-time schedule',
            hint=REAL_TIME_DST_FIX,
            id="ultimat3_jobs.W010",
        )
        for handle in registry.tasks()
        if not handle.schedule.wall_clock
        and (handle.dst_gap, handle.dst_repeat) != ("end-of-gap", "first")
    ]


SENTRY_MISSING_FIX = (
    "pip install 'ultimat3-jobs[sentry]' and call sentry_sdk.init(dsn=...) in settings; or "
    'set ULTIMAT3_JOBS["SENTRY_CRONS"] = False and drop monitor= from the @task declarations'
)
SUB_MINUTE_FIX = (
    "pass monitor=False to these tasks to say so, or give a six-field cron a single seconds "
    "value (0 */5 * * * *): Sentry's schedules count in minutes"
)


@checks.register()
def check_monitors(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Monitored tasks need sentry-sdk; ``SENTRY_CRONS`` leaves out what Sentry cannot follow."""
    from .checkins import sentry_installed
    from .monitors import crontab, is_monitored
    from .registry import registry

    try:
        config = get_settings()
    except ConfigurationError:
        return []  # check_settings reports it.
    tasks = registry.tasks()
    messages: list[checks.CheckMessage] = []
    monitored = [t for t in tasks if is_monitored(t.monitor, default=config.sentry_crons)]
    unfit = [t.name for t in monitored if t.monitor is None and crontab(t.schedule) is None]
    if len(monitored) > len(unfit) and not sentry_installed():
        messages.append(
            checks.Warning(
                f"{len(monitored) - len(unfit)} task(s) are Sentry Crons monitors (SENTRY_CRONS "
                "or monitor=), but sentry-sdk is not installed: no check-in is sent",
                hint=SENTRY_MISSING_FIX,
                id="ultimat3_jobs.W011",
            )
        )
    if unfit:
        messages.append(
            checks.Warning(
                f"SENTRY_CRONS leaves out {len(unfit)} task(s) that fire more than once a "
                f"minute, which Sentry cannot follow: {', '.join(unfit[:10])}"
                + (" ..." if len(unfit) > 10 else ""),
                hint=SUB_MINUTE_FIX,
                id="ultimat3_jobs.W012",
            )
        )
    return messages


@checks.register()
def check_task_backends(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Each ``JobsBackend``'s database exists, and each of its queues can be named to a worker."""
    from django.conf import settings

    from .tasks_compat import AVAILABLE

    if not AVAILABLE:
        return []  # Neither django.tasks nor the backport: no Django Task can be declared.
    from .backends import JobsBackend, database_option_fix
    from .tasks_compat import task_backends

    messages: list[checks.CheckMessage] = []
    for alias in getattr(settings, "TASKS", None) or {}:
        try:
            backend = task_backends[alias]
        except Exception:
            continue  # The framework's own checks report a backend that cannot load.
        if isinstance(backend, JobsBackend):
            messages.extend(_unservable_queues(alias, backend.queues))
        if isinstance(backend, JobsBackend) and backend.database not in settings.DATABASES:
            messages.append(
                checks.Error(
                    f'TASKS["{alias}"] keeps its tasks in database "{backend.database}", '
                    "which is not in DATABASES",
                    hint=database_option_fix(alias),
                    id="ultimat3_jobs.E005",
                )
            )
    return messages


@checks.register()
def check_scheduled_jobs(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """What each task's function schedules now, read once a task for every rule: a job its
    backend cannot take (W004), an ``ExactlyOnceTask`` that acknowledges early (W006), an
    ``overlap="skip"`` task on an engine that may never report done (W007).

    The functions run with the inputs they return left unchecked (only the jobs are looked
    at): a project of 100,000 tasks pays for one call each, not one per rule and a check of
    every input.
    """
    from .errors import UltimateError
    from .registry import registry
    from .relay_checks import acks_late_warnings, overlap_warnings
    from .tasks_compat import AVAILABLE

    # Without Django Tasks or Celery, only an overlap="skip" task's jobs are of interest.
    every_task = AVAILABLE or "celery" in sys.modules
    now = clock.now()
    # The scheduler's database: the one a round there writes its rows to.
    databases = judged_databases(kwargs.get("databases"))
    messages: list[checks.CheckMessage] = []
    celery_seen: set[str] = set()
    for handle in registry.tasks():
        if not every_task and handle.overlap != "skip":
            continue
        try:
            jobs = [job for job, _ in handle.entries(now, check_inputs=False)]
        except Exception:
            continue  # A failing function is the scheduler's to report, every round.
        seen: set[str] = set()
        for job in jobs:
            for database in databases:
                try:
                    job.check_backend(database)
                except UltimateError as error:
                    if error.message not in seen:
                        seen.add(error.message)
                        messages.append(
                            checks.Warning(error.message, hint=error.fix, id="ultimat3_jobs.W004")
                        )
        messages.extend(acks_late_warnings(handle, jobs, celery_seen))
        messages.extend(overlap_warnings(handle, jobs))
    return messages


@checks.register()
def check_queue_names(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The default queue and each ``@job``'s: one that no ``run_worker --queues`` value can
    name is run only by a worker serving every queue."""
    from .registry import registry

    try:
        default = get_settings().default_queue
    except ConfigurationError:
        return []  # check_settings reports it.
    messages: list[checks.CheckMessage] = []
    if not _nameable_queue(default):
        messages.append(
            checks.Warning(
                f'ULTIMAT3_JOBS["DEFAULT_QUEUE"] is {default!r}, which no run_worker --queues '
                "option can name: only a worker serving every queue runs the jobs that declare "
                "no queue",
                hint='set ULTIMAT3_JOBS["DEFAULT_QUEUE"] to a name without commas or '
                'surrounding spaces, e.g. "default"',
                id="ultimat3_jobs.W014",
            )
        )
    for job in registry.jobs():
        if job.queue is not None and not _nameable_queue(job.queue):
            messages.append(
                checks.Warning(
                    f'job "{job.name}" has queue {job.queue!r}, which no run_worker --queues '
                    "option can name: only a worker serving every queue runs it",
                    hint=f'rename the queue in @job(queue=...) of "{job.name}" to a name '
                    'without commas or surrounding spaces, e.g. "emails"',
                    id="ultimat3_jobs.W014",
                )
            )
    return messages


def _nameable_queue(queue: str) -> bool:
    """Whether a ``run_worker --queues`` value can name ``queue`` (it splits on commas and
    strips)."""
    from .management.arguments import queue_names

    try:
        return queue_names(queue) == [queue]
    except Exception:
        return False


def _unservable_queues(alias: str, queues: set[str]) -> list[checks.CheckMessage]:
    """Queues that no ``run_worker --queues`` value can name."""
    messages: list[checks.CheckMessage] = []
    for queue in sorted(queues):
        if not _nameable_queue(queue):
            messages.append(
                checks.Warning(
                    f'TASKS["{alias}"]["QUEUES"] has {queue!r}, which no run_worker --queues '
                    "option can name: only a worker serving every queue runs its tasks",
                    hint=f'rename the queue in TASKS["{alias}"]["QUEUES"] and in its tasks\' '
                    "queue_name to a name without commas or surrounding spaces, e.g. "
                    '"emails"',
                    id="ultimat3_jobs.W005",
                )
            )
    return messages
