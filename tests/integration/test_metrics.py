"""Prometheus metrics against a real database: names, and the values rounds and jobs leave."""

from __future__ import annotations

import socket
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from ultimat3_jobs import clock, instruments, metrics
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.errors import MetricsAddressError, MetricsPortError
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job, JobStatus, Task
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.worker import Worker

from .factories import make_tasks

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


def sample(series: str, /, **labels: str) -> float:
    """A sample's current value, 0 when the series does not exist yet."""
    return REGISTRY.get_sample_value(series, labels) or 0.0


def scheduler_over(prefix: str, clock_: FrozenClock, **task_options: str) -> Scheduler:
    tasks = make_tasks(2, prefix=prefix, **task_options)
    state = DatabaseState(node_id=f"node-{prefix}", leader="sole", clock=clock_)
    state.sync(tasks)
    return Scheduler(
        state=state, leader=SoleLeader(), clock=clock_, tasks=tasks, drain_on_shutdown=False
    )


def make_job(name: str, queue: str = "default", status: str = JobStatus.QUEUED) -> Job:
    now = clock.now()
    return Job.objects.create(
        name=name,
        key=f"{name}:{uuid.uuid4().hex}",
        input={"label": uuid.uuid4().hex},
        queue=queue,
        status=status,
        run_at=now,
        created_at=now,
        max_attempts=1,
    )


@pytest.mark.django_db
def test_exposition__every_series_is_prefixed_and_follows_the_conventions() -> None:
    make_job("demo.ping")
    families = {
        family.name: family
        for family in text_string_to_metric_families(metrics.render().decode())
        if family.name.startswith("ultimat3_jobs")
    }
    expected = {
        "ultimat3_jobs_scheduler_rounds": "counter",
        "ultimat3_jobs_scheduler_round_duration_seconds": "histogram",
        "ultimat3_jobs_scheduler_occurrences_dispatched": "counter",
        "ultimat3_jobs_scheduler_jobs_dispatched": "counter",
        "ultimat3_jobs_scheduler_dispatch_lateness_seconds": "histogram",
        "ultimat3_jobs_scheduler_occurrences_dropped": "counter",
        "ultimat3_jobs_scheduler_occurrences_paused": "counter",
        "ultimat3_jobs_scheduler_leader": "gauge",
        "ultimat3_jobs_worker_jobs_processed": "counter",
        "ultimat3_jobs_worker_jobs_failed": "counter",
        "ultimat3_jobs_worker_job_duration_seconds": "histogram",
        "ultimat3_jobs_jobs": "gauge",
    }
    assert {name: families[name].type for name in expected if name in families} == expected
    for family in families.values():
        for series in family.samples:
            if family.type == "counter" and not series.name.endswith("_created"):
                assert series.name.endswith("_total"), series.name
            if family.type == "histogram":
                assert family.name.endswith("_seconds"), family.name


@pytest.mark.django_db
def test_jobs_collector__one_series_per_status_and_queue_from_the_table() -> None:
    for _ in range(3):
        make_job("demo.ping", queue="metrics-a")
    make_job("demo.ping", queue="metrics-a", status=JobStatus.FAILED)
    make_job("demo.ping", queue="metrics-b", status=JobStatus.SUCCEEDED)
    metrics.register_jobs_collector()
    assert sample("ultimat3_jobs_jobs", status="queued", queue="metrics-a") == 3
    assert sample("ultimat3_jobs_jobs", status="failed", queue="metrics-a") == 1
    # A queue with jobs reports its empty statuses at 0 rather than leaving them out.
    assert REGISTRY.get_sample_value(
        "ultimat3_jobs_jobs", {"status": "running", "queue": "metrics-a"}
    ) == pytest.approx(0)
    assert sample("ultimat3_jobs_jobs", status="succeeded", queue="metrics-b") == 1
    Job.objects.filter(queue="metrics-a", status=JobStatus.QUEUED).delete()
    assert sample("ultimat3_jobs_jobs", status="queued", queue="metrics-a") == 0


def test_task_counters__without_metrics_per_task_each_family_sums_its_tasks(
    settings: Any,
) -> None:
    counters = instruments.TaskCounters()
    registry = CollectorRegistry()
    registry.register(counters)
    occurrences = f"{instruments.PREFIX}_scheduler_occurrences_dispatched"
    jobs = f"{instruments.PREFIX}_scheduler_jobs_dispatched"
    for task in ("a", "b"):
        counters.add(occurrences, (task,), 1)
        counters.add(jobs, (task, "true"), 2)
    assert registry.get_sample_value(f"{occurrences}_total", {"task": "a"}) == 1

    settings.ULTIMAT3_JOBS = {"METRICS_PER_TASK": False}

    assert registry.get_sample_value(f"{occurrences}_total", {}) == 2
    assert registry.get_sample_value(f"{jobs}_total", {"created": "true"}) == 4
    assert registry.get_sample_value(f"{occurrences}_total", {"task": "a"}) is None


