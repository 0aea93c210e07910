"""A tracer provider for one test, with the SDK's in-memory exporter (``spans``), and how a
span's context reads as a ``traceparent``. Imported only by the tests of tracing: the extras
legs have no OpenTelemetry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def record_spans(monkeypatch: pytest.MonkeyPatch) -> tuple[InMemorySpanExporter, TracerProvider]:
    """Record the spans of the rest of the test: the API lets a process set its global
    provider once, so the test's stands in for it until ``monkeypatch`` undoes it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    return exporter, provider


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The spans recorded during this test (``record_spans``)."""
    exporter, provider = record_spans(monkeypatch)
    yield exporter
    provider.shutdown()


def traceparent_of(span: trace.Span | ReadableSpan) -> str:
    """The W3C ``traceparent`` that names ``span``."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with ``prefix``, in the order they ended."""
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]
