"""Relaying in one process: outbox rows from a round, the relay's passes against a real Redis,
``ExactlyOnceTask`` against the real database, and the admin's view of relayed jobs."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis
from django.core.management import call_command
from django.db import (
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from testproject.demo import background
from testproject.demo.celery_tasks import plain_row, write_row
from testproject.demo.models import Ping
from ultimat3_jobs import tasks_compat
from ultimat3_jobs.celery import DATABASE_HEADER, JOB_HEADER, KEY_HEADER
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.engines import Sent, celery_task_id, send
from ultimat3_jobs.errors import BrokerUnavailableError
from ultimat3_jobs.inputs import input_digest
from ultimat3_jobs.models import Job, Node
from ultimat3_jobs.planner import occurrence_key
from ultimat3_jobs.relay import JOBS_BACKEND, Relay
from ultimat3_jobs.store import store_for

from ..redis_server import RedisServer, point_celery_at
from .factories import running
from .test_django_tasks import MINUTE, every_minute, fire_once

QUEUE = "celery"  # Celery's default queue: where a worker started without -Q consumes.


@pytest.fixture
def broker(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """An empty Redis that the Celery app publishes to."""
    if redis_server.process is None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    point_celery_at(redis_server.url)
    yield client
    client.close()


def messages(client: redis.Redis) -> list[dict[str, Any]]:
    """The headers of the messages waiting in Celery's default queue, oldest first."""
    raw = client.lrange(QUEUE, 0, -1)
    return [json.loads(item)["headers"] for item in reversed(raw)]


def relay(**options: Any) -> Relay:
    return Relay(listen=False, **options)


def celery_round(name: str) -> Job:
    """One round of a task whose entry is the ``ExactlyOnceTask`` ``write_row``: its row."""
    handle = every_minute(lambda at: [(write_row, {"occurrence": at.isoformat()})], name)
    fire_once(handle)
    [job] = Job.objects.filter(task=name)
    return job


def run_message(job: Job, *, using: str = "default") -> Any:
    """Run ``write_row`` as a worker would run the relay's message for ``job``."""
    headers = {JOB_HEADER: job.pk, DATABASE_HEADER: using, KEY_HEADER: job.key}
    return write_row.apply(
        kwargs=job.input, task_id=celery_task_id(job.key), headers=headers, throw=True
    )


# -- the round ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_round__a_celery_entry_is_one_outbox_row_under_the_occurrence_key() -> None:
    job = celery_round("relay.outbox")
    assert job.key == occurrence_key(
        "relay.outbox", MINUTE, f"demo.write_row:{input_digest(job.input)}"
    )
    assert (job.status, job.relay, job.name, job.queue) == (
        "outbox",
        "celery-once",
        "demo.write_row",
        QUEUE,
    )
    assert job.input == {"occurrence": MINUTE.isoformat()}
    # Our own worker never claims an outbox row.
    call_command("run_worker", "--burst", "--no-listen")
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("outbox", 0)


@pytest.mark.django_db
def test_entries__a_celery_entry_takes_keyword_arguments_that_fit_it() -> None:
    from ultimat3_jobs.errors import InvalidJobInputError

    bad = every_minute(lambda at: [(write_row, {"day": "x"})], "relay.bad")
    with pytest.raises(InvalidJobInputError, match="does not fit"):
        bad.entries(MINUTE)
    plain = every_minute(lambda at: [(plain_row, {"label": "x"})], "relay.plain")
    [(handle, _)] = plain.entries(MINUTE)
    assert handle.relay == "celery"


# -- the relay ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_relay__publishes_with_the_task_id_of_the_key_and_records_it(
    broker: redis.Redis,
) -> None:
    job = celery_round("relay.send")
    assert relay().relay_once() == 1
    job.refresh_from_db()
    assert job.status == "relayed"
    assert job.engine_id == celery_task_id(job.key)
    assert job.relayed_at is not None
    assert job.attempts == 1
    [headers] = messages(broker)
    assert headers["id"] == job.engine_id
    assert headers["task"] == "demo.write_row"
    assert (headers[JOB_HEADER], headers[KEY_HEADER]) == (job.pk, job.key)
    # Nothing more to send: a second pass publishes nothing.
    assert relay().relay_once() == 0
    assert len(messages(broker)) == 1