@pytest.mark.django_db
def test_jobs_collector__a_scrape_reads_the_job_table_once() -> None:
    make_job("demo.ping")
    collector = metrics.JobsCollector()

    with CaptureQueriesContext(connection) as queries:
        list(collector.collect())

    # The relay's rows by state come from the same GROUP BY; "stuck" reads relayed rows alone.
    grouped = [q["sql"] for q in queries.captured_queries if "GROUP BY" in q["sql"]]
    assert len(grouped) == 1


@pytest.mark.django_db
def test_jobs_collector__counts_outbox_rows_by_state_with_the_stuck_ones() -> None:
    from datetime import timedelta

    waiting = make_job("demo.celery_row", status=JobStatus.OUTBOX)
    sent = make_job("demo.celery_row", status=JobStatus.RELAYED)
    late = make_job("demo.celery_row", status=JobStatus.RELAYED)
    Job.objects.filter(pk__in=[waiting.pk, sent.pk, late.pk]).update(relay="celery")
    Job.objects.filter(pk=sent.pk).update(relayed_at=clock.now())
    Job.objects.filter(pk=late.pk).update(relayed_at=clock.now() - timedelta(days=1))
    metrics.register_jobs_collector()
    assert sample("ultimat3_jobs_relay_rows", state="outbox") == 1
    assert sample("ultimat3_jobs_relay_rows", state="relayed") == 2
    assert sample("ultimat3_jobs_relay_rows", state="stuck") == 1
    assert sample("ultimat3_jobs_relay_rows", state="done") == 0
    done = make_job("demo.celery_row", status=JobStatus.SUCCEEDED)
    Job.objects.filter(pk=done.pk).update(relay="celery")
    make_job("demo.ping", status=JobStatus.SUCCEEDED)  # run by a worker: not the relay's
    assert sample("ultimat3_jobs_relay_rows", state="done") == 1
    before = sample("ultimat3_jobs_relay_rows_sent_total")
    instruments.relayed(3)
    assert sample("ultimat3_jobs_relay_rows_sent_total") == before + 3


@pytest.mark.django_db
def test_scheduler_round__counts_a_job_whose_key_existed_as_not_created() -> None:
    clock_ = FrozenClock(T0)
    scheduler = scheduler_over("mk", clock_)
    scheduler.tick()  # arms both tasks at 00:01:00
    armed = dict(Task.objects.values_list("name", "last_fired_at"))
    clock_.set(datetime(2026, 6, 1, 0, 1, 1, tzinfo=UTC))
    assert len(scheduler.tick()) == 2
    # The watermarks put back (a restored backup): the same occurrences fire again, on keys
    # their jobs already hold.
    for name, watermark in armed.items():
        Task.objects.filter(name=name).update(last_fired_at=watermark)
    again = scheduler_over("mk", clock_)
    fired = again.tick()
    assert [job.result.created for d in fired for job in d.jobs] == [False, False]
    for task in ("mk.00000", "mk.00001"):
        assert sample("ultimat3_jobs_scheduler_occurrences_dispatched_total", task=task) == 2
        created = {"task": task, "created": "true"}
        existed = {"task": task, "created": "false"}
        assert sample("ultimat3_jobs_scheduler_jobs_dispatched_total", **created) == 1
        assert sample("ultimat3_jobs_scheduler_jobs_dispatched_total", **existed) == 1


@pytest.mark.django_db
def test_scheduler_round__counts_rounds_dispatches_leadership_and_lateness() -> None:
    clock_ = FrozenClock(T0)
    scheduler = scheduler_over("mx", clock_)
    rounds = sample("ultimat3_jobs_scheduler_rounds_total", leader="true", outcome="ok")
    durations = sample("ultimat3_jobs_scheduler_round_duration_seconds_count")
    late_count = sample("ultimat3_jobs_scheduler_dispatch_lateness_seconds_count")
    late_sum = sample("ultimat3_jobs_scheduler_dispatch_lateness_seconds_sum")
    late_small = sample("ultimat3_jobs_scheduler_dispatch_lateness_seconds_bucket", le="1.0")

    scheduler.tick()  # arms both tasks at 00:01:00
    clock_.set(datetime(2026, 6, 1, 0, 1, 2, 500_000, tzinfo=UTC))  # 2.5 s late
    fired = scheduler.tick()

    assert len(fired) == 2
    assert sample("ultimat3_jobs_scheduler_rounds_total", leader="true", outcome="ok") == (
        rounds + 2
    )
    assert sample("ultimat3_jobs_scheduler_round_duration_seconds_count") == durations + 2
    assert sample("ultimat3_jobs_scheduler_leader", node="node-mx") == 1
    for task in ("mx.00000", "mx.00001"):
        assert sample("ultimat3_jobs_scheduler_occurrences_dispatched_total", task=task) == 1
        assert (
            sample("ultimat3_jobs_scheduler_jobs_dispatched_total", task=task, created="true") == 1
        )
    assert sample("ultimat3_jobs_scheduler_dispatch_lateness_seconds_count") == late_count + 2
    assert sample("ultimat3_jobs_scheduler_dispatch_lateness_seconds_sum") == pytest.approx(
        late_sum + 5.0
    )
    # 2.5 s late lands above the 1 s bucket.
    assert (
        sample("ultimat3_jobs_scheduler_dispatch_lateness_seconds_bucket", le="1.0") == late_small
    )

    scheduler.stop("test")
    assert sample("ultimat3_jobs_scheduler_leader", node="node-mx") == 0


