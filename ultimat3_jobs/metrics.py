"""Prometheus metrics, read: the job table at scrape time, the view and the exporter.

The roles record into ``instruments``; this module reads. Counts of jobs by status and queue
are not counted as they happen but read at scrape time with one ``GROUP BY`` query, so every
process (and the project's ``/metrics`` view) reports the same table.

Expose them with ``metrics_view`` (mounted by the project) or ``--metrics-port`` on the
long-running commands (``serve``), which also answers ``/healthz`` and ``/readyz`` for the
roles of its process (``health.py``).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .errors import MetricsAddressError, MetricsPortError
from .health import ProcessHealth, process

# Importing it registers every instrument: the exposition lists them all, recorded or not.
from .instruments import PREFIX
from .logs import emit, failure_fields

logger = logging.getLogger("ultimat3_jobs.metrics")

#: A port that is taken or not ours to bind; any other failure to listen is the address's.
_PORT_ERRORS = (errno.EADDRINUSE, errno.EACCES)


class JobsCollector(Collector):
    """``ultimat3_jobs_jobs{status,queue}``: the job table, one ``GROUP BY`` per scrape."""

    NAME = f"{PREFIX}_jobs"
    HELP = "Jobs in the job table, by status and queue, read when scraped."

    def __init__(self, using: str | None = None) -> None:
        #: The database read; None: the app's (``db.app_database``), looked up when scraped.
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
        from .db import app_database
        from .models import JobStatus
        from .store import store_for

        using = self.using or app_database()
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["status", "queue"])
        connection = connections[using]
        opened_here = connection.connection is None
        relay = GaugeMetricFamily(self.RELAY_NAME, self.RELAY_HELP, labels=["state"])
        try:
            stuck_before = clock.now() - get_settings().relay_stuck_after
            by_queue, relay_states = store_for(using).job_counts(stuck_before=stuck_before)
            for state, count in relay_states.items():
                relay.add_metric([state], count)
        except DatabaseError as error:
            # A scrape must still answer (the process metrics are worth having); say why the
            # table is missing from it.
            emit(logger, "jobs.metrics.collect-failed", logging.WARNING, **failure_fields(error))
            by_queue = {}
        finally:
            if opened_here and not connection.in_atomic_block:
                # The exporter's threads are not requests: nothing else would close it.
                connection.close()
        for (status, queue), count in by_queue.items():
            family.add_metric([status, queue], count)
        # Every status of a queue that has jobs, at 0 when empty, so rates and alerts on
        # "failed" work without a series that appears from nowhere.
        for queue in sorted({queue for _, queue in by_queue}):
            for status in JobStatus.values:
                if (status, queue) not in by_queue:
                    family.add_metric([status, queue], 0)
        yield family
        yield relay


_collector_lock = threading.Lock()
_collector: JobsCollector | None = None


def register_jobs_collector(
    registry: CollectorRegistry = REGISTRY, using: str | None = None
) -> JobsCollector:
    """Register the job-table collector of ``using`` (None: the app's database) once per
    process (idempotent: the first registration's database is read)."""
    global _collector
    with _collector_lock:
        if _collector is None:
            _collector = JobsCollector(using)
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


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request, none kept at shutdown (as prometheus_client's own exporter)."""

    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A probe every few seconds is not worth a line."""


#: The probes ``serve`` answers, and which answer of each role they read.
PROBES = {"/healthz": "live", "/readyz": "ready"}

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def exporter_app(health: ProcessHealth, registry: CollectorRegistry = REGISTRY) -> WSGIApp:
    """``/healthz`` (every role of the process alive) and ``/readyz`` (every one ready) as
    200 or 503 with the roles in JSON; every other path the metrics."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        answer = PROBES.get(environ.get("PATH_INFO", ""))
        if answer is None:
            return metrics_app(environ, start_response)
        roles = health.report()
        # A process whose roles are not built yet (or gone) is neither.
        ok = bool(roles) and all(getattr(role, answer) for role in roles)
        body = json.dumps(
            {"status": "ok" if ok else "fail", "roles": [role.as_dict() for role in roles]}
        ).encode()
        start_response(
            "200 OK" if ok else "503 Service Unavailable",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [body]

    return app


def serve(
    port: int,
    addr: str = "0.0.0.0",
    *,
    health: ProcessHealth = process,
    using: str | None = None,
) -> Any:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port`` in a daemon thread
    (``--metrics-port``); ``health`` holds the roles the probes report.

    Returns the server (``.shutdown()`` stops it). A port in use is a ``MetricsPortError``; an
    address this host cannot listen on (a name that does not resolve, another host's address)
    is a ``MetricsAddressError``. The job table's gauges are among the metrics unless the
    ``METRICS_JOB_TABLE`` setting is False, read from ``using`` (the command's database; None:
    the app's).
    """
    from .conf import get_settings

    if get_settings().metrics_job_table:
        register_jobs_collector(using=using)
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        bound = type("_BoundServer", (_Server,), {"address_family": family})
        server: WSGIServer = make_server(
            str(sockaddr[0]), port, exporter_app(health), bound, handler_class=_Quiet
        )
    except OSError as error:
        reason = error.strerror or str(error)
        if isinstance(error, socket.gaierror) or error.errno not in _PORT_ERRORS:
            raise MetricsAddressError(
                f"cannot serve metrics on {addr}:{port}: {reason}",
                fix="pass --metrics-addr an address of this host: 0.0.0.0 for every interface, "
                "127.0.0.1 for this host alone, or a name that resolves to one of them",
                cause=error,
            ) from error
        raise MetricsPortError(
            f"cannot serve metrics on {addr}:{port}: {reason}",
            fix="pass a free port to --metrics-port (or stop the process that holds this one)",
            cause=error,
        ) from error
    thread = threading.Thread(target=server.serve_forever, name="ultimat3-metrics", daemon=True)
    thread.start()
    emit(logger, "jobs.metrics.serving", addr=addr, port=server.server_port)
    return server


__all__ = [
    "JobsCollector",
    "exporter_app",
    "metrics_view",
    "register_jobs_collector",
    "render",
    "serve",
]
