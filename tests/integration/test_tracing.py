"""Traces in one process, against the real database: a round's spans and the traceparent each
job row keeps, the worker's run span under its occurrence's, an enqueue under the caller's
span, the relay's message headers. Across processes: tests/acceptance/test_tracing_processes.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testproject.demo.celery_tasks import write_row
from testproject.demo.tasks import always_fail, ping
from ultimat3_jobs import tasks_compat, tracing
from ultimat3_jobs.celery import KEY_HEADER
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.handles import TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job
from ultimat3_jobs.planner import occurrence_key
from ultimat3_jobs.relay import Relay
from ultimat3_jobs.scheduler import STREAM_FROM, Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.worker import Worker

from ..otel import named, record_spans, spans, traceparent_of
from ..redis_server import RedisServer, point_celery_at
from .factories import make_tasks
from .test_django_tasks import every_minute, fire_once

__all__ = ["spans"]

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
OCCURRENCE = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)


def armed(tasks: list[TaskHandle]) -> tuple[Scheduler, FrozenClock]:
    """A scheduler over ``tasks``, armed, its clock just past their next occurrence."""
    clock = FrozenClock(T0)
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    scheduler.tick()
    clock.set(OCCURRENCE + timedelta(milliseconds=200))
    return scheduler, clock


def burst() -> None:
    Worker(burst=True, listen=False, poll_interval=timedelta(seconds=0.05)).run()


def fire_spans_by_task(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name.removeprefix("fire "): span for span in named(exporter, "fire ")}


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


# -- off ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_no_provider__no_row_keeps_a_traceparent() -> None:
    assert tracing.tracer() is None
    scheduler, _ = armed(make_tasks(3))
    assert len(scheduler.tick()) == 3
    ping.enqueue({"label": "direct"})
    with trace.get_tracer("test").start_as_current_span("a span of the no-op tracer"):
        ping.enqueue({"label": "in a no-op span"})
    assert set(Job.objects.values_list("trace_context", flat=True)) == {""}


# -- the round ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_round__a_span_per_round_and_per_occurrence_whose_traceparent_its_jobs_keep(
    spans: InMemorySpanExporter,
) -> None:
    tasks = make_tasks(3)
    scheduler, _ = armed(tasks)
    [arming] = named(spans, "scheduler round")
    assert dict(arming.attributes or {})["ultimat3_jobs.round.fired"] == 0
    spans.clear()

    assert len(scheduler.tick()) == 3

    [round_span] = named(spans, "scheduler round")
    attributes = dict(round_span.attributes or {})
    assert (
        attributes["ultimat3_jobs.round.due"],
        attributes["ultimat3_jobs.round.fired"],
        attributes["ultimat3_jobs.round.jobs"],
        attributes["ultimat3_jobs.round.created"],
    ) == (3, 3, 3, 3)
    fired = fire_spans_by_task(spans)
    assert sorted(fired) == [task.name for task in tasks]
    jobs = {job.task: job for job in Job.objects.all()}
    for name, span in fired.items():
        assert parent_id(span) == round_span.context.span_id
        assert span.context.trace_id == round_span.context.trace_id
        assert jobs[name].trace_context == traceparent_of(span)
        assert dict(span.attributes or {})["ultimat3_jobs.keys"] == (jobs[name].key,)
        assert dict(span.attributes or {})["ultimat3_jobs.occurrence"] == OCCURRENCE.isoformat()


@pytest.mark.django_db
def test_round__an_occurrence_skipped_for_overlap_says_so_and_fires_nothing(
    spans: InMemorySpanExporter,
) -> None:
    scheduler, clock = armed(make_tasks(1, overlap="skip"))
    scheduler.tick()  # its job stays queued
    clock.advance(60)
    spans.clear()
    assert scheduler.tick() == []
    [fired] = named(spans, "fire ")
    assert dict(fired.attributes or {})["ultimat3_jobs.skipped"] == "overlap"
    [round_span] = named(spans, "scheduler round")
    assert dict(round_span.attributes or {})["ultimat3_jobs.round.fired"] == 0
    assert Job.objects.count() == 1


def _statements_of_a_round(prefix: str) -> list[str]:
    scheduler, _ = armed(make_tasks(20, prefix=prefix))
    with CaptureQueriesContext(connection) as queries:
        assert len(scheduler.tick()) == 20
    return [q["sql"].split()[0] for q in queries]


@pytest.mark.django_db
def test_round__tracing_adds_no_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    off = _statements_of_a_round("off")
    exporter, _ = record_spans(monkeypatch)
    on = _statements_of_a_round("on")
    assert len(named(exporter, "fire ")) == 20
    assert on == off


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_round__streamed_each_job_keeps_its_occurrences_traceparent(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = make_tasks(STREAM_FROM + 20)
    scheduler, _ = armed(tasks)
    spans.clear()
    seen: list[bool] = []
    original = scheduler._streams

    def streams(*args: Any) -> bool:
        seen.append(original(*args))
        return seen[-1]

    monkeypatch.setattr(scheduler, "_streams", streams)
    assert len(scheduler.tick()) == len(tasks)
    assert seen == [True]
    [round_span] = named(spans, "scheduler round")
    fired = fire_spans_by_task(spans)
    assert len(fired) == len(tasks)
    for job in Job.objects.all():
        assert job.trace_context == traceparent_of(fired[job.task])
        assert parent_id(fired[job.task]) == round_span.context.span_id


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_round__streamed_and_planned_again_each_job_keeps_the_span_that_wrote_it(
    spans: InMemorySpanExporter,
) -> None:
    tasks = make_tasks(STREAM_FROM + 20)
    scheduler, _ = armed(tasks)
    spans.clear()
    data = {"label": OCCURRENCE.isoformat()}
    key = occurrence_key(tasks[3].name, OCCURRENCE, ping.occurrence_part(data))
    Job.objects.create(name="demo.ping", key=key, input=data, run_at=T0, created_at=T0)
    assert len(scheduler.tick()) == len(tasks)
    fires = named(spans, "fire ")
    given_up = [s for s in fires if s.status.status_code == trace.StatusCode.ERROR]
    written = {s.name.removeprefix("fire "): s for s in fires if s not in given_up}
    # The streamed attempt's spans end as given up; the round planned again has one per task.
    assert given_up and {s.status.description for s in given_up} == {"the round was planned again"}
    assert len(written) == len(tasks)
    for job in Job.objects.exclude(key=key):
        assert job.trace_context == traceparent_of(written[job.task])


# -- the worker -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_worker__a_jobs_run_span_is_a_child_of_its_occurrences(
    spans: InMemorySpanExporter,
) -> None:
    scheduler, _ = armed(make_tasks(2))
    scheduler.tick()
    fired = fire_spans_by_task(spans)
    burst()
    runs = named(spans, "run ")
    assert len(runs) == 2
    by_id = {job.pk: job for job in Job.objects.all()}
    for run in runs:
        attributes = dict(run.attributes or {})
        job = by_id[int(str(attributes["messaging.message.id"]))]
        assert job.status == "succeeded"
        parent = fired[job.task]
        assert run.context.trace_id == parent.context.trace_id
        assert parent_id(run) == parent.context.span_id
        assert run.kind == trace.SpanKind.CONSUMER
        assert attributes["ultimat3_jobs.job.key"] == job.key


@pytest.mark.django_db(transaction=True)
def test_worker__a_failed_attempt_records_its_error_on_the_run_span(
    spans: InMemorySpanExporter,
) -> None:
    always_fail.enqueue({"label": "x"})
    burst()
    [run] = named(spans, "run demo.always_fail")
    assert run.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in run.events] == ["exception"]


@pytest.mark.django_db(transaction=True)
def test_worker__an_attempt_past_its_timeout_ends_its_run_span_failed_at_once(
    spans: InMemorySpanExporter,
) -> None:
    import time

    from testproject.demo.tasks import hang

    hang.enqueue({"label": "x", "seconds": 2.6})  # Its timeout is 2 s.
    burst()
    [run] = named(spans, "run demo.hang")  # Ended by the timeout, its function still running.
    assert run.status.status_code == trace.StatusCode.ERROR
    [event] = run.events
    assert event.name == "exception"
    assert "JobTimeoutError" in str(dict(event.attributes or {})["exception.type"])
    time.sleep(1)  # The function returns: its span is not ended a second time.
    assert len(named(spans, "run demo.hang")) == 1


# -- code that enqueues ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue__continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    found = tracing.tracer()
    assert found is not None
    with found.start_as_current_span("GET /reports") as request:
        ping.enqueue({"label": "from a request"})
        if tasks_compat.AVAILABLE:
            from testproject.demo.background import record

            record.enqueue("from a request")
    ping.enqueue({"label": "outside any span"})
    expected = traceparent_of(request)
    traced = Job.objects.exclude(input={"label": "outside any span"})
    assert set(traced.values_list("trace_context", flat=True)) == {expected}
    assert Job.objects.get(input={"label": "outside any span"}).trace_context == ""
    burst()
    runs = named(spans, "run ")
    assert len(runs) == Job.objects.count()
    under_request = [run for run in runs if parent_id(run) == request.get_span_context().span_id]
    assert len(under_request) == traced.count()


# -- the relay ------------------------------------------------------------------------------------


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[redis.Redis]:
    if redis_server.process is None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    point_celery_at(redis_server.url)
    yield client
    client.close()


def relayed_headers(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(item)["headers"] for item in reversed(client.lrange("celery", 0, -1))]


@pytest.mark.django_db
def test_relay__a_celery_message_carries_its_occurrences_traceparent(
    spans: InMemorySpanExporter, broker: redis.Redis
) -> None:
    fire_once(every_minute(lambda at: [(write_row, {"occurrence": at.isoformat()})], "t.relay"))
    [job] = Job.objects.filter(task="t.relay")
    [fired] = named(spans, "fire t.relay")
    assert job.trace_context == traceparent_of(fired)
    assert Relay(listen=False).relay_once() == 1
    [headers] = relayed_headers(broker)
    assert headers["traceparent"] == job.trace_context


@pytest.mark.django_db
def test_relay__untraced_passes_a_stored_traceparent_on_and_adds_none_to_an_untraced_row(
    broker: redis.Redis,
) -> None:
    assert tracing.tracer() is None
    stored = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    fire_once(every_minute(lambda at: [(write_row, {"occurrence": at.isoformat()})], "t.plain"))
    traced = every_minute(lambda at: [(write_row, {"occurrence": f"{at} again"})], "t.traced")
    fire_once(traced)
    Job.objects.filter(task="t.traced").update(trace_context=stored)
    assert Relay(listen=False).relay_once() == 2
    tasks = dict(Job.objects.values_list("key", "task"))
    carried = {
        tasks[headers[KEY_HEADER]]: headers.get("traceparent")
        for headers in relayed_headers(broker)
    }
    assert carried == {"t.plain": None, "t.traced": stored}
