"""Prometheus metrics: every definition here, recorded through a few small named functions.

The scheduler and the worker call ``observe_round``, ``dispatched``, ``recorded`` and
``job_finished``; nothing else in the app touches ``prometheus_client``. Counts of jobs by status
and queue are not counted as they happen but read at scrape time with one ``GROUP BY`` query,
so every process (and the project's ``/metrics`` view) reports the same table.

Expose them with ``metrics_view`` (mounted by the project) or ``--metrics-port`` on the
long-running commands (``serve``).
"""

from __future__ import annotations

import bisect
import errno
import functools
import itertools
import logging
import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .errors import MetricsPortError
from .logs import emit, failure_fields

if TYPE_CHECKING:
    from .planner import PlannedRecord

logger = logging.getLogger("ultimat3_jobs.metrics")

PREFIX = "ultimat3_jobs"
#: Rounds are milliseconds when nothing is due and seconds for thousands of tasks.
ROUND_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: On time is within MISFIRE_GRACE (60 s by default); catch-up runs are minutes or hours late.
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
JOB_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

ROUNDS = Counter(
    f"{PREFIX}_scheduler_rounds",
    "Scheduler rounds run by this process, by whether this node led them and how they ended.",
    ["leader", "outcome"],
)
ROUND_DURATION = Histogram(
    f"{PREFIX}_scheduler_round_duration_seconds",
    "Wall time of one scheduler round, leader election included.",
    buckets=ROUND_BUCKETS,
)
LEADER = Gauge(
    f"{PREFIX}_scheduler_leader",
    "1 while this node holds the scheduler's leadership, else 0.",
    ["node"],
)
WORKER_JOBS = Counter(
    f"{PREFIX}_worker_jobs_processed",
    "Job attempts this worker finished, by outcome (succeeded, retrying, failed, lost).",
    ["name", "queue", "outcome"],
)
WORKER_FAILED = Counter(
    f"{PREFIX}_worker_jobs_failed",
    "Jobs this worker ended failed: no attempts left, or not registered.",
    ["name", "queue"],
)
JOB_DURATION = Histogram(
    f"{PREFIX}_worker_job_duration_seconds",
    "Wall time of one job attempt, recording its outcome included.",
    ["name", "queue"],
    buckets=JOB_BUCKETS,
)

RELAYED = Counter(
    f"{PREFIX}_relay_rows_sent",
    "Outbox rows this relay handed to their engine (Celery, a Django Tasks backend).",
)
RELAY_BROKER_ERRORS = Counter(
    f"{PREFIX}_relay_broker_errors",
    "Passes of this relay that found the engine's broker or backend unavailable.",
)


_OCCURRENCES = f"{PREFIX}_scheduler_occurrences_dispatched"
_JOBS = f"{PREFIX}_scheduler_jobs_dispatched"
_DROPPED = f"{PREFIX}_scheduler_occurrences_dropped"
_PAUSED = f"{PREFIX}_scheduler_occurrences_paused"


class TaskCounters(Collector):
    """The per-task counters: plain counts by label values, exposed as counters when scraped.

    A labelled ``Counter`` keeps an object with its own lock per series, about 1 KB each: at
    10,000 tasks the four series of each were 11 MB of a scheduler's memory and a fifth of a
    round's time. Counts here only grow, as a counter's must.
    """

    #: name -> (help, label names); each exposed as ``<name>_total``.
    FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
        _OCCURRENCES: (
            "Occurrences fired and committed, per task.",
            ("task",),
        ),
        _JOBS: (
            "Jobs the fired occurrences enqueued, per task (an existing key counts as not "
            "created).",
            ("task", "created"),
        ),
        _DROPPED: (
            "Occurrences the catch-up policy dropped, per task.",
            ("task",),
        ),
        _PAUSED: (
            "Occurrences skipped because their task was paused, per task.",
            ("task",),
        ),
    }

    def __init__(self) -> None:
        #: Held by ``add``; a caller adding many counts takes it once and calls ``add_locked``.
        self.lock = threading.Lock()
        #: name -> the labels after ``task`` -> task -> count. Keyed by the task's own name
        #: rather than a tuple of labels per series: 1.2 MB less at 10,000 tasks.
        self._counts: dict[str, dict[tuple[str, ...], dict[str, float]]] = {
            name: {} for name in self.FAMILIES
        }

    def add(self, name: str, labels: tuple[str, ...], amount: float) -> None:
        with self.lock:
            self.add_locked(name, labels, amount)

    def add_locked(self, name: str, labels: tuple[str, ...], amount: float) -> None:
        """Add ``amount`` to the series of ``labels``: the task first, then the others."""
        counts = self.per_task(name, labels[1:])
        counts[labels[0]] = counts.get(labels[0], 0) + amount

    def per_task(self, name: str, rest: tuple[str, ...]) -> dict[str, float]:
        """Under ``lock``: the counts by task of family ``name`` whose other labels are
        ``rest``, for a caller adding many."""
        counts = self._counts[name].get(rest)
        if counts is None:
            counts = self._counts[name][rest] = {}
        return counts

    def describe(self) -> Iterator[CounterMetricFamily]:
        for name, (help_text, labels) in self.FAMILIES.items():
            yield CounterMetricFamily(name, help_text, labels=labels)

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, (help_text, labels) in self.FAMILIES.items():
            family = CounterMetricFamily(name, help_text, labels=labels)
            with self.lock:
                series = [
                    ((task, *rest), count)
                    for rest, counts in self._counts[name].items()
                    for task, count in counts.items()
                ]
            for values, count in series:
                family.add_metric(values, count)
            yield family