@pytest.mark.django_db
def test_scheduler_round__counts_dropped_and_paused_occurrences_per_task() -> None:
    clock_ = FrozenClock(T0)
    scheduler = scheduler_over("md", clock_)
    scheduler.tick()  # armed at 00:01:00
    Task.objects.filter(name="md.00001").update(paused=True)
    # Five minutes down: "skip" drops 00:01..00:04 and fires 00:05; the paused task skips five.
    clock_.set(datetime(2026, 6, 1, 0, 5, 1, tzinfo=UTC))
    scheduler.tick()
    assert sample("ultimat3_jobs_scheduler_occurrences_dropped_total", task="md.00000") == 4
    assert sample("ultimat3_jobs_scheduler_occurrences_dispatched_total", task="md.00000") == 1
    assert sample("ultimat3_jobs_scheduler_occurrences_paused_total", task="md.00001") == 5
    assert sample("ultimat3_jobs_scheduler_occurrences_dispatched_total", task="md.00001") == 0


@pytest.mark.django_db(transaction=True)
def test_worker__counts_processed_failed_and_job_durations() -> None:
    name_ok, name_bad = "demo.ping", "demo.always_fail"
    processed = sample(
        "ultimat3_jobs_worker_jobs_processed_total",
        name=name_ok,
        queue="metrics-w",
        outcome="succeeded",
    )
    failed = sample("ultimat3_jobs_worker_jobs_failed_total", name=name_bad, queue="metrics-w")
    durations = sample(
        "ultimat3_jobs_worker_job_duration_seconds_count", name=name_ok, queue="metrics-w"
    )
    make_job(name_ok, queue="metrics-w")
    make_job(name_ok, queue="metrics-w")
    make_job(name_bad, queue="metrics-w")
    worker = Worker(queues=["metrics-w"], burst=True, drain_on_shutdown=False)
    assert worker.run() == 0

    assert (
        sample(
            "ultimat3_jobs_worker_jobs_processed_total",
            name=name_ok,
            queue="metrics-w",
            outcome="succeeded",
        )
        == processed + 2
    )
    assert (
        sample("ultimat3_jobs_worker_jobs_failed_total", name=name_bad, queue="metrics-w")
        == failed + 1
    )
    assert (
        sample("ultimat3_jobs_worker_job_duration_seconds_count", name=name_ok, queue="metrics-w")
        == durations + 2
    )


@pytest.mark.django_db
def test_metrics_view__answers_prometheus_text_with_the_job_table() -> None:
    make_job("demo.ping", queue="metrics-view")
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    body = response.content.decode()
    assert 'ultimat3_jobs_jobs{queue="metrics-view",status="queued"} 1.0' in body
    assert "# TYPE ultimat3_jobs_scheduler_round_duration_seconds histogram" in body


def test_serve__a_port_in_use_is_a_user_error_with_a_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortError) as raised:
            metrics.serve(port, "127.0.0.1")
    assert raised.value.code == "jobs.metrics.port-unavailable"
    assert "--metrics-port" in raised.value.fix


@pytest.mark.django_db(transaction=True)
def test_serve__exports_the_metrics_over_http() -> None:
    import urllib.request

    make_job("demo.ping", queue="metrics-http")
    server = metrics.serve(0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'ultimat3_jobs_jobs{queue="metrics-http",status="queued"} 1.0' in body


@pytest.mark.parametrize("addr", ["bogus.invalid", "203.0.113.7"], ids=["unresolvable", "not_ours"])
def test_serve__an_address_this_host_cannot_listen_on_is_a_user_error_with_a_fix(
    addr: str,
) -> None:
    with pytest.raises(MetricsAddressError) as raised:
        metrics.serve(0, addr)
    assert raised.value.code == "jobs.metrics.address-invalid"
    assert raised.value.message.startswith(f"cannot serve metrics on {addr}:0: ")
    assert "--metrics-addr" in raised.value.fix
