"""Sentry Crons check-ins against a real database: a round opens each monitored occurrence, the
worker that ends its last job closes it, once; with a transport that records envelopes."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
import sentry_sdk
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ultimat3_jobs.checkins import CheckIns, watched_tasks
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.conf import get_settings
from ultimat3_jobs.cron import parse
from ultimat3_jobs.declarations import job
from ultimat3_jobs.handles import JobHandle, TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import CheckIn, Job, JobStatus, Occurrence
from ultimat3_jobs.planner import PlannedOccurrence
from ultimat3_jobs.registry import Registry
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.store import store_for
from ultimat3_jobs.worker import Worker
from ultimat3_jobs.zones import resolve_zone

from ..sentry_support import by_check_in, check_ins, envelopes, occurrence_check_in
from .factories import demo_ping

__all__ = ["envelopes"]

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
AT = datetime(2026, 6, 1, 3, tzinfo=UTC)


def monitored(
    name: str,
    entries: list[tuple[JobHandle, dict[str, Any]]],
    *,
    monitor: Any = True,
    cron: str = "* * * * *",
    tz: str = "Europe/Paris",
) -> TaskHandle:
    return TaskHandle(
        lambda occurrence: [(handle, {**data, "label": f"{data.get('label', '')}{occurrence}"})
                            for handle, data in entries],
        name=name,
        schedule=parse(cron),
        zone=resolve_zone(tz, name),
        catch_up="skip",
        max_catch_up=10,
        monitor=monitor,
    )  # fmt: skip


def scheduled_job(task: str, occurrence: datetime, status: str, *, part: int = 1) -> Job:
    return Job.objects.create(
        name="demo.ping",
        key=f"{task}:{int(occurrence.timestamp() * 1000)}:{part}:{uuid.uuid4().hex}",
        input={"label": "x"},
        status=status,
        run_at=occurrence,
        created_at=occurrence,
        finished_at=None if status in (JobStatus.QUEUED, JobStatus.RUNNING) else occurrence,
        task=task,
        occurrence=occurrence,
        enqueued_by="scheduler",
    )


# -- the store: closing an occurrence once ---------------------------------------------------------


@pytest.mark.django_db
def test_close_occurrences__closes_once_when_the_last_job_has_ended() -> None:
    store = store_for()
    first = scheduled_job("m.nightly", AT, JobStatus.SUCCEEDED, part=1)
    last = scheduled_job("m.nightly", AT, JobStatus.RUNNING, part=2)

    assert store.close_occurrences([first.pk], tasks=["m.nightly"]) == []

    Job.objects.filter(pk=last.pk).update(status=JobStatus.SUCCEEDED, finished_at=AT)
    [closed] = store.close_occurrences([first.pk, last.pk], tasks=["m.nightly"])
    assert (closed.task, closed.occurrence, closed.status) == ("m.nightly", AT, "ok")
    # Whoever asks again, for either job, closes nothing: it was sent once.
    assert store.close_occurrences([last.pk], tasks=["m.nightly"]) == []
    assert store.close_occurrences([first.pk], tasks=["m.nightly"]) == []
    assert CheckIn.objects.get().status == "ok"


@pytest.mark.django_db
@pytest.mark.parametrize("again_ends", ["first", "last"])
def test_close_occurrences__a_backfill_again_of_a_fired_occurrence_neither_holds_nor_closes_it(
    again_ends: str,
) -> None:
    # `backfill_task --again` added a job to an occurrence the round had fired: ended last, it
    # was no job whose end closes the occurrence, yet the occurrence waited for it: never closed.
    store = store_for()
    scheduled = scheduled_job("m.rerun", AT, JobStatus.RUNNING)
    Occurrence.objects.create(task="m.rerun", outcome="fired", occurrence=AT, recorded_at=AT)
    again = scheduled_job("m.rerun", AT, JobStatus.RUNNING, part=2)
    Job.objects.filter(pk=again.pk).update(
        enqueued_by="backfill:ops", created_at=AT + timedelta(hours=1)
    )
    first, last = (again, scheduled) if again_ends == "first" else (scheduled, again)

    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED, finished_at=AT)
    closed = store.close_occurrences([first.pk], tasks=["m.rerun"])
    assert [c.status for c in closed] == ([] if first is again else ["ok"])
    Job.objects.filter(pk=last.pk).update(status=JobStatus.FAILED, finished_at=AT)
    closed += store.close_occurrences([last.pk], tasks=["m.rerun"])
    # Closed once, when the scheduled run's job ended, by that job's outcome alone.
    assert [c.status for c in closed] == (["error"] if last is scheduled else ["ok"])


@pytest.mark.django_db
def test_close_occurrences__one_failed_job_makes_it_an_error() -> None:
    ok = scheduled_job("m.nightly", AT, JobStatus.SUCCEEDED, part=1)
    failed = scheduled_job("m.nightly", AT, JobStatus.FAILED, part=2)
    [closed] = store_for().close_occurrences([ok.pk, failed.pk], tasks=["m.nightly"])
    assert closed.status == "error"


@pytest.mark.django_db
@pytest.mark.parametrize("other", [JobStatus.SUCCEEDED, JobStatus.CANCELLED])
def test_close_occurrences__a_cancelled_job_makes_it_an_error(other: str) -> None:
    # Cancelled, it did not succeed: "ok" says every job did.
    cancelled = scheduled_job("m.nightly", AT, JobStatus.CANCELLED, part=1)
    scheduled_job("m.nightly", AT, other, part=2)
    [closed] = store_for().close_occurrences([cancelled.pk], tasks=["m.nightly"])
    assert closed.status == "error"


@pytest.mark.django_db(transaction=True)
def test_checkins__cancelling_the_last_queued_job_in_the_admin_closes_its_occurrence(
    envelopes: Path, fresh_registry: Registry
) -> None:
    # No worker will end a cancelled job: left open, Sentry would report a timeout.
    from ultimat3_jobs.declarations import task

    from .admin_support import JOBS_URL, logged_in, staff_user

    ping = demo_ping()

    @task(cron="* * * * *", tz="UTC", name="m.cancelled", monitor=True)
    def cancelled(occurrence: datetime) -> list[Any]:
        return [(ping, {"label": occurrence.isoformat()})]

    handle = fresh_registry.get_task("m.cancelled")
    assert handle is not None
    fire_first_minute(handle)
    [queued] = Job.objects.filter(task="m.cancelled")

    user = staff_user("canceller", "view_job", "change_job")
    logged_in(user).post(
        JOBS_URL, {"action": "cancel_queued", "_selected_action": [queued.pk]}, follow=True
    )

    assert Job.objects.get(pk=queued.pk).status == JobStatus.CANCELLED
    occurrence = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)
    assert by_check_in(envelopes, "m-cancelled") == {
        occurrence_check_in("m.cancelled", occurrence): ["in_progress", "error"]
    }


@pytest.mark.django_db
def test_close_occurrences__only_scheduled_jobs_of_the_monitored_tasks() -> None:
    other = scheduled_job("m.other", AT, JobStatus.SUCCEEDED)
    backfilled = scheduled_job("m.nightly", AT, JobStatus.SUCCEEDED)
    Job.objects.filter(pk=backfilled.pk).update(enqueued_by="backfill:ops")
    direct = scheduled_job("m.nightly", AT + timedelta(minutes=1), JobStatus.SUCCEEDED)
    Job.objects.filter(pk=direct.pk).update(occurrence=None, enqueued_by="code")
    ids = [other.pk, backfilled.pk, direct.pk]
    assert store_for().close_occurrences(ids, tasks=["m.nightly"]) == []


@pytest.mark.django_db
def test_close_occurrences__an_occurrence_whose_jobs_are_still_queued_stays_open() -> None:
    done = scheduled_job("m.nightly", AT, JobStatus.FAILED, part=1)
    scheduled_job("m.nightly", AT, JobStatus.QUEUED, part=2)
    assert store_for().close_occurrences([done.pk], tasks=["m.nightly"]) == []
    assert not CheckIn.objects.exists()


# -- which tasks are monitors ----------------------------------------------------------------------


def test_watched_tasks__the_option_else_the_setting_and_only_what_sentry_can_follow(
    settings: Any,
) -> None:
    ping = demo_ping()
    tasks = [
        monitored("m.on", [(ping, {})], monitor=True),
        monitored("m.default", [(ping, {})], monitor=None),
        monitored("m.off", [(ping, {})], monitor=False),
        monitored("m.fast", [(ping, {})], monitor=None, cron="*/10 * * * * *"),
    ]
    assert set(watched_tasks(tasks, get_settings())) == {"m.on"}
    settings.ULTIMAT3_JOBS = {"SENTRY_CRONS": True}
    watched = watched_tasks(tasks, get_settings())
    assert set(watched) == {"m.on", "m.default"}
    assert watched["m.on"].slug == "m-on"
    assert watched["m.on"].config["timezone"] == "Europe/Paris"


def test_watched_tasks__names_whose_dashes_read_alike_another_keep_monitors_apart() -> None:
    # "billing-nightly.run" and "billing.nightly-run" were both the monitor "billing-nightly-
    # run", each task's in_progress rewriting the other's schedule.
    alike = ["billing-nightly.run", "billing.nightly-run", "a.b.c", "a-b.c", "a.b-c"]
    tasks = [monitored(name, []) for name in [*alike, "solo-task.run"]]
    watched = watched_tasks(tasks, get_settings())
    slugs = [watched[name].slug for name in alike]
    assert len(set(slugs)) == len(alike)
    assert watched["a.b.c"].slug == "a-b-c"  # Without dashes of its own, as it reads.
    assert watched["solo-task.run"].slug == "solo-task-run"  # Alike no other: unchanged.


# -- a round and a worker, in one process ---------------------------------------------------------


@pytest.fixture
def failing_job(fresh_registry: Registry) -> Iterator[JobHandle]:
    @job(name="it.monitored_fails", max_attempts=1)
    def fails(label: str) -> None:
        raise RuntimeError("this job fails")

    yield fails


@pytest.mark.django_db(transaction=True)
def test_checkins__a_round_opens_each_occurrence_and_its_last_job_closes_it(
    envelopes: Path, failing_job: JobHandle
) -> None:
    ping = demo_ping()
    tasks = [
        monitored("m.fine", [(ping, {"label": "a"}), (ping, {"label": "b"})]),
        monitored("m.broken", [(ping, {"label": "a"}), (failing_job, {"label": "b"})],
                  monitor={"checkin_margin": 3, "max_runtime": 7}),
        monitored("m.unwatched", [(ping, {"label": "a"})], monitor=False),
    ]  # fmt: skip
    clock = FrozenClock(T0)
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    checkins = CheckIns(tasks=tasks, inline=True)
    scheduler = Scheduler(
        state=state,
        leader=SoleLeader(),
        clock=clock,
        tasks=tasks,
        drain_on_shutdown=False,
        checkins=checkins,
    )
    scheduler.tick()  # arms every task
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    scheduler.tick()
    occurrence = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)

    opened = check_ins(envelopes)
    assert sorted((c["monitor_slug"], c["status"]) for c in opened) == [
        ("m-broken", "in_progress"),
        ("m-fine", "in_progress"),
    ]
    config = {c["monitor_slug"]: c["monitor_config"] for c in opened}
    assert config["m-fine"] == {
        "schedule": {"type": "crontab", "value": "* * * * *"},
        "timezone": "Europe/Paris",
        "checkin_margin": 1,
        "max_runtime": 30,
    }
    assert (config["m-broken"]["checkin_margin"], config["m-broken"]["max_runtime"]) == (3, 7)

    worker = Worker(
        burst=True,
        concurrency=2,
        poll_interval=timedelta(seconds=0.05),
        drain_on_shutdown=False,
        checkins=CheckIns(tasks=tasks, inline=True),
    )
    assert worker.run() == 0

    assert by_check_in(envelopes, "m-fine") == {
        occurrence_check_in("m.fine", occurrence): ["in_progress", "ok"]
    }
    assert by_check_in(envelopes, "m-broken") == {
        occurrence_check_in("m.broken", occurrence): ["in_progress", "error"]
    }
    assert by_check_in(envelopes, "m-unwatched") == {}
    closing = [c for c in check_ins(envelopes) if c["status"] != "in_progress"]
    # Each closing one carries its monitor's config too: its in_progress may have been lost.
    assert all(
        c["duration"] >= 0 and c["monitor_config"] == config[c["monitor_slug"]] for c in closing
    )
    assert set(CheckIn.objects.values_list("task", "status")) == {
        ("m.fine", "ok"),
        ("m.broken", "error"),
    }


@pytest.mark.django_db
def test_checkins__a_paused_task_sends_nothing(envelopes: Path) -> None:
    from ultimat3_jobs.models import Task

    tasks = [monitored("m.paused", [(demo_ping(), {})])]
    clock = FrozenClock(T0)
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state,
        clock=clock,
        tasks=tasks,
        drain_on_shutdown=False,
        checkins=CheckIns(tasks=tasks, inline=True),
    )
    scheduler.tick()
    Task.objects.filter(name="m.paused").update(paused=True)
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    scheduler.tick()
    assert not Job.objects.exists()
    assert check_ins(envelopes) == []


@pytest.mark.django_db
def test_checkins__an_occurrence_without_jobs_opens_and_closes_at_once(envelopes: Path) -> None:
    task = TaskHandle(
        lambda occurrence: [],
        name="m.empty",
        schedule=parse("* * * * *"),
        zone=resolve_zone("UTC", "m.empty"),
        catch_up="skip",
        max_catch_up=10,
        monitor=True,
    )
    fire_first_minute(task)
    assert list(by_check_in(envelopes, "m-empty").values()) == [["in_progress", "ok"]]


def fire_first_minute(task: TaskHandle) -> None:
    """Arm ``task`` at ``T0`` and fire its occurrence of 00:01, as a scheduler of it alone."""
    clock = FrozenClock(T0)
    scheduler = sole_scheduler(task, clock)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    scheduler.tick()


def sole_scheduler(task: TaskHandle, clock: FrozenClock) -> Scheduler:
    """A scheduler of ``task`` alone, on ``clock``, sending its check-ins as it goes."""
    return Scheduler(
        state=DatabaseState(node_id="node-a", leader="sole", clock=clock),
        clock=clock,
        tasks=[task],
        drain_on_shutdown=False,
        checkins=CheckIns(tasks=[task], inline=True),
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("ended", ["before", "after"])
def test_checkins__an_occurrence_a_backfill_enqueued_ahead_closes_when_its_jobs_end(
    envelopes: Path, ended: str
) -> None:
    from ultimat3_jobs import backfill
    from ultimat3_jobs import clock as clocks

    task = monitored("m.ahead", [(demo_ping(), {"label": "a"})])
    clock = FrozenClock(T0)
    scheduler = sole_scheduler(task, clock)

    def drain() -> None:
        worker = Worker(
            burst=True,
            poll_interval=timedelta(seconds=0.05),
            drain_on_shutdown=False,
            checkins=CheckIns(tasks=[task], inline=True),
        )
        assert worker.run() == 0

    occurrence = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)
    scheduler.tick()  # arms the task
    with clocks.use(clock):  # The backfill's jobs made at the scheduler's time.
        backfill.run(task, occurrence, occurrence, user="ops", via="test")
    if ended == "before":
        drain()  # Its job ran at its time, before the round reached the occurrence.
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    scheduler.tick()
    if ended == "after":
        drain()
    [job] = Job.objects.filter(task="m.ahead")
    assert (job.enqueued_by, job.status) == ("backfill:ops", JobStatus.SUCCEEDED)
    assert by_check_in(envelopes, "m-ahead") == {
        occurrence_check_in("m.ahead", occurrence): ["in_progress", "ok"]
    }


@pytest.mark.django_db
def test_checkins__without_a_sentry_client_nothing_is_asked_of_the_database() -> None:
    tasks = [monitored("m.nightly", [(demo_ping(), {})])]
    done = scheduled_job("m.nightly", AT, JobStatus.SUCCEEDED)
    checkins = CheckIns(tasks=tasks, inline=True)
    with CaptureQueriesContext(connection) as queries:
        checkins.ended([(done.pk, done.key)])
    assert len(queries) == 0
    assert not CheckIn.objects.exists()


@pytest.mark.django_db
def test_checkins__a_thread_sends_what_the_roles_hand_over(envelopes: Path) -> None:
    # Outside a test's transaction the thread's own connection would see the rows; here it
    # only sends the in_progress of a round, which needs no database.
    from ultimat3_jobs.planner import PlannedOccurrence

    tasks = [monitored("m.nightly", [(demo_ping(), {})])]
    checkins = CheckIns(tasks=tasks)
    checkins.opened([PlannedOccurrence("m.nightly", AT, False, ())])
    assert checkins.flush()
    checkins.close()
    assert list(by_check_in(envelopes, "m-nightly").values()) == [["in_progress", "ok"]]


def test_check_ins__a_project_that_never_imports_sentry_sdk_does_not_load_it() -> None:
    import subprocess
    import sys

    # Both roles and the check-ins set up as run_scheduler and run_worker set them up, with
    # the sentry extra installed (this suite's) but no client: sentry_sdk stays unloaded.
    script = (
        "import sys, django; django.setup()\n"
        "from ultimat3_jobs import checks, scheduler, worker\n"
        "from ultimat3_jobs.checkins import CheckIns, sentry_installed\n"
        "check_ins = CheckIns(tasks=[])\n"
        "check_ins.ended([(1, 'a.task:0:')])\n"
        "check_ins.close(timeout=1.0)\n"
        "print(sentry_installed(), sorted(m for m in sys.modules if m.startswith('sentry_sdk')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ULTIMAT3_SENTRY_ENVELOPES"}
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "[]"]


@pytest.mark.django_db(transaction=True)
def test_checkins__a_job_its_worker_fails_past_the_drain_grace_closes_it_as_an_error(
    envelopes: Path, fresh_registry: Registry
) -> None:
    # Its last attempt given back unfinished by a drain out of grace: the job ended failed,
    # and its occurrence stayed in progress until Sentry timed it out.
    @job(name="it.monitored_slow", max_attempts=1)
    def slow(label: str) -> None:
        time.sleep(1.5)

    task = monitored("m.slow", [(slow, {"label": "a"})], tz="UTC")
    fire_first_minute(task)
    [made] = Job.objects.filter(task="m.slow")

    worker = Worker(
        listen=False,
        poll_interval=timedelta(seconds=0.05),
        drain_grace=timedelta(seconds=0.2),
        drain_on_shutdown=False,
        checkins=CheckIns(tasks=[task], inline=True),
    )
    worker.start()
    deadline = time.monotonic() + 10
    while worker.in_flight() != [made.pk] and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.stop("test")
    worker.join(timeout=5)

    assert Job.objects.get(pk=made.pk).status == JobStatus.FAILED
    occurrence = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)
    assert by_check_in(envelopes, "m-slow") == {
        occurrence_check_in("m.slow", occurrence): ["in_progress", "error"]
    }


class _Ingest(http.server.BaseHTTPRequestHandler):
    """Sentry's envelope endpoint, slow as a remote one: counts the check-ins it is sent."""

    received: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        time.sleep(0.02)  # As a remote Sentry answers.
        for line in body.splitlines():
            item = json.loads(line) if line.startswith(b"{") else {}
            if "check_in_id" in item:  # A check-in's payload (its item header has none).
                self.received.append(item["check_in_id"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slow_ingest() -> Iterator[str]:
    """A Sentry client whose transport queue holds 10 check-ins, sending over HTTP to an
    ``_Ingest`` on this host; ``_Ingest.received`` holds what reached it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Ingest.received = []
    sentry_sdk.init(
        dsn=f"http://public@127.0.0.1:{server.server_address[1]}/1",
        transport_queue_size=10,
        _experiments={"transport_compression_level": 9},  # gzip, brotli installed or not
        default_integrations=False,
        auto_enabling_integrations=False,
    )
    try:
        yield "received"
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)
        server.shutdown()
        server.server_close()


@pytest.mark.usefixtures("slow_ingest")
def test_checkins__a_round_of_more_than_the_clients_queue_holds_sends_every_check_in() -> None:
    # The client's transport queue drops what comes past it: past 100 check-ins in one round
    # (150 hourly tasks), the rest never reached Sentry, their monitors never made.
    tasks = [monitored(f"m.many{i:03d}", [], tz="UTC") for i in range(60)]
    fired = [PlannedOccurrence(task.name, AT, False, ()) for task in tasks]
    CheckIns(tasks=tasks, inline=True).opened(fired)  # An in_progress and an ok each.
    sentry_sdk.flush(timeout=10)
    assert len(_Ingest.received) == 2 * len(tasks)


@pytest.mark.usefixtures("slow_ingest")
def test_checkins__many_small_batches_are_paced_as_one_stream() -> None:
    # Paced batch by batch, each shorter than the pace, none ever waited: rounds of a few
    # monitored occurrences each, one after the other, filled the client's queue all the same.
    tasks = [monitored(f"m.few{i}", [], tz="UTC") for i in range(2)]
    checkins = CheckIns(tasks=tasks, inline=True)
    for minute in range(15):
        at = AT + timedelta(minutes=minute)
        checkins.opened([PlannedOccurrence(task.name, at, False, ()) for task in tasks])
    sentry_sdk.flush(timeout=10)
    assert len(_Ingest.received) == 4 * 15