@pytest.mark.django_db
def test_relay__a_relay_whose_clock_runs_ahead_sends_nothing_before_its_time(
    broker: redis.Redis,
) -> None:
    # Its outbox claims compared run_at with its own clock: 10 min ahead, it sent a row due in
    # 3 min at once.
    job = celery_round("relay.later")
    Job.objects.filter(pk=job.pk).update(run_at=timezone.now() + timedelta(minutes=3))
    ahead = relay(clock=FrozenClock(timezone.now() + timedelta(minutes=10)))
    ahead._heartbeat()  # What its loop does before a pass: the clock is measured.
    assert ahead.relay_once() == 0
    assert Job.objects.get(pk=job.pk).status == "outbox"
    skew = Node.objects.get(node_id=ahead.node_id).clock_skew_ms
    assert skew is not None and skew > 9 * 60_000


@pytest.mark.django_db
def test_relay__resends_an_exactly_once_task_not_done_in_time_with_the_same_id(
    broker: redis.Redis,
) -> None:
    job = celery_round("relay.resend")
    relay().relay_once()
    # Not resent while it is young.
    assert relay(resend_after=timedelta(hours=1)).relay_once() == 0
    Job.objects.filter(pk=job.pk).update(relayed_at=datetime(2026, 1, 1, tzinfo=UTC))
    again = relay(resend_after=timedelta(minutes=5))
    assert again.relay_once() == 1
    assert again.stats.resent == 1
    first, second = messages(broker)
    assert first["id"] == second["id"] == celery_task_id(job.key)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("relayed", 2)


@pytest.mark.django_db
def test_relay__never_resends_a_plain_celery_task(broker: redis.Redis) -> None:
    handle = every_minute(lambda at: [(plain_row, {"label": at.isoformat()})], "relay.plain2")
    fire_once(handle)
    relay().relay_once()
    Job.objects.filter(task="relay.plain2").update(relayed_at=datetime(2026, 1, 1, tzinfo=UTC))
    assert relay(resend_after=timedelta(minutes=5)).relay_once() == 0
    assert len(messages(broker)) == 1


@pytest.mark.django_db
def test_relay__a_broker_that_is_down_keeps_the_row_until_it_is_back(
    broker: redis.Redis, redis_server: RedisServer
) -> None:
    job = celery_round("relay.down")
    redis_server.stop()
    try:
        with pytest.raises(BrokerUnavailableError) as raised:
            relay().relay_once()
        assert raised.value.code == "jobs.relay.broker-unavailable"
        job.refresh_from_db()
        assert (job.status, job.engine_id, job.attempts) == ("outbox", "", 0)
    finally:
        redis_server.start()
    assert relay().relay_once() == 1
    job.refresh_from_db()
    assert job.status == "relayed"
    assert [h["id"] for h in messages(broker)] == [celery_task_id(job.key)]


@pytest.mark.django_db
def test_relay__ready_again_once_another_relay_sent_what_it_could_not(
    broker: redis.Redis, redis_server: RedisServer
) -> None:
    celery_round("relay.ready")
    first = relay()
    redis_server.stop()
    try:
        assert first._pass() is False
        assert not first.broker_reachable
    finally:
        redis_server.start()
    assert relay().relay_once() == 1  # Another relay, once the broker is back.
    first._pass()  # Nothing left for it to send.
    assert first.broker_reachable


