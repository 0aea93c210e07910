"""The relay's faults with real processes: ``run_relay`` and ``celery worker`` on the throwaway
PostgreSQL and Redis. A poison row between good ones, the broker stopped and started again, a
rolling deploy whose new task the old relay does not know, and ``ExactlyOnceTask`` bodies that
ignore, reject or replace their message."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import close_old_connections, transaction

from testproject.demo.celery_tasks import once_ends, write_row
from testproject.demo.models import Ping
from ultimat3_jobs.models import Job

from ..integration.test_django_tasks import every_minute, fire_once
from ..redis_server import RedisServer
from .helpers import Process, processes, wait_for
from .test_relay_processes import CeleryWorker, broker, start_relay, start_worker, workers

__all__ = ["broker", "processes", "workers"]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
]


def outbox(name: str, *entries: tuple[Any, dict[str, Any]]) -> list[Job]:
    """One round of a task whose entries are ``entries``: their outbox rows, in order."""
    fire_once(every_minute(lambda at: list(entries), name))
    return list(Job.objects.filter(task=name).order_by("pk"))


def status(job: Job) -> str:
    close_old_connections()
    job.refresh_from_db()
    return job.status


def pings(label: str) -> int:
    close_old_connections()
    return Ping.objects.filter(label=label).count()


def test_relay_processes__a_poison_row_fails_alone_and_an_outage_holds_the_rest_until_back(
    tmp_path: Path,
    processes: list[Process],
    workers: list[CeleryWorker],
    broker: redis.Redis,
    redis_server: RedisServer,
) -> None:
    first, poison, last = outbox(
        "faults.poison",
        (write_row, {"occurrence": "first"}),
        (write_row, {"occurrence": "poison"}),
        (write_row, {"occurrence": "last"}),
    )
    # Written before a deploy renamed the task's keyword: it no longer fits the task.
    Job.objects.filter(pk=poison.pk).update(input={"day": "poison"})
    start_worker(tmp_path, workers, redis_server)
    relay = start_relay(tmp_path, processes, redis_server)

    wait_for(lambda: status(first) == status(last) == "succeeded", 90, "the good rows done")
    assert status(poison) == "failed"
    assert "TypeError" in poison.last_error and "'day'" in poison.last_error
    assert "[jobs.relay.refused]" in poison.last_error
    [refused] = relay.named("jobs.relay.refused")
    assert (refused["job_id"], refused["code"]) == (poison.pk, "jobs.relay.refused")
    assert relay.named("jobs.relay.broker-down") == []
    assert (pings("relayed first"), pings("relayed last"), pings("relayed poison")) == (1, 1, 0)

    # The broker stops: rows written meanwhile stay in the outbox, and go once it is back.
    redis_server.stop()
    try:
        held = outbox(
            "faults.outage", (write_row, {"occurrence": "held a"}), (write_row, {"occurrence": "b"})
        )
        wait_for(lambda: relay.named("jobs.relay.broker-down"), 60, "the relay to see it down")
        time.sleep(1)
        assert [status(job) for job in held] == ["outbox", "outbox"]
        [down, *_] = relay.named("jobs.relay.broker-down")
        assert down["code"] == "jobs.relay.broker-unavailable"
    finally:
        redis_server.start()
    wait_for(lambda: all(status(job) == "succeeded" for job in held), 120, "the held rows done")
    assert relay.named("jobs.relay.recovered")
    assert relay.alive()
    assert [j.status for j in Job.objects.filter(task="faults.poison").order_by("pk")] == [
        "succeeded",
        "failed",
        "succeeded",
    ]


def test_relay_processes__a_rolling_deploy_s_new_task_waits_for_the_new_relay(
    tmp_path: Path,
    processes: list[Process],
    workers: list[CeleryWorker],
    broker: redis.Redis,
    redis_server: RedisServer,
) -> None:
    grace = {"RELAY_UNKNOWN_TASK_GRACE": 10}
    new, behind = outbox(
        "faults.deploy",
        (write_row, {"occurrence": "new"}),
        (write_row, {"occurrence": "behind"}),
    )
    # Written by a scheduler of the new release: a plain task only that release declares.
    Job.objects.filter(pk=new.pk).update(
        name="acceptance.new_release_row", relay="celery", input={"label": "new release"}
    )

    # A relay of the last release puts the row off and hands over the row behind it.
    old = start_relay(tmp_path, processes, redis_server, settings=grace)
    wait_for(lambda: old.named("jobs.relay.target-waiting"), 60, "the old relay to wait")
    wait_for(lambda: status(behind) == "relayed", 30, "the row behind it handed over")
    assert status(new) == "outbox" and new.target_unknown_since is not None
    assert "is not registered" in new.last_error
    # The deploy replaces it with a relay, and a worker, of the new release.
    old.signal(signal.SIGTERM)
    assert old.wait(30) == 0
    release = {"ULTIMAT3_ACCEPTANCE_NEW_RELEASE": "1"}
    start_worker(tmp_path, workers, redis_server, **release)
    relay = start_relay(tmp_path, processes, redis_server, settings=grace, env=release)
    wait_for(lambda: status(new) == status(behind) == "succeeded", 90, "both rows done")
    assert pings("new release") == 1
    assert old.named("jobs.relay.refused") == []

    # A task no release declares: the rows behind it go, and it fails once the grace is over.
    with transaction.atomic():  # Renamed before the relay, woken at commit, sees it.
        never, after = outbox(
            "faults.never",
            (write_row, {"occurrence": "never"}),
            (write_row, {"occurrence": "after"}),
        )
        Job.objects.filter(pk=never.pk).update(name="acceptance.never_deployed")
    wait_for(lambda: status(after) == "succeeded", 60, "the row behind it done")
    assert status(never) == "outbox"
    wait_for(lambda: status(never) == "failed", 60, "the unknown row failed after the grace")
    assert "no relay knew it within RELAY_UNKNOWN_TASK_GRACE (10 s)" in never.last_error
    assert "[jobs.relay.target-unknown]" in never.last_error
    assert never.finished_at is not None and never.target_unknown_since is not None
    assert (never.finished_at - never.target_unknown_since).total_seconds() >= 10
    [refused] = relay.named("jobs.relay.refused")
    assert refused["code"] == "jobs.relay.target-unknown"
    assert relay.alive()


def test_relay_processes__an_exactly_once_task_that_ignores_rejects_or_replaces_runs_once(
    tmp_path: Path,
    processes: list[Process],
    workers: list[CeleryWorker],
    broker: redis.Redis,
    redis_server: RedisServer,
) -> None:
    resend_after = 2.0
    body_log = tmp_path / "bodies.log"
    ways = ("ignore", "reject", "replace", "return")
    entries = [(once_ends, {"label": f"once {how}", "how": how}) for how in ways]
    rows = dict(zip(ways, outbox("faults.ends", *entries), strict=True))
    worker = start_worker(
        tmp_path, workers, redis_server, ULTIMAT3_ACCEPTANCE_BODY_LOG=str(body_log)
    )
    relay = start_relay(tmp_path, processes, redis_server, resend_after=resend_after)

    expected = {
        "ignore": "succeeded",
        "reject": "failed",
        "replace": "succeeded",
        "return": "succeeded",
    }
    wait_for(
        lambda: {how: status(job) for how, job in rows.items()} == expected,
        90,
        "every row ended",
    )
    wait_for(lambda: pings("once replace replacement") == 1, 60, "the replacement run")
    # A loaded machine may resend a row whose first copy is still running; the copy then finds
    # it done. Once every row has ended, nothing is sent again.
    resent = len(relay.named("jobs.relay.resent"))
    time.sleep(resend_after * 3)  # Long past RELAY_RESEND_AFTER: no body ran twice.
    assert {how: status(job) for how, job in rows.items()} == expected
    assert {how: job.attempts for how, job in rows.items()} == dict.fromkeys(ways, 1)
    assert len(relay.named("jobs.relay.resent")) == resent
    assert sorted(body_log.read_text().splitlines()) == sorted(f"once {how}" for how in ways)
    written = {label: pings(label) for label in (f"once {how}" for how in ways)}
    # Ignore and replace commit the body's row; a reject, like a failure, rolls it back.
    assert written == {"once ignore": 1, "once reject": 0, "once replace": 1, "once return": 1}
    assert pings("once replace replacement") == 1
    assert "the body refused its message" in rows["reject"].last_error
    # The worker took every ending in its stride: none stopped its main process.
    assert worker.alive(), worker.log_path.read_text()
    assert "Unrecoverable error" not in worker.log_path.read_text()
