"""OpenTelemetry traces (the ``otel`` extra), recorded only while the project sets a provider.

One trace runs from the occurrence that fired to the job that ran it. A scheduler round that has
tasks due is a span (``RoundTrace``); each occurrence it fires is a child span, whose W3C
``traceparent`` every job row of that occurrence keeps (``Job.trace_context``). The worker that
claims the row, in whatever process, runs the job inside a span continued from it
(``job_run``); a relayed Celery task carries it in its message headers (``continued``,
``message_headers``), where Celery's own instrumentation picks it up. A job enqueued from code
keeps the caller's context (``caller_context``): a web request's span, say.

``tracer()`` is None without ``opentelemetry-api`` or while no provider is set (the API's
default proxy, or its no-op provider). Every caller asks it once (per round, per job, per
enqueue) and then skips all its tracing work: no span, no attribute, no ``traceparent``.

Attribute names follow the OpenTelemetry semantic conventions where they have one: messaging
(``messaging.*``: a round sends a batch of messages, an occurrence creates them, the worker
processes one) and, for the schedule, the FaaS timer trigger's ``faas.cron`` and ``faas.time``.
The rest are the app's own, under ``ultimat3_jobs.``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    # The job row keeps W3C trace context whatever the project's propagators: it is ours to
    # read back. Message headers use the project's (``message_headers``).
    _W3C = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

#: The instrumentation scope the spans are recorded under.
SCOPE = "ultimat3_jobs"
#: ``messaging.system``: the job table is the intermediary the jobs travel through.
SYSTEM = "ultimat3_jobs"

#: The job row's column, and a message header, hold this W3C header's value.
TRACEPARENT = "traceparent"

_NOTHING: AbstractContextManager[None] = nullcontext()
#: The last provider seen, and the tracer it gave (None: tracing is off).
_seen: tuple[object, Tracer | None] = (None, None)


def tracer() -> Tracer | None:
    """The app's tracer while a tracer provider is set; None while tracing is off.

    One look at the global provider, the tracer kept for as long as that provider stays: cheap
    enough to ask per round, per job and per enqueue.
    """
    global _seen
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    seen, found = _seen
    if provider is seen:
        return found
    off = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    found = None if off else provider.get_tracer(SCOPE)
    _seen = (provider, found)
    return found


def _traceparent(span: Span) -> str:
    """``span``'s W3C ``traceparent`` (version 00), as the W3C propagator writes it; "" for a
    span of no trace. Written here rather than by the propagator, which wants the span put in a
    context first, at twice the cost: a round makes one per occurrence."""
    found = span.get_span_context()
    if not found.is_valid:
        return ""
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{found.trace_flags:02x}"


def _restored(trace_context: str) -> Context | None:
    """The context a stored ``traceparent`` names; None (start a new trace) when there is none."""
    if not trace_context:
        return None
    return _W3C.extract({TRACEPARENT: trace_context})


# -- a job enqueued from code ------------------------------------------------------------------


def caller_context() -> str:
    """The ``traceparent`` of the caller's current span, for the job row it enqueues: its run
    continues the caller's trace (a web request's). "" while tracing is off or with no span."""
    if tracer() is None:
        return ""
    return _traceparent(trace.get_current_span())


# -- the worker --------------------------------------------------------------------------------


class RunningJob(Protocol):
    """What the worker's span of a job reads of it (``store.ClaimedJob`` fits)."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def trace_context(self) -> str: ...


def flush(timeout_ms: int = 5_000) -> None:
    """Export what the tracer provider holds: a process about to end without running its exit
    hooks (a process pool's child) would lose its last spans."""
    if tracer() is None:
        return
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_ms)


def job_run(job: RunningJob, *, worker: str) -> AbstractContextManager[Span | None]:
    """The span of one attempt at ``job``, current while the job runs: a child of the span its
    row's ``traceparent`` names (its occurrence's, its caller's), else a trace of its own.

    An exception leaving the block is recorded on it and sets its status to error. Yields None
    while tracing is off.
    """
    found = tracer()
    if found is None:
        return _NOTHING
    return _ended_once(
        found.start_as_current_span(
            f"run {job.name}",
            end_on_exit=False,
            context=_restored(job.trace_context),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "messaging.client.id": worker,
                "ultimat3_jobs.job.name": job.name,
                "ultimat3_jobs.job.key": job.key,
                "ultimat3_jobs.job.attempt": job.attempts,
            },
        )
    )


@contextmanager
def _ended_once(started: AbstractContextManager[Span]) -> Iterator[Span]:
    """``started``'s span, ended as its block ends unless ``broken_off`` ended it first."""
    span: Span | None = None
    try:
        with started as span:
            yield span
    finally:
        if span is not None and span.is_recording():
            span.end()


def broken_off(span: Span | None, error: BaseException) -> None:
    """End a job's ``span`` failed by ``error`` now: its attempt was given up from outside
    (a timeout) while its function may run on, unseen."""
    if span is not None and span.is_recording():
        failed(span, error)
        span.end()