TASK_COUNTERS = TaskCounters()
REGISTRY.register(TASK_COUNTERS)


class CountedHistogram(Collector):
    """A histogram whose observations may come with a count, exposed as a histogram.

    A round's occurrences of one instant are all as late as each other: 10,000 of them are
    one observation counted 10,000 times, not 10,000 passes over the buckets under a lock.
    """

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name, self.help_text = name, help_text
        self.bounds = [*buckets, math.inf]
        self.lock = threading.Lock()
        self._counts = [0] * len(self.bounds)
        self._sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        # The first bucket whose bound the value does not exceed, as prometheus_client's.
        index = bisect.bisect_left(self.bounds, value)
        with self.lock:
            self._counts[index] += count
            self._sum += value * count

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.help_text)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self.lock:
            counts, total = list(self._counts), self._sum
        cumulative = list(itertools.accumulate(counts))
        yield HistogramMetricFamily(
            self.name,
            self.help_text,
            buckets=[(floatToGoString(b), n) for b, n in zip(self.bounds, cumulative, strict=True)],
            sum_value=total,
        )


LATENESS = CountedHistogram(
    f"{PREFIX}_scheduler_dispatch_lateness_seconds",
    "From an occurrence's scheduled instant to the commit that enqueued its jobs.",
    LATENESS_BUCKETS,
)
REGISTRY.register(LATENESS)
_RECORD_COUNTERS = {"dropped": _DROPPED, "paused": _PAUSED}


def _flag(value: bool) -> str:
    return "true" if value else "false"


def observe_round(duration_s: float, *, leader: bool, node: str, failed: bool = False) -> None:
    """One scheduler round ended after ``duration_s``; ``leader`` is this node's standing now."""
    ROUNDS.labels(leader=_flag(leader), outcome="failed" if failed else "ok").inc()
    ROUND_DURATION.observe(duration_s)
    LEADER.labels(node=node).set(1 if leader else 0)


def stepped_down(node: str) -> None:
    """The node handed leadership back (a drain): it no longer leads."""
    LEADER.labels(node=node).set(0)


def dispatched(fired: Iterable[tuple[str, datetime, int, int]], committed_at: datetime) -> None:
    """A round committed these occurrences at ``committed_at``: (task, instant, its jobs, of
    which created)."""
    per_instant: dict[datetime, int] = {}
    with TASK_COUNTERS.lock:
        # The three series' dicts looked up once: per occurrence, 3.3 against 1 ms at 1,000.
        occurrences = TASK_COUNTERS.per_task(_OCCURRENCES, ())
        created_jobs = TASK_COUNTERS.per_task(_JOBS, ("true",))
        existing_jobs = TASK_COUNTERS.per_task(_JOBS, ("false",))
        for task, occurrence, jobs, created in fired:
            occurrences[task] = occurrences.get(task, 0) + 1
            if created:
                created_jobs[task] = created_jobs.get(task, 0) + created
            if jobs - created:
                existing_jobs[task] = existing_jobs.get(task, 0) + jobs - created
            per_instant[occurrence] = per_instant.get(occurrence, 0) + 1
    for occurrence, count in per_instant.items():
        LATENESS.observe(max(0.0, (committed_at - occurrence).total_seconds()), count)


def recorded(records: Iterable[PlannedRecord]) -> None:
    """Occurrences a committed round decided not to fire (dropped, skipped while paused)."""
    for record in records:
        family = _RECORD_COUNTERS.get(record.outcome)
        if family is not None:
            TASK_COUNTERS.add(family, (record.task,), record.span.count)


def job_finished(name: str, queue: str, outcome: str, duration_s: float) -> None:
    """A worker finished one attempt of job ``name`` with ``outcome`` after ``duration_s``."""
    jobs, failed, duration = _job_series(name, queue, outcome)
    jobs.inc()
    if failed is not None:
        failed.inc()
    duration.observe(duration_s)


