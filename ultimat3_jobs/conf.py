"""The ``ULTIMAT3_JOBS`` settings dict: defaults, validation and one cached getter.

The getter is cleared on ``setting_changed`` so ``override_settings`` works in tests, the way
django-debug-toolbar reads its settings.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .errors import ConfigurationError
from .inputs import TIMEOUT_FIX, timeout_problem

#: Every key, its default, and what it does. The README's settings table is this dict.
DEFAULTS: dict[str, Any] = {
    # Leader election: "advisory" (PostgreSQL only), "lease" or "sole". None picks advisory on
    # PostgreSQL and lease elsewhere.
    "LEADER": None,
    # Seconds between the end of one scheduler round and the start of the next.
    "TICK_INTERVAL": 1.0,
    # An occurrence at most this many seconds old still counts as on time.
    "MISFIRE_GRACE": 60.0,
    # Seconds a lease stays valid without renewal; renewal happens every round.
    "LEASE_TTL": 10.0,
    # The advisory lock key the schedulers of one database contend for.
    "ADVISORY_LOCK_KEY": 0x756C74,
    # Warn when the local clock and the database clock differ by more than this many seconds.
    "CLOCK_SKEW_WARNING": 1.0,
    # The admin warns when no scheduler round has run for this many seconds.
    "STALE_ROUND_WARNING": 60.0,
    # Seconds between heartbeats a scheduler or worker writes to its node row.
    "HEARTBEAT_INTERVAL": 5.0,
    # Default attempts of a job that declares none.
    "MAX_ATTEMPTS": 3,
    # Queue of a job that declares none.
    "DEFAULT_QUEUE": "default",
    # Retry backoff: base ** attempts seconds, capped, with full jitter.
    "RETRY_BACKOFF_BASE": 2.0,
    "RETRY_BACKOFF_MAX": 3600.0,
    # Worker: seconds between polls when LISTEN/NOTIFY is not available or stays silent.
    "WORKER_POLL_INTERVAL": 1.0,
    # Worker: a running job whose worker has not written a heartbeat for this long is recovered.
    "WORKER_STALE_AFTER": 60.0,
    # Worker: seconds a SIGTERM drain waits for jobs in flight.
    "WORKER_DRAIN_GRACE": 30.0,
    # Worker: seconds a job may run before its attempt ends jobs.job.timeout and its slot
    # moves on; None is no limit. A job's own @job(timeout=...) wins; Django Tasks take this.
    "JOB_TIMEOUT": None,
    # Worker (thread pool): stuck threads left behind by timeouts, still running, past which
    # the worker drains and exits 0 for its supervisor to start a fresh process.
    "MAX_ABANDONED_THREADS": 8,
    # Days finished jobs and occurrence records are kept.
    "RETENTION_DAYS": 14,
    # Relay: a Celery ExactlyOnceTask handed over this many seconds ago and not done is sent
    # again (its stable task id and row lock make the copy harmless).
    "RELAY_RESEND_AFTER": 300.0,
    # Relay: the admin warns about relayed jobs not done after this many seconds.
    "RELAY_STUCK_AFTER": 900.0,
    # Relay: an outbox row whose Celery task or Django Task this relay cannot find waits this
    # many seconds for a relay that can (a rolling deploy), then fails.
    "RELAY_UNKNOWN_TASK_GRACE": 300.0,
    # Worker: a @job this worker does not declare waits this many seconds for a worker that
    # does (a rolling deploy), then fails.
    "UNKNOWN_JOB_GRACE": 300.0,
    # Sentry Crons (the `sentry` extra): every task a monitor, unless it says monitor=False.
    "SENTRY_CRONS": False,
    # Seconds late an occurrence's in_progress check-in may be before Sentry calls it missed,
    # and seconds its jobs may run before Sentry calls it timed out (Sentry counts whole
    # minutes: both are rounded up).
    "SENTRY_CHECKIN_MARGIN": 60.0,
    "SENTRY_MAX_RUNTIME": 1800.0,
    # Health probes: a scheduler whose last round is this many ticks old, or a worker or relay
    # whose last heartbeat is this many heartbeats old, is not alive.
    "HEALTH_TICKS": 3,
    # Metrics: whether each process's --metrics-port reports the job table's gauges, read at
    # every scrape (a read of every row); False leaves them to the project's /metrics view.
    "METRICS_JOB_TABLE": True,
    # Metrics: the scheduler's counters of occurrences and jobs with a series per task; False
    # sums them, without the task label (tens of thousands of tasks, tens of thousands of
    # series a scrape).
    "METRICS_PER_TASK": True,
}

LEADERS = ("advisory", "lease", "sole")


@dataclass(frozen=True)
class Settings:
    """The resolved settings. Durations are ``timedelta``; ``unknown`` lists keys we ignored."""

    leader: str | None
    tick_interval: timedelta
    misfire_grace: timedelta
    lease_ttl: timedelta
    advisory_lock_key: int
    clock_skew_warning: timedelta
    stale_round_warning: timedelta
    heartbeat_interval: timedelta
    max_attempts: int
    default_queue: str
    retry_backoff_base: float
    retry_backoff_max: timedelta
    worker_poll_interval: timedelta
    worker_stale_after: timedelta
    worker_drain_grace: timedelta
    job_timeout: float | None
    max_abandoned_threads: int
    retention_days: int
    relay_resend_after: timedelta
    relay_stuck_after: timedelta
    relay_unknown_task_grace: timedelta
    unknown_job_grace: timedelta
    sentry_crons: bool
    sentry_checkin_margin: timedelta
    sentry_max_runtime: timedelta
    health_ticks: int
    metrics_job_table: bool
    metrics_per_task: bool
    unknown: tuple[str, ...]


#: The longest of most durations: inf or 1e308 would overflow the timedelta and every use of it.
A_YEAR = (366 * 86_400, "a year")
#: Sentry's bound on a monitor's margin and maximum runtime: 40,320 minutes.
SENTRY_MINUTES = (40_320 * 60, "28 days, Sentry's bound")


def _seconds(raw: dict[str, Any], key: str, at_most: tuple[int, str] = A_YEAR) -> timedelta:
    value = raw[key]
    # A timedelta is held to the same bounds, by its seconds.
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    limit, said = at_most
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= limit
    ):
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["{key}"] is {value!r}, not a positive number of seconds '
            f"(at most {said})",
            fix=f'set ULTIMAT3_JOBS["{key}"] to a number of seconds, e.g. {DEFAULTS[key]!r}',
            cause=value,
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=float(seconds))


#: The longest retention: a century (``prune_jobs --days`` takes as much). Past about 2,700
#: centuries the cutoff date itself would overflow.
MAX_RETENTION_DAYS = 36_500


def _positive_int(raw: dict[str, Any], key: str, maximum: int = 2**31 - 1) -> int:
    value = raw[key]
    # 2**31 - 1 at most: MAX_ATTEMPTS lands in a 32-bit column of every job row.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["{key}"] is {value!r}, not a positive integer of at most {maximum:,}',
            fix=f'set ULTIMAT3_JOBS["{key}"] to a positive integer, e.g. {DEFAULTS[key]!r}',
            cause=value,
        )
    return value


def _lock_key(value: Any) -> int:
    # pg_try_advisory_lock(bigint): a float, a string or a number past 64 bits would fail there,
    # at every round, instead of here.
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["ADVISORY_LOCK_KEY"] is {value!r}, not a 64-bit signed integer',
            fix='set ULTIMAT3_JOBS["ADVISORY_LOCK_KEY"] to an integer between -2**63 and '
            f"2**63 - 1, e.g. {DEFAULTS['ADVISORY_LOCK_KEY']!r}",
            cause=value,
        )
    return value


def _flag(raw: dict[str, Any], key: str) -> bool:
    value = raw[key]
    if not isinstance(value, bool):
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["{key}"] is {value!r}, not True or False',
            fix=f'set ULTIMAT3_JOBS["{key}"] to True or False',
            cause=value,
        )
    return value


def _leader(value: Any) -> str | None:
    if value is None or value in LEADERS:
        return value
    raise ConfigurationError(
        f'ULTIMAT3_JOBS["LEADER"] is {value!r}, not one of {", ".join(LEADERS)}',
        fix='set ULTIMAT3_JOBS["LEADER"] to "advisory" (PostgreSQL), "lease" or "sole", '
        "or remove it to pick by database",
        cause=value,
    )


def _timeout(value: Any) -> float | None:
    problem = timeout_problem(value)
    if problem is not None:
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["JOB_TIMEOUT"] is {value!r}, {problem}',
            fix=f'set ULTIMAT3_JOBS["JOB_TIMEOUT"] to {TIMEOUT_FIX}',
            cause=value,
        )
    return None if value is None else float(value)


@functools.cache
def get_settings() -> Settings:
    """The app's settings, validated. Raises ``ConfigurationError`` on a bad value."""
    user = getattr(settings, "ULTIMAT3_JOBS", None) or {}
    if not isinstance(user, dict):
        raise ConfigurationError(
            f"ULTIMAT3_JOBS is a {type(user).__name__}, not a dict",
            fix="set ULTIMAT3_JOBS = {} in settings (see the README's settings table)",
        )
    raw = {**DEFAULTS, **user}
    base = raw["RETRY_BACKOFF_BASE"]
    # NaN compares false with every bound: it must be ruled out, not merely not below 1.
    if (
        isinstance(base, bool)
        or not isinstance(base, int | float)
        or not (math.isfinite(base) and base >= 1)
    ):
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["RETRY_BACKOFF_BASE"] is {base!r}, not a number >= 1',
            fix='set ULTIMAT3_JOBS["RETRY_BACKOFF_BASE"] to a number >= 1, e.g. 2',
            cause=base,
        )
    queue = raw["DEFAULT_QUEUE"]
    if not isinstance(queue, str) or not queue or len(queue) > 100 or "\x00" in queue:
        raise ConfigurationError(
            f'ULTIMAT3_JOBS["DEFAULT_QUEUE"] is {raw["DEFAULT_QUEUE"]!r}, not a queue name',
            fix='set ULTIMAT3_JOBS["DEFAULT_QUEUE"] to a non-empty string of at most 100 '
            'characters (the job table\'s limit), e.g. "default"',
        )
    return Settings(
        leader=_leader(raw["LEADER"]),
        tick_interval=_seconds(raw, "TICK_INTERVAL"),
        misfire_grace=_seconds(raw, "MISFIRE_GRACE"),
        lease_ttl=_seconds(raw, "LEASE_TTL"),
        advisory_lock_key=_lock_key(raw["ADVISORY_LOCK_KEY"]),
        clock_skew_warning=_seconds(raw, "CLOCK_SKEW_WARNING"),
        stale_round_warning=_seconds(raw, "STALE_ROUND_WARNING"),
        heartbeat_interval=_seconds(raw, "HEARTBEAT_INTERVAL"),
        max_attempts=_positive_int(raw, "MAX_ATTEMPTS"),
        default_queue=raw["DEFAULT_QUEUE"],
        retry_backoff_base=float(base),
        retry_backoff_max=_seconds(raw, "RETRY_BACKOFF_MAX"),
        worker_poll_interval=_seconds(raw, "WORKER_POLL_INTERVAL"),
        worker_stale_after=_seconds(raw, "WORKER_STALE_AFTER"),
        worker_drain_grace=_seconds(raw, "WORKER_DRAIN_GRACE"),
        job_timeout=_timeout(raw["JOB_TIMEOUT"]),
        max_abandoned_threads=_positive_int(raw, "MAX_ABANDONED_THREADS"),
        retention_days=_positive_int(raw, "RETENTION_DAYS", MAX_RETENTION_DAYS),
        relay_resend_after=_seconds(raw, "RELAY_RESEND_AFTER"),
        relay_stuck_after=_seconds(raw, "RELAY_STUCK_AFTER"),
        relay_unknown_task_grace=_seconds(raw, "RELAY_UNKNOWN_TASK_GRACE"),
        unknown_job_grace=_seconds(raw, "UNKNOWN_JOB_GRACE"),
        sentry_crons=_flag(raw, "SENTRY_CRONS"),
        sentry_checkin_margin=_seconds(raw, "SENTRY_CHECKIN_MARGIN", SENTRY_MINUTES),
        sentry_max_runtime=_seconds(raw, "SENTRY_MAX_RUNTIME", SENTRY_MINUTES),
        health_ticks=_positive_int(raw, "HEALTH_TICKS"),
        metrics_job_table=_flag(raw, "METRICS_JOB_TABLE"),
        metrics_per_task=_flag(raw, "METRICS_PER_TASK"),
        unknown=tuple(sorted(set(user) - set(DEFAULTS))),
    )


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "ULTIMAT3_JOBS":
        get_settings.cache_clear()


def default_leader(vendor: str) -> str:
    """The leader an unset ``LEADER`` means on a database of this vendor."""
    return "advisory" if vendor == "postgresql" else "lease"


def stale_after_problem(
    stale_after: timedelta, heartbeat_interval: timedelta
) -> ConfigurationError | None:
    """A worker judged dead after too few missed heartbeats would have its jobs run twice."""
    if stale_after > heartbeat_interval * 2:
        return None
    return ConfigurationError(
        f"WORKER_STALE_AFTER ({stale_after.total_seconds():g}s) is not more than "
        f"twice HEARTBEAT_INTERVAL ({heartbeat_interval.total_seconds():g}s): a live worker's "
        "jobs could be recovered and run a second time",
        fix='set ULTIMAT3_JOBS["WORKER_STALE_AFTER"] to several heartbeat intervals, '
        f"e.g. {max(60.0, 3 * heartbeat_interval.total_seconds()):g}",
    )