def failed(span: Span | None, error: BaseException) -> None:
    """Mark ``span`` failed by ``error``, for an error that does not leave its block."""
    if span is not None and span.is_recording():
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))


# -- the relay ---------------------------------------------------------------------------------


def continued(trace_context: str) -> AbstractContextManager[None]:
    """The stored context made current while the block runs (tracing on), so a span started in
    it (Celery's publish span, when its instrumentation is on) continues the job's trace."""
    if not trace_context or tracer() is None:
        return _NOTHING
    return _attached(_restored(trace_context))


@contextmanager
def _attached(context: Context | None) -> Iterator[None]:
    token = otel_context.attach(context) if context is not None else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)


def message_headers(trace_context: str) -> dict[str, str]:
    """Message headers that carry a job's trace on to the engine that runs it.

    Tracing on: the current context (``continued``) as the project's propagator writes it.
    Tracing off here: the stored ``traceparent`` as it is, so an engine that traces still
    continues the trace. None stored: no header.
    """
    if not trace_context:
        return {}
    if tracer() is None:
        return {TRACEPARENT: trace_context}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


# -- the scheduler's round ---------------------------------------------------------------------


class PlannedKey(Protocol):
    @property
    def key(self) -> str: ...


class FiredOccurrence(Protocol):
    """What an occurrence's span reads of it, and where its ``traceparent`` goes
    (``planner.PlannedOccurrence`` fits)."""

    trace_context: str

    @property
    def task(self) -> str: ...
    @property
    def occurrence(self) -> datetime: ...
    @property
    def catch_up(self) -> bool: ...
    @property
    def jobs(self) -> Sequence[PlannedKey]: ...


class RoundTrace:
    """One scheduler round's spans: the round's own, and a child per occurrence it fires.

    Made only while tracing is on. ``fire`` may be called from the thread that plans a round
    written while its task functions run; ``committed`` and ``end`` from the round's thread,
    once that thread is done.
    """

    def __init__(self, tracer: Tracer, *, due: int, node: str) -> None:
        self._tracer = tracer
        self.span = tracer.start_span(
            "scheduler round",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "dispatch",
                "messaging.client.id": node,
                "ultimat3_jobs.round.due": due,
            },
        )
        self._parent = trace.set_span_in_context(self.span)
        self._fired: list[tuple[FiredOccurrence, Span]] = []
        self._committed = False

    def fire(self, occurrence: FiredOccurrence, *, zone: str, cron: str) -> None:
        """Start ``occurrence``'s span and give it the ``traceparent`` its job rows keep."""
        at = occurrence.occurrence
        span = self._tracer.start_span(
            f"fire {occurrence.task}",
            context=self._parent,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "create",
                "faas.cron": cron,
                "faas.time": at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
                "ultimat3_jobs.task": occurrence.task,
                "ultimat3_jobs.occurrence": at.isoformat(),
                "ultimat3_jobs.zone": zone,
                "ultimat3_jobs.catch_up": occurrence.catch_up,
                "ultimat3_jobs.keys": [planned.key for planned in occurrence.jobs],
            },
        )
        self._fired.append((occurrence, span))
        occurrence.trace_context = _traceparent(span)

    def committed(
        self, fired: Iterable[FiredOccurrence], *, jobs: int, created: int, records: int
    ) -> None:
        """The round committed ``fired`` (those left once overlapping ones were skipped)."""
        self._committed = True
        kept = {id(occurrence) for occurrence in fired}
        for occurrence, span in self._fired:
            if id(occurrence) not in kept:
                # Decided in the round's transaction: an earlier occurrence still had jobs.
                span.set_attribute("ultimat3_jobs.skipped", "overlap")
        self.span.set_attributes(
            {
                "ultimat3_jobs.round.fired": len(kept),
                "ultimat3_jobs.round.jobs": jobs,
                "ultimat3_jobs.round.created": created,
                "ultimat3_jobs.round.records": records,
                "messaging.batch.message_count": jobs,
            }
        )

    def failed(self, error: BaseException) -> None:
        """The round raised: nothing it fired was written."""
        failed(self.span, error)
        for _, span in self._fired:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "the round was not written"))

    def replanned(self) -> None:
        """The round's writes were given up, to plan it again: the occurrences fired so far
        end as not written, and those planned next get spans of their own."""
        for _, span in self._fired:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "the round was planned again"))
            span.end()
        self._fired = []

    def end(self) -> None:
        """End every span of the round; a round that wrote nothing says so."""
        self.span.set_attribute("ultimat3_jobs.round.committed", self._committed)
        for _, span in self._fired:
            span.end()
        self.span.end()


__all__ = [
    "SCOPE",
    "TRACEPARENT",
    "RoundTrace",
    "caller_context",
    "continued",
    "failed",
    "job_run",
    "message_headers",
    "tracer",
]