@pytest.mark.django_db
def test_relay__a_broker_that_hangs_is_down_after_the_publish_timeout(
    broker: redis.Redis, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testproject.celery import app
    from ultimat3_jobs import engines

    job = celery_round("relay.hung")
    options = app.conf.broker_transport_options
    # As in a fresh relay process: no timeout of the project's, this app not bounded yet.
    app.conf.broker_transport_options = {
        name: value for name, value in options.items() if not name.startswith("socket_")
    }
    monkeypatch.setattr(engines, "PUBLISH_SOCKET_TIMEOUT", 0.3)
    engines._BOUNDED_APPS.discard(id(app))
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)  # Up, its port open, answering nothing.
    # Woken in any case: a publish with no timeout would otherwise wait for ever.
    waking = threading.Timer(30, redis_server.process.send_signal, (signal.SIGCONT,))
    waking.start()
    try:
        started = time.monotonic()
        try:
            relay().relay_once()
        except BrokerUnavailableError as down:
            assert "Timeout" in str(down)
            job.refresh_from_db()
            assert (job.status, job.engine_id) == ("outbox", "")
        # Back well before the broker wakes: redis-py retries, each try timed out. (A retry
        # has also been seen to go through, the row then relayed.)
        assert time.monotonic() - started < 25
    finally:
        waking.cancel()
        redis_server.process.send_signal(signal.SIGCONT)
    try:
        relay().relay_once()
        job.refresh_from_db()
        assert job.status == "relayed"
        # A publish that timed out may have reached the broker all the same (at least once),
        # each copy under the row's one task id.
        assert {h["id"] for h in messages(broker)} == {celery_task_id(job.key)}
        assert app.conf.broker_transport_options["socket_timeout"] == 0.3
    finally:
        app.conf.broker_transport_options = options
        engines._BOUNDED_APPS.discard(id(app))
        point_celery_at("redis://127.0.0.1:1/0")  # Drops the pool made with those options.
        point_celery_at(redis_server.url)


