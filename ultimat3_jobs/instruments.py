"""Prometheus instruments: the counters, histograms and gauges the roles record into.

The scheduler, the worker and the relay call ``observe_round``, ``stepped_down``,
``dispatched``, ``recorded``, ``job_finished``, ``relayed`` and ``broker_unavailable``; nothing
else in the roles touches ``prometheus_client``. Every instrument registers with the process's
default registry on import. Reading them (the job-table collector, the view, the exporter) is
``metrics``'s, a surface the roles never import.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from .planner import PlannedRecord

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

    A labelled ``Counter`` keeps an object with its own lock per series: with four series per
    task, at thousands of tasks those weigh on a scheduler's memory and on every round's time.
    Counts here only grow, as a counter's must.
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
        #: rather than by a tuple of labels per series, one object fewer per task.
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
        from .conf import get_settings

        # A series per task is a series per task per scrape: at 100,000 tasks, more than some
        # Prometheus setups take from one target. Without, each family sums its tasks.
        per_task = get_settings().metrics_per_task
        for name, (help_text, labels) in self.FAMILIES.items():
            family = CounterMetricFamily(name, help_text, labels=labels if per_task else labels[1:])
            with self.lock:
                if per_task:
                    series = [
                        ((task, *rest), count)
                        for rest, counts in self._counts[name].items()
                        for task, count in counts.items()
                    ]
                else:
                    series = [
                        (rest, sum(counts.values())) for rest, counts in self._counts[name].items()
                    ]
            for values, count in series:
                family.add_metric(list(values), count)
            yield family


TASK_COUNTERS = TaskCounters()
REGISTRY.register(TASK_COUNTERS)


class CountedHistogram(Collector):
    """A histogram whose observations may come with a count, exposed as a histogram.

    A round's occurrences of one instant are all as late as each other: they are one
    observation counted that many times, not one pass over the buckets under a lock each.
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
        # The three series' dicts looked up once per round, not once per occurrence.
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


def recovered_failed(jobs: Iterable[tuple[str, str]]) -> None:
    """A worker ended failed these ``(name, queue)`` jobs of dead workers, out of attempts."""
    for name, queue in jobs:
        WORKER_FAILED.labels(name=name, queue=queue).inc()


def relayed(rows: int) -> None:
    """A relay pass handed ``rows`` outbox rows to their engines."""
    if rows:
        RELAYED.inc(rows)


def broker_unavailable() -> None:
    """A relay pass found the engine it sends to unavailable."""
    RELAY_BROKER_ERRORS.inc()


__all__ = [
    "PREFIX",
    "CountedHistogram",
    "TaskCounters",
    "broker_unavailable",
    "dispatched",
    "job_finished",
    "observe_round",
    "recorded",
    "relayed",
    "stepped_down",
]
