"""One trace across real processes: ``run_scheduler`` fires, ``run_worker`` (or ``run_relay``
and a ``celery worker`` with Celery's instrumentation) runs, each with the test project's
SDK provider (``ULTIMAT3_TRACES``: every process appends its spans to one file, read back here).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from ultimat3_jobs.models import Job

from ..redis_server import RedisServer
from .helpers import Process, processes, spawn, wait_for
from .test_relay_processes import (
    TASK as RELAYED_TASK,
)
from .test_relay_processes import (
    CeleryWorker,
    all_done,
    broker,
    relay_env,
    start_worker,
    workers,
)

__all__ = ["broker", "processes", "workers"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

TASK = "acceptance.every_second"
FAST = {"TICK_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 1, "WORKER_POLL_INTERVAL": 0.2}


def run(tmp_path: Path, processes: list[Process], name: str, *argv: str, **env: str) -> None:
    process = spawn(tmp_path, name, *argv, settings_overrides=FAST, env=env)
    processes.append(process)
    assert process.wait(90) == 0, process.log_path.read_text()


def fire(tmp_path: Path, processes: list[Process], **env: str) -> None:
    """Two ``run_scheduler --once``: the first arms the per-second tasks, the second, a second
    and a half later, fires the occurrences that came due in between."""
    run(tmp_path, processes, "scheduler-arms", "run_scheduler", "--once", **env)
    time.sleep(1.5)
    run(tmp_path, processes, "scheduler-fires", "run_scheduler", "--once", **env)


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"]).removeprefix("0x")


def trace_id(span: dict[str, Any]) -> str:
    return str(span["context"]["trace_id"]).removeprefix("0x")


def parent_of(span: dict[str, Any]) -> str:
    return str(span["parent_id"] or "").removeprefix("0x")


def service(span: dict[str, Any]) -> str:
    return str(span["resource"]["attributes"]["service.name"])


def occurrence_span(spans: list[dict[str, Any]], job: Job) -> dict[str, Any]:
    """The scheduler's span of the occurrence whose traceparent ``job`` keeps."""
    version, trace, span, _ = job.trace_context.split("-")
    [found] = [s for s in spans if span_id(s) == span]
    assert (trace_id(found), version, service(found)) == (trace, "00", "run_scheduler")
    assert found["name"] == f"fire {job.task}"
    assert found["kind"] == "SpanKind.PRODUCER"
    return found


def children(spans: list[dict[str, Any]], parent: dict[str, Any], name: str) -> list[dict]:
    return [
        s
        for s in spans
        if parent_of(s) == span_id(parent) and trace_id(s) == trace_id(parent) and s["name"] == name
    ]


@pytest.mark.parametrize(
    "pool",
    [[], ["--pool", "process", "--max-jobs-per-child", "1"]],
    ids=["threads", "recycled_children"],
)
def test_traces__one_trace_from_the_occurrence_span_to_the_workers_job_span(
    tmp_path: Path, processes: list[Process], pool: list[str]
) -> None:
    path = tmp_path / "spans.jsonl"
    fire(tmp_path, processes, ULTIMAT3_TRACES=str(path))
    run(tmp_path, processes, "worker", "run_worker", "--burst", *pool, ULTIMAT3_TRACES=str(path))

    spans = read_spans(path)
    jobs = list(Job.objects.filter(task=TASK))
    assert jobs and all(job.status == "succeeded" for job in jobs)
    for job in jobs:
        occurrence = occurrence_span(spans, job)
        [round_span] = [s for s in spans if span_id(s) == parent_of(occurrence)]
        assert round_span["name"] == "scheduler round"
        assert round_span["attributes"]["ultimat3_jobs.round.fired"] >= 1
        assert job.key in occurrence["attributes"]["ultimat3_jobs.keys"]
        [ran] = children(spans, occurrence, f"run {job.name}")
        assert service(ran) == "run_worker"
        assert ran["kind"] == "SpanKind.CONSUMER"
        assert ran["attributes"]["messaging.message.id"] == str(job.pk)


def test_traces__no_provider_no_traceparent_and_no_span(
    tmp_path: Path, processes: list[Process]
) -> None:
    fire(tmp_path, processes)
    run(tmp_path, processes, "worker", "run_worker", "--burst")
    assert Job.objects.filter(task=TASK, status="succeeded").exists()
    assert set(Job.objects.values_list("trace_context", flat=True)) == {""}
    assert list(tmp_path.glob("*.jsonl")) == []


@pytest.mark.postgres
@pytest.mark.parametrize("relay_traced", [True, False], ids=["relay-traced", "relay-untraced"])
def test_traces__through_a_relayed_celery_task_with_celerys_instrumentation(
    relay_traced: bool,
    tmp_path: Path,
    processes: list[Process],
    workers: list[CeleryWorker],
    broker: redis.Redis,
    redis_server: RedisServer,
) -> None:
    path = tmp_path / "spans.jsonl"
    traced = {"ULTIMAT3_TRACES": str(path)}
    fire(tmp_path, processes, **relay_env(redis_server), **traced)
    relay = relay_env(redis_server, **(traced if relay_traced else {}))
    run(tmp_path, processes, "relay", "run_relay", "--burst", **relay)
    start_worker(tmp_path, workers, redis_server, **traced)
    wait_for(lambda: all_done(RELAYED_TASK), 60, "every relayed row done")
    jobs = list(Job.objects.filter(task=RELAYED_TASK))

    def ran() -> list[dict[str, Any]]:
        found = [s for s in read_spans(path) if s["name"] == "run/demo.write_row"]
        return found if len(found) >= len(jobs) else []

    wait_for(ran, 30, "the Celery worker's run spans")
    spans = read_spans(path)
    for job in jobs:
        occurrence = occurrence_span(spans, job)
        if relay_traced:
            # Celery's publish span, in the relay, continues the occurrence's trace.
            [published] = children(spans, occurrence, "apply_async/demo.write_row")
            assert service(published) == "run_relay"
        else:
            # The relay traces nothing: the header it passes on is the occurrence's own.
            assert not [s for s in spans if service(s) == "run_relay"]
            published = occurrence
        [run_span] = children(spans, published, "run/demo.write_row")
        assert service(run_span) == "celery"
        assert run_span["kind"] == "SpanKind.CONSUMER"