def test_relay__keeps_the_socket_timeouts_a_project_set_for_its_broker() -> None:
    from celery import Celery

    from ultimat3_jobs import engines

    app = Celery(broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_transport_options = {"socket_timeout": 2, "visibility_timeout": 60}
    engines._bound_publishing(app)
    assert app.conf.broker_transport_options == {
        "socket_timeout": 2,
        "socket_connect_timeout": engines.PUBLISH_SOCKET_TIMEOUT,
        "visibility_timeout": 60,
    }
    other = Celery(broker="memory://", set_as_current=False)
    engines._bound_publishing(other)
    assert not other.conf.broker_transport_options  # Only a Redis broker's are bounded.


@pytest.mark.django_db
def test_relay__a_task_it_does_not_know_fails_the_row_with_a_fix_after_the_grace(
    broker: redis.Redis,
) -> None:
    job = celery_round("relay.unknown")
    Job.objects.filter(pk=job.pk).update(name="demo.no_such_task")
    clock = FrozenClock(MINUTE + timedelta(seconds=1))
    relayer = relay(clock=clock)
    assert relayer.relay_once() == 0
    job.refresh_from_db()
    assert job.status == "outbox"  # Waiting for a relay that knows it: see test_relay_faults.
    clock.advance(relayer.unknown_task_grace)
    assert relayer.relay_once() == 0
    job.refresh_from_db()
    assert job.status == "failed"
    assert "not registered" in job.last_error
    assert "fix:" in job.last_error
    assert relayer.stats.refused == 1
    # Retried from the admin, it goes back to the outbox, not to our worker's queue.
    assert store_for().retry_failed(Job.objects.filter(pk=job.pk)) == 1
    job.refresh_from_db()
    assert job.status == "outbox"


@pytest.mark.django_db
def test_relay__a_django_task_on_an_immediate_backend_runs_once_and_is_done() -> None:
    handle = every_minute(
        lambda at: [(background.record_immediately, {"label": f"imm {at:%H:%M}"})], "relay.imm"
    )
    fire_once(handle)
    [job] = Job.objects.filter(task="relay.imm")
    assert (job.status, job.relay, job.backend) == ("outbox", "tasks", "immediate")
    assert relay().relay_once() == 1
    assert relay().relay_once() == 0
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert job.engine_id
    assert job.done_at is not None
    assert job.return_value == "imm 00:01"
    assert list(Ping.objects.values_list("label", flat=True)) == ["imm 00:01"]


@pytest.mark.django_db
def test_relay__a_django_task_on_a_dummy_backend_is_handed_over_once() -> None:
    from django_tasks import task_backends

    dummy: Any = task_backends["elsewhere"]  # DummyBackend: clear() and results
    dummy.clear()
    handle = every_minute(lambda at: [(background.elsewhere, {"label": "x"})], "relay.dummy")
    fire_once(handle)
    assert relay().relay_once() == 1
    assert relay().relay_once() == 0
    [job] = Job.objects.filter(task="relay.dummy")
    [result] = dummy.results
    assert (job.status, job.engine_id) == ("relayed", result.id)
    assert result.kwargs == {"label": "x"}


@pytest.mark.django_db
def test_send__refuses_a_relay_kind_it_does_not_know() -> None:
    from ultimat3_jobs.errors import RelayTargetError

    job = celery_round("relay.kind")
    job.relay = "carrier-pigeon"
    with pytest.raises(RelayTargetError, match="carrier-pigeon"):
        send(job, "default")


# -- ExactlyOnceTask ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_exactly_once_task__a_second_delivery_changes_nothing() -> None:
    job = celery_round("relay.once")
    first = run_message(job)
    assert first.result == job.key  # The body sees its key, for its own outside dedupe.
    second = run_message(job)
    assert second.result == job.key  # The recorded return value, not a second run.
    assert Ping.objects.filter(label=f"relayed {MINUTE.isoformat()}").count() == 1
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert job.done_at is not None
    assert job.engine_id == celery_task_id(job.key)


@pytest.mark.django_db
def test_exactly_once_task__a_body_that_raises_rolls_back_and_fails_the_row() -> None:
    job = celery_round("relay.raise")
    Job.objects.filter(pk=job.pk).update(input={"occurrence": "explode"})
    job.refresh_from_db()
    with pytest.raises(RuntimeError, match="after writing its row"):
        run_message(job)
    assert not Ping.objects.exists()
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.done_at is not None
    assert "RuntimeError" in job.last_error


@pytest.mark.django_db
def test_exactly_once_task__called_without_a_relayed_message_runs_as_a_plain_task() -> None:
    result = write_row.apply(kwargs={"occurrence": "direct"}, throw=True)
    assert result.result == ""
    assert Ping.objects.filter(label="relayed direct").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_exactly_once_task__two_copies_at_once_wait_for_each_other() -> None:
    job = celery_round("relay.race")
    holding = threading.Event()
    release = threading.Event()
    outcome: list[Any] = []

    def first_copy() -> None:
        # Holds the row lock as a body in flight would, then commits the row done.
        try:
            with transaction.atomic():
                store_for("default").lock_relayed(job_id=job.pk)
                holding.set()
                release.wait(30)
                Ping.objects.create(label=f"relayed {MINUTE.isoformat()}")
                store_for("default").relayed_done(job_id=job.pk, now=MINUTE)
        finally:
            close_old_connections()
            connection.close()

    def second_copy() -> None:
        try:
            outcome.append(run_message(job).result)
        finally:
            connection.close()

    one = threading.Thread(target=first_copy)
    one.start()
    assert holding.wait(30)
    two = threading.Thread(target=second_copy)
    two.start()
    two.join(0.5)
    blocked = two.is_alive()  # Waiting on the lock, not running the body beside the first.
    release.set()
    one.join(30)
    two.join(30)
    assert blocked
    assert outcome == [None]
    assert Ping.objects.filter(label=f"relayed {MINUTE.isoformat()}").count() == 1


@pytest.mark.django_db
def test_plain_celery_task__its_row_is_marked_done_when_it_returns() -> None:
    handle = every_minute(lambda at: [(plain_row, {"label": "plain"})], "relay.plain3")
    fire_once(handle)
    [job] = Job.objects.filter(task="relay.plain3")
    headers = {JOB_HEADER: job.pk, DATABASE_HEADER: "default", KEY_HEADER: job.key}
    plain_row.apply(kwargs=job.input, headers=headers, throw=True)
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert job.done_at is not None


# -- counts ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_relay_counts__outbox_relayed_done_and_stuck(broker: redis.Redis) -> None:
    done = celery_round("relay.count-done")
    waiting = celery_round("relay.count-relayed")
    relay().relay_once()
    run_message(done)
    Job.objects.filter(pk=waiting.pk).update(relayed_at=datetime(2026, 1, 1, tzinfo=UTC))
    celery_round("relay.count-outbox")
    counts = relay().counts()
    assert counts == {"outbox": 1, "relayed": 1, "done": 1, "failed": 0, "stuck": 1}


# -- the loop -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_relay__burst_sends_what_is_due_and_exits(broker: redis.Redis) -> None:
    from ultimat3_jobs.models import Node

    jobs = [celery_round(f"relay.burst-{n}") for n in range(3)]
    call_command("run_relay", "--burst", "--no-listen", "--batch", "2")
    assert sorted(h["id"] for h in messages(broker)) == sorted(
        celery_task_id(job.key) for job in jobs
    )
    assert set(
        Job.objects.filter(task__startswith="relay.burst-").values_list("status", flat=True)
    ) == {"relayed"}
    # It said it was a relay, and that it stopped.
    [node] = Node.objects.filter(role="relay")
    assert node.stopped_at is not None


@pytest.mark.django_db(transaction=True)
def test_relay__stop_from_another_thread_ends_run(broker: redis.Redis) -> None:
    relayer = relay(poll_interval=timedelta(seconds=30))
    exit_codes: list[int] = []

    def serve() -> None:
        try:
            exit_codes.append(relayer.run())
        finally:
            connection.close()

    thread = threading.Thread(target=serve)
    thread.start()
    celery_round("relay.stop")
    relayer.life.wake.set()  # As a NOTIFY would.
    for _ in range(600):  # Up to a minute for the pass the wake-up started.
        if messages(broker):
            break
        time.sleep(0.1)
    relayer.stop("test")
    thread.join(30)
    assert not thread.is_alive()
    assert exit_codes == [0]
    assert relayer.status == "stopped"
    assert relayer.stats.sent == 1


@pytest.mark.django_db(transaction=True)
def test_relay__wake_ups_while_the_broker_is_down_do_not_cut_its_backoff_short() -> None:
    celery_round("relay.backoff")
    tries: list[float] = []

    def down(job: Job, using: str) -> Sent:
        tries.append(time.monotonic())
        raise BrokerUnavailableError("the broker is down", fix="start it", cause=None)

    relayer = relay(poll_interval=timedelta(seconds=0.05), sender=down)

    def serve() -> None:
        try:
            relayer.run()
        finally:
            connection.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        # Rows keep coming while the broker is down: a NOTIFY each, every 10 ms, for 1.2 s.
        for _ in range(120):
            relayer.life.wake.set()
            time.sleep(0.01)
    finally:
        relayer.stop("test")
        thread.join(30)
    assert not thread.is_alive()
    # 0.1, 0.2, 0.4 and 0.8 s apart: four or five passes, however many wake-ups came.
    assert 3 <= len(tries) <= 5, [round(b - a, 3) for a, b in itertools.pairwise(tries)]
    assert relayer.stats.broker_errors == len(tries)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_relay__two_relays_share_the_outbox_without_sending_a_row_twice(
    broker: redis.Redis,
) -> None:
    jobs = [celery_round(f"relay.pair-{n}") for n in range(20)]
    first, second = relay(batch=3), relay(batch=3)
    results: list[int] = []

    def drain(one: Relay) -> None:
        try:
            while True:
                handed = one.relay_once()
                results.append(handed)
                if not handed:
                    return
        finally:
            connection.close()

    threads = [threading.Thread(target=drain, args=(r,)) for r in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    ids = [h["id"] for h in messages(broker)]
    assert sorted(ids) == sorted(celery_task_id(job.key) for job in jobs)
    assert first.stats.sent + second.stats.sent == 20


# -- checks ---------------------------------------------------------------------------------------


def test_checks__a_scheduled_exactly_once_task_that_acks_early_is_warned_about(
    fresh_registry: Any,
) -> None:
    from ultimat3_jobs import task
    from ultimat3_jobs.checks import check_scheduled_jobs
    from ultimat3_jobs.relay_checks import ACKS_LATE_FIX

    def check_relayed_celery_tasks() -> list[Any]:
        return [m for m in check_scheduled_jobs() if m.id == "ultimat3_jobs.W006"]

    @task(cron="0 3 * * *", tz="UTC", name="checks.celery")
    def nightly(occurrence: datetime) -> list[Any]:
        return [(write_row, {"occurrence": "x"})]

    assert check_relayed_celery_tasks() == []  # The project acknowledges late.
    write_row.acks_late = False
    try:
        [warning] = check_relayed_celery_tasks()
    finally:
        write_row.acks_late = True
    assert warning.id == "ultimat3_jobs.W006"
    assert "demo.write_row" in warning.msg
    assert warning.hint == ACKS_LATE_FIX


@pytest.mark.django_db(transaction=True)
def test_relay__a_django_task_failing_on_the_database_inside_enqueue_spares_the_batch() -> None:
    handle = every_minute(
        lambda at: [
            (background.break_transaction, {}),
            (background.record_immediately, {"label": "after"}),
        ],
        "relay.broken",
    )
    fire_once(handle)
    assert relay().relay_once() == 2
    broken, fine = Job.objects.filter(task="relay.broken").order_by("pk")
    assert broken.name.endswith("break_transaction") and broken.status == "failed"
    assert "IntegrityError" in broken.last_error or "null" in broken.last_error.lower()
    assert (fine.status, fine.return_value) == ("succeeded", "after")
    assert list(Ping.objects.values_list("label", flat=True)) == ["after"]


@pytest.mark.django_db
def test_relay__asks_a_backend_that_reports_results_and_marks_finished_tasks_done() -> None:
    from django_tasks import TaskResultStatus, task_backends

    backend: Any = task_backends["reporting"]
    backend.clear()
    handle = every_minute(lambda at: [(background.reported, {"label": "r"})], "relay.reported")
    fire_once(handle)
    relayer = relay()
    relayer.relay_once()
    assert relayer.check_results() == 0  # Still READY there.
    [result] = backend.results
    # The backend's worker would do this; the framework keeps both behind read-only fields.
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", {"done": "r"})
    assert relayer.check_results() == 1
    [job] = Job.objects.filter(task="relay.reported")
    assert (job.status, job.engine_id, job.return_value) == ("succeeded", result.id, {"done": "r"})
    assert job.done_at is not None
    assert relayer.check_results() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "tasks",
    [None, {"default": {"BACKEND": JOBS_BACKEND}}],
    ids=["no_tasks_setting", "jobs_backend_only"],
)
def test_check_results__reads_tasks_before_touching_the_django_tasks_framework(
    settings: Any, monkeypatch: pytest.MonkeyPatch, tasks: dict[str, Any] | None
) -> None:
    # As with only the celery extra installed: the framework's names are not there.
    if tasks is None:
        del settings.TASKS
    else:
        settings.TASKS = tasks
    for name in ("TaskResultStatus", "task_backends"):
        monkeypatch.delattr(tasks_compat, name)
    assert relay().check_results() == 0


def test_entries__a_celery_task_declared_without_typing_takes_any_keywords() -> None:
    from celery import shared_task

    @shared_task(typing=False, name="relay.untyped")
    def untyped(a: int) -> None:
        """Celery passes whatever it is sent."""

    handle = every_minute(lambda at: [(untyped, {"b": 1, "c": [2]})], "relay.untyped-task")
    [(entry, data)] = handle.entries(MINUTE)
    assert (entry.name, data) == ("relay.untyped", {"b": 1, "c": [2]})


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_relay__a_round_wakes_a_listening_relay(broker: redis.Redis) -> None:
    # Polling every ten minutes: only the round's NOTIFY can bring the row out within the wait.
    relayer = Relay(listen=True, poll_interval=timedelta(minutes=10))

    def serve() -> None:
        try:
            relayer.run()
        finally:
            connection.close()  # This thread's own connection.

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        for _ in range(600):
            if relayer._listener is not None and relayer._listener.listening.is_set():
                break
            time.sleep(0.1)
        time.sleep(1)  # The pass the listener's own wake-up started, with nothing to send.
        job = celery_round("relay.wake")
        for _ in range(600):
            if messages(broker):
                break
            time.sleep(0.1)
        assert [h["id"] for h in messages(broker)] == [celery_task_id(job.key)]
    finally:
        relayer.stop("test")
        thread.join(30)


@pytest.mark.django_db
def test_run_relay__stats_prints_the_outbox_by_state(broker: redis.Redis) -> None:
    import io

    celery_round("relay.stats")
    out = io.StringIO()
    call_command("run_relay", "--stats", stdout=out)
    assert json.loads(out.getvalue()) == {
        "done": 0,
        "failed": 0,
        "outbox": 1,
        "relayed": 0,
        "stuck": 0,
    }


@pytest.mark.django_db
def test_relay__a_surprise_from_the_engine_is_logged_and_the_row_sent_on_the_next_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:

    job = celery_round("relay.surprise")
    calls: list[int] = []

    def flaky(row: Job, using: str) -> Sent:
        calls.append(row.pk)
        if len(calls) == 1:
            raise RuntimeError("the engine surprised us")
        return Sent("engine-1")

    relayer = Relay(
        listen=False, burst=True, poll_interval=timedelta(milliseconds=10), sender=flaky
    )
    assert relayer.run() == 0
    assert calls == [job.pk, job.pk]
    job.refresh_from_db()
    assert (job.status, job.engine_id, job.attempts) == ("relayed", "engine-1", 1)
    failed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.relay.loop-failed"]
    assert len(failed) == 1
    assert "surprised" in getattr(failed[0], "fields", {})["error"]


@pytest.mark.django_db
def test_run_relay__a_burst_that_gave_up_on_a_surprise_names_it_not_the_database() -> None:
    from django.core.management import CommandError

    from ultimat3_jobs.management.roles import relay_exit

    with pytest.raises(CommandError) as raised:
        relay_exit(RuntimeError("the engine surprised us"), "default")
    assert raised.value.returncode == 3
    assert str(raised.value).startswith(
        "RuntimeError: the engine surprised us [jobs.unexpected-error]; this burst gave up"
    )
    with pytest.raises(CommandError, match=r"^the database 'default' failed: .*\[jobs.database-"):
        relay_exit(OperationalError("connection refused"), "default")


@pytest.mark.django_db
def test_run_worker__a_burst_that_gave_up_says_what_on_with_its_code_and_fix() -> None:
    from django.core.management import CommandError

    from ultimat3_jobs.management.roles import worker_exit

    # A statement timeout, say: it was told as a database that could not be reached.
    with pytest.raises(CommandError) as raised:
        worker_exit(3, "default", psycopg.errors.QueryCanceled("canceling statement"))
    assert raised.value.returncode == 3
    assert "[jobs.database-timeout]" in str(raised.value)
    assert "could not be reached" not in str(raised.value)
    with pytest.raises(CommandError) as raised:
        worker_exit(3, "default", RuntimeError("the claim surprised us"))
    assert str(raised.value).startswith(
        "RuntimeError: the claim surprised us [jobs.unexpected-error]; this burst gave up, "
        "the jobs it did not run wait in the queue"
    )


@pytest.mark.django_db(transaction=True)
def test_relay__backing_off_from_a_broker_that_is_down_it_still_heartbeats() -> None:
    # Its database up: alive, not ready. Its heartbeat stopped for the backoff's 2-30 s, and
    # the health checks judged it dead.
    celery_round("relay.broker-down")

    def down(row: Job, using: str) -> Sent:
        raise BrokerUnavailableError("the broker refused the connection", fix="start it")

    relayer = Relay(
        node_id="r-broker-down", listen=False, poll_interval=timedelta(seconds=5), sender=down
    )
    relayer.node.every = timedelta(seconds=0.2)

    with running(relayer):
        time.sleep(0.6)
        close_old_connections()
        first = Node.objects.get(node_id="r-broker-down").last_seen_at
        time.sleep(1.0)
        then = Node.objects.get(node_id="r-broker-down").last_seen_at
    assert relayer.backoff.failures >= 1
    assert then > first
