"""OpenTelemetry for the example project, set up the way the README tells a project to.

``settings.py`` calls ``configure`` when ``ULTIMAT3_TRACES`` is set: ``-`` prints each span to
standard output, any other value is a file that every process started with it appends its spans
to, one JSON object a line (the traces tests read them back). Celery's instrumentation is
turned on too where Celery is installed, unless ``ULTIMAT3_TRACES_CELERY=0``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO

from django.core.exceptions import ImproperlyConfigured


def _service() -> str:
    """The process's role, as its spans' ``service.name``: ``run_scheduler``, ``celery``..."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    if program.name == "manage.py" and len(sys.argv) > 1:
        return sys.argv[1]
    if program.name == "__main__.py":  # python -m celery
        return program.parent.name
    return program.name


def configure(destination: str) -> None:
    """Set the process's tracer provider: spans exported as they end, to ``destination``."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError as error:
        raise ImproperlyConfigured(
            f"ULTIMAT3_TRACES is set and the OpenTelemetry SDK cannot be imported ({error}); "
            "fix: pip install -e '.[dev]' (or opentelemetry-sdk), or unset ULTIMAT3_TRACES"
        ) from error

    out: IO[str]
    if destination == "-":
        out = sys.stdout
        exporter = ConsoleSpanExporter(out=out)
    else:
        # Appended a line at a time: the processes of a test (and a Celery worker's forked
        # children) write to one file.
        out = open(destination, "a", buffering=1)  # noqa: SIM115  (open for the process's life)
        exporter = ConsoleSpanExporter(
            out=out, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
    provider = TracerProvider(resource=Resource.create({"service.name": _service()}))
    # Exported as each span ends, in the process that ended it: no thread to lose at a fork or
    # at exit. A production project would use a BatchSpanProcessor and its OTLP exporter.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if os.environ.get("ULTIMAT3_TRACES_CELERY", "1") in ("", "0"):
        return
    try:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
    except ImportError:  # without Celery, or without its instrumentation
        return
    # The publishing side (run_relay) and the worker's: Celery's signals, connected before a
    # prefork worker forks its children.
    CeleryInstrumentor().instrument()
