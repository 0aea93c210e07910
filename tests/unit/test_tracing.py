"""``tracing``: off without a provider, and what it carries when one is set (the SDK's
in-memory exporter). The rounds, the worker and the relay are in tests/integration/test_tracing.py
and, across processes, tests/acceptance/test_tracing_processes.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ultimat3_jobs import tracing

from ..otel import spans, traceparent_of

__all__ = ["spans"]

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass
class Claimed:
    id: int = 7
    name: str = "demo.ping"
    key: str = "k"
    queue: str = "default"
    attempts: int = 1
    trace_context: str = ""


@dataclass
class Planned:
    key: str


@dataclass
class Fired:
    task: str
    occurrence: datetime
    catch_up: bool
    jobs: tuple[Planned, ...]
    trace_context: str = ""


def test_tracer__is_none_while_no_provider_is_set() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracing.tracer() is None
    assert tracing.caller_context() == ""
    with tracing.job_run(Claimed(trace_context=TRACEPARENT), worker="w") as span:
        assert span is None
    with tracing.continued(TRACEPARENT):
        assert not trace.get_current_span().get_span_context().is_valid


def test_tracer__is_none_under_the_no_op_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
    assert tracing.tracer() is None


def test_message_headers__pass_a_stored_traceparent_on_as_it_is_while_tracing_is_off() -> None:
    assert tracing.message_headers(TRACEPARENT) == {"traceparent": TRACEPARENT}
    assert tracing.message_headers("") == {}


def test_message_headers__inside_continued_carry_the_stored_context(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.continued(TRACEPARENT):
        assert tracing.message_headers(TRACEPARENT)["traceparent"] == TRACEPARENT
        current = trace.get_current_span().get_span_context()
        assert (current.trace_id, current.is_remote) == (0x0AF7651916CD43DD8448EB211C80319C, True)
    assert not trace.get_current_span().get_span_context().is_valid


def test_caller_context__is_the_current_spans_traceparent(spans: InMemorySpanExporter) -> None:
    found = tracing.tracer()
    assert found is not None
    assert tracing.caller_context() == ""  # no span: nothing to continue
    with found.start_as_current_span("request") as span:
        assert tracing.caller_context() == traceparent_of(span)


def test_caller_context__reads_as_the_w3c_propagator_writes_it(spans: InMemorySpanExporter) -> None:
    found = tracing.tracer()
    assert found is not None
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=trace.TraceFlags(0))
    )
    with found.start_as_current_span("request") as sampled:
        for span in (sampled, unsampled, trace.INVALID_SPAN):
            with trace.use_span(span):
                written: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(written)
                assert tracing.caller_context() == written.get("traceparent", "")
    assert tracing.caller_context() == ""


def test_job_run__is_a_child_of_the_stored_context_and_records_a_failure(
    spans: InMemorySpanExporter,
) -> None:
    with (
        pytest.raises(ValueError, match="boom"),
        tracing.job_run(Claimed(trace_context=TRACEPARENT), worker="w1"),
    ):
        raise ValueError("boom")
    with tracing.job_run(Claimed(id=8, key="k2"), worker="w1"):
        pass
    failed, fresh = spans.get_finished_spans()
    assert failed.name == "run demo.ping"
    assert failed.kind == trace.SpanKind.CONSUMER
    assert failed.parent is not None and failed.parent.is_remote
    assert f"{failed.parent.span_id:016x}" == "b7ad6b7169203331"
    assert f"{failed.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in failed.events] == ["exception"]
    assert dict(failed.attributes or {}) == {
        "messaging.system": "ultimat3_jobs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "default",
        "messaging.message.id": "7",
        "messaging.client.id": "w1",
        "ultimat3_jobs.job.name": "demo.ping",
        "ultimat3_jobs.job.key": "k",
        "ultimat3_jobs.job.attempt": 1,
    }
    # No stored context: a trace of its own.
    assert fresh.parent is None
    assert fresh.context.trace_id != failed.context.trace_id


def test_round_trace__an_occurrence_span_per_fired_occurrence_under_the_round(
    spans: InMemorySpanExporter,
) -> None:
    found = tracing.tracer()
    assert found is not None
    at = datetime(2026, 3, 8, 3, tzinfo=UTC)
    kept = Fired("t.kept", at, False, (Planned("t.kept:1:a"), Planned("t.kept:1:b")))
    skipped = Fired("t.skip", at, True, (Planned("t.skip:1:a"),))
    traced = tracing.RoundTrace(found, due=5, node="n1")
    traced.fire(kept, zone="America/New_York", cron="0 3 * * *")
    traced.fire(skipped, zone="UTC", cron="* * * * *")
    traced.committed([kept], jobs=2, created=1, records=1)
    traced.end()
    by_name = {span.name: span for span in spans.get_finished_spans()}
    round_span, fired = by_name["scheduler round"], by_name["fire t.kept"]
    assert fired.parent is not None and fired.parent.span_id == round_span.context.span_id
    assert kept.trace_context == traceparent_of(fired)
    assert dict(fired.attributes or {}) == {
        "messaging.system": "ultimat3_jobs",
        "messaging.operation.type": "create",
        "faas.cron": "0 3 * * *",
        "faas.time": "2026-03-08T03:00:00Z",
        "ultimat3_jobs.task": "t.kept",
        "ultimat3_jobs.occurrence": "2026-03-08T03:00:00+00:00",
        "ultimat3_jobs.zone": "America/New_York",
        "ultimat3_jobs.catch_up": False,
        "ultimat3_jobs.keys": ("t.kept:1:a", "t.kept:1:b"),
    }
    assert dict(by_name["fire t.skip"].attributes or {})["ultimat3_jobs.skipped"] == "overlap"
    attributes = dict(round_span.attributes or {})
    assert {key: attributes[key] for key in attributes if key.startswith("ultimat3_jobs.")} == {
        "ultimat3_jobs.round.due": 5,
        "ultimat3_jobs.round.fired": 1,
        "ultimat3_jobs.round.jobs": 2,
        "ultimat3_jobs.round.created": 1,
        "ultimat3_jobs.round.records": 1,
        "ultimat3_jobs.round.committed": True,
    }
    assert attributes["messaging.batch.message_count"] == 2
    assert round_span.kind == fired.kind == trace.SpanKind.PRODUCER


def test_round_trace__a_round_that_raised_marks_its_spans_failed(
    spans: InMemorySpanExporter,
) -> None:
    found = tracing.tracer()
    assert found is not None
    fired = Fired("t.a", datetime(2026, 1, 1, tzinfo=UTC), False, (Planned("t.a:1:x"),))
    traced = tracing.RoundTrace(found, due=1, node="n1")
    traced.fire(fired, zone="UTC", cron="* * * * *")
    traced.failed(RuntimeError("database gone"))
    traced.end()
    statuses = {span.name: span.status.status_code for span in spans.get_finished_spans()}
    assert statuses == {
        "scheduler round": trace.StatusCode.ERROR,
        "fire t.a": trace.StatusCode.ERROR,
    }
    round_span = next(s for s in spans.get_finished_spans() if s.name == "scheduler round")
    assert dict(round_span.attributes or {})["ultimat3_jobs.round.committed"] is False