@functools.lru_cache(maxsize=4096)
def _job_series(name: str, queue: str, outcome: str) -> tuple[Any, Any | None, Any]:
    # ``labels()`` hashes and locks on every call: a busy worker asks for the same few series
    # thousands of times a second. A series, once made, lives as long as its metric.
    return (
        WORKER_JOBS.labels(name=name, queue=queue, outcome=outcome),
        WORKER_FAILED.labels(name=name, queue=queue) if outcome == "failed" else None,
        JOB_DURATION.labels(name=name, queue=queue),
    )


def relayed(rows: int) -> None:
    """A relay pass handed ``rows`` outbox rows to their engines."""
    if rows:
        RELAYED.inc(rows)


def broker_unavailable() -> None:
    """A relay pass found the engine it sends to unavailable."""
    RELAY_BROKER_ERRORS.inc()


class JobsCollector(Collector):
    """``ultimat3_jobs_jobs{status,queue}``: the job table, one ``GROUP BY`` per scrape."""

    NAME = f"{PREFIX}_jobs"
    HELP = "Jobs in the job table, by status and queue, read when scraped."

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using

    RELAY_NAME = f"{PREFIX}_relay_rows"
    RELAY_HELP = (
        "Outbox rows by state (outbox, relayed, done, failed; stuck: relayed and not done "
        "after RELAY_STUCK_AFTER), read when scraped."
    )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Named without a query, so registering at import never touches the database.
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=["status", "queue"])
        yield GaugeMetricFamily(self.RELAY_NAME, self.RELAY_HELP, labels=["state"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from . import clock
        from .conf import get_settings
        from .models import Job, JobStatus
        from .store import store_for

        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["status", "queue"])
        connection = connections[self.using]
        opened_here = connection.connection is None
        relay = GaugeMetricFamily(self.RELAY_NAME, self.RELAY_HELP, labels=["state"])
        try:
            rows = list(
                Job.objects.using(self.using)
                .order_by()
                .values_list("status", "queue")
                .annotate(n=Count("id"))
            )
            stuck_before = clock.now() - get_settings().relay_stuck_after
            for state, count in (
                store_for(self.using).relay_counts(stuck_before=stuck_before).items()
            ):
                relay.add_metric([state], count)
        except DatabaseError as error:
            # A scrape must still answer (the process metrics are worth having); say why the
            # table is missing from it.
            emit(logger, "jobs.metrics.collect-failed", logging.WARNING, **failure_fields(error))
            rows = []
        finally:
            if opened_here and not connection.in_atomic_block:
                # The exporter's threads are not requests: nothing else would close it.
                connection.close()
        seen = {(status, queue) for status, queue, _ in rows}
        for status, queue, count in rows:
            family.add_metric([status, queue], count)
        # Every status of a queue that has jobs, at 0 when empty, so rates and alerts on
        # "failed" work without a series that appears from nowhere.
        for queue in sorted({queue for _, queue, _ in rows}):
            for status in JobStatus.values:
                if (status, queue) not in seen:
                    family.add_metric([status, queue], 0)
        yield family
        yield relay


_collector_lock = threading.Lock()
_collector: JobsCollector | None = None


def register_jobs_collector(registry: CollectorRegistry = REGISTRY) -> JobsCollector:
    """Register the job-table collector once per process (idempotent)."""
    global _collector
    with _collector_lock:
        if _collector is None:
            _collector = JobsCollector()
            registry.register(_collector)
        return _collector


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The Prometheus text exposition of ``registry``, job table included."""
    register_jobs_collector(registry)
    return generate_latest(registry)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """A Django view answering Prometheus text; mount it where your scraper looks.

    It is not protected: mount it on an internal path or behind your own access control.
    """
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)


def serve(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread (``--metrics-port``).

    Returns the server (``.shutdown()`` stops it). A port in use is a ``MetricsPortError``.
    """
    register_jobs_collector()
    try:
        server, _thread = start_http_server(port, addr=addr)
    except OSError as error:
        if error.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise
        raise MetricsPortError(
            f"cannot serve metrics on {addr}:{port}: {error.strerror}",
            fix="pass a free port to --metrics-port (or stop the process that holds this one)",
            cause=error,
        ) from error
    emit(logger, "jobs.metrics.serving", addr=addr, port=server.server_port)
    return server


__all__ = [
    "JobsCollector",
    "dispatched",
    "job_finished",
    "metrics_view",
    "observe_round",
    "recorded",
    "register_jobs_collector",
    "render",
    "serve",
    "stepped_down",
]
