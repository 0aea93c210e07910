"""The relay's faults in one process, against a real Redis and the real database: a row the
engine refuses fails alone, a broker that is down holds every row, a task unknown here waits
out its grace, and ``ExactlyOnceTask`` ends its row whichever way its body ends."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import current_app
from celery.exceptions import Ignore, InvalidTaskError, Reject
from django.db import DatabaseError
from kombu.exceptions import EncodeError, OperationalError

from testproject.demo import background
from testproject.demo.celery_tasks import once_ends, plain_ends, plain_row, write_row
from testproject.demo.models import Ping
from ultimat3_jobs.celery import DATABASE_HEADER, JOB_HEADER, KEY_HEADER
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.engines import broker_down, celery_task_id
from ultimat3_jobs.errors import BrokerUnavailableError, RelayRefusedError
from ultimat3_jobs.models import Job
from ultimat3_jobs.relay import TARGET_RETRY, Relay
from ultimat3_jobs.store import store_for

from ..redis_server import RedisServer, point_celery_at
from .test_django_tasks import MINUTE, every_minute, fire_once
from .test_relay import messages

NOW = MINUTE + timedelta(seconds=1)


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


def outbox(name: str, *entries: tuple[Any, dict[str, Any]]) -> list[Job]:
    """One round of a task whose entries are ``entries``: their outbox rows, in order."""
    fire_once(every_minute(lambda at: list(entries), name))
    return list(Job.objects.filter(task=name).order_by("pk"))


def relay(clock: FrozenClock | None = None, **options: Any) -> Relay:
    return Relay(listen=False, clock=clock or FrozenClock(NOW), **options)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if getattr(r, "event", "") == name]


def run_as_worker(job: Job) -> Any:
    """Call ``once_ends`` for ``job``'s message as a worker's pool does: not eagerly, so
    ``self.replace()`` publishes its replacement."""
    headers = {JOB_HEADER: job.pk, DATABASE_HEADER: "default", KEY_HEADER: job.key}
    once_ends.push_request(id=celery_task_id(job.key), is_eager=False, headers=headers)
    try:
        return once_ends(**job.input)
    finally:
        once_ends.pop_request()


def run_message(job: Job, task: Any = once_ends) -> Any:
    """Run ``task`` as a worker runs the relay's message for ``job``."""
    headers = {JOB_HEADER: job.pk, DATABASE_HEADER: "default", KEY_HEADER: job.key}
    return task.apply(kwargs=job.input, task_id=celery_task_id(job.key), headers=headers)


# -- what an error from the engine means ----------------------------------------------------------


def _wrapped_connection_error() -> RuntimeError:
    try:
        raise ConnectionRefusedError("connection refused")
    except ConnectionRefusedError as cause:
        wrapper = RuntimeError("the backend could not enqueue")
        wrapper.__cause__ = cause
        return wrapper


@pytest.mark.parametrize(
    ("error", "down"),
    [
        pytest.param(OperationalError("Connection refused"), True, id="kombu"),
        pytest.param(redis.ConnectionError("Error 111"), True, id="redis_connection"),
        pytest.param(redis.TimeoutError("Timeout reading"), True, id="redis_timeout"),
        pytest.param(ConnectionResetError("reset by peer"), True, id="connection_reset"),
        pytest.param(TimeoutError("timed out"), True, id="timeout"),
        pytest.param(DatabaseError("a wrapper is not a connection error"), False, id="database"),
        pytest.param(_wrapped_connection_error(), True, id="caused_by_a_connection_error"),
        pytest.param(TypeError("got an unexpected keyword argument 'day'"), False, id="type"),
        pytest.param(ValueError("time_limit is out of range"), False, id="value"),
        pytest.param(KeyError("a key redis' transport calls a connection error"), False, id="key"),
        pytest.param(EncodeError("not JSON serializable"), False, id="encode"),
        pytest.param(InvalidTaskError("bad"), False, id="invalid_task"),
    ],
)
def test_broker_down__only_connection_and_transport_errors_mean_the_engine_is_down(
    error: BaseException, down: bool
) -> None:
    broker = current_app.connection_for_write()
    transport = (*broker.connection_errors, *broker.channel_errors)
    assert broker_down(error, transport) is down


# -- a poison row between good ones ---------------------------------------------------------------


@pytest.mark.django_db
def test_relay__a_row_celery_refuses_fails_alone_and_the_rows_behind_it_are_sent(
    broker: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first, poison, last = outbox(
        "faults.poison",
        (write_row, {"occurrence": "first"}),
        (write_row, {"occurrence": "poison"}),
        (write_row, {"occurrence": "last"}),
    )
    # A deploy renamed the keyword: the row written before it no longer fits the task.
    Job.objects.filter(pk=poison.pk).update(input={"day": "poison"})
    relayer = relay()
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.relay"):
        assert relayer.relay_once() == 2
    statuses = dict(Job.objects.filter(task="faults.poison").values_list("pk", "status"))
    assert statuses == {first.pk: "relayed", poison.pk: "failed", last.pk: "relayed"}
    assert [h["id"] for h in messages(broker)] == [
        celery_task_id(first.key),
        celery_task_id(last.key),
    ]
    poison.refresh_from_db()
    assert poison.last_error.startswith(
        f'Celery refused task "demo.write_row" for job {poison.pk}: TypeError: '
    )
    assert "unexpected keyword argument 'day'" in poison.last_error
    assert (
        "[jobs.relay.refused]\nfix: make the entry's input fit the arguments" in poison.last_error
    )
    [refused] = events(caplog, "jobs.relay.refused")
    assert (refused["job_id"], refused["code"]) == (poison.pk, RelayRefusedError.code)
    assert events(caplog, "jobs.relay.broker-down") == []
    assert (relayer.stats.sent, relayer.stats.refused) == (2, 1)
    # Nothing is left for the next pass: the poison row is done with.
    assert relayer.relay_once() == 0


@pytest.mark.django_db
def test_relay__any_other_error_from_apply_async_is_that_row_s_refusal(
    broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    [refused, fine] = outbox(
        "faults.invalid", (plain_row, {"label": "refused"}), (write_row, {"occurrence": "x"})
    )

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise InvalidTaskError("Task keyword arguments must be a mapping")

    monkeypatch.setattr(plain_row, "apply_async", refuse)
    assert relay().relay_once() == 1
    refused.refresh_from_db()
    fine.refresh_from_db()
    assert (refused.status, fine.status) == ("failed", "relayed")
    assert "InvalidTaskError: Task keyword arguments must be a mapping" in refused.last_error


@pytest.mark.django_db
def test_relay__a_broker_that_is_down_holds_every_row_and_sends_them_when_back(
    broker: redis.Redis, redis_server: RedisServer
) -> None:
    rows = outbox(
        "faults.down",
        (write_row, {"occurrence": "a"}),
        (write_row, {"occurrence": "b"}),
    )
    redis_server.stop()
    try:
        with pytest.raises(BrokerUnavailableError) as raised:
            relay().relay_once()
        assert raised.value.code == "jobs.relay.broker-unavailable"
        assert type(raised.value.cause).__name__ == "OperationalError"
        assert set(Job.objects.filter(task="faults.down").values_list("status", flat=True)) == {
            "outbox"
        }
    finally:
        redis_server.start()
    assert relay().relay_once() == 2
    assert [h["id"] for h in messages(broker)] == [celery_task_id(job.key) for job in rows]


@pytest.mark.django_db
def test_relay__a_message_that_breaks_the_broker_s_connection_waits_and_the_rows_behind_go(
    broker: redis.Redis, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis drops the connection of a command larger than proto-max-bulk-len: the publish
    # fails as an outage would, though the broker takes every other message.
    settings.ULTIMAT3_JOBS = {"RELAY_UNKNOWN_TASK_GRACE": 8}
    before, big, after = outbox(
        "faults.oversized",
        (write_row, {"occurrence": "before"}),
        (write_row, {"occurrence": "x" * 900_000}),
        (write_row, {"occurrence": "after"}),
    )
    limit = str(broker.config_get("proto-max-bulk-len")["proto-max-bulk-len"])
    broker.config_set("proto-max-bulk-len", "1mb")
    try:
        clock = FrozenClock(NOW)
        relayer = relay(clock)
        with caplog.at_level(logging.INFO, logger="ultimat3_jobs.relay"):
            assert relayer.relay_once() == 2
        statuses = dict(Job.objects.filter(task="faults.oversized").values_list("pk", "status"))
        assert statuses == {before.pk: "relayed", big.pk: "outbox", after.pk: "relayed"}
        big.refresh_from_db()
        assert (big.target_unknown_since, big.run_at) == (NOW, NOW + TARGET_RETRY)
        assert f"the engine took job {after.pk} in the same batch; tried again until" in (
            big.last_error
        )
        assert "[jobs.relay.send-failed]\nfix: find what in this row's message" in big.last_error
        [waiting] = events(caplog, "jobs.relay.send-waiting")
        assert (waiting["job_id"], waiting["code"]) == (big.pk, "jobs.relay.send-failed")
        assert events(caplog, "jobs.relay.broker-down") == []
        assert relayer.broker_reachable
        # Alone in its batch, past the grace: it fails, and nothing else waited on it.
        clock.set(NOW + timedelta(seconds=8))
        with pytest.raises(BrokerUnavailableError):
            relayer.relay_once()  # alone, it cannot be told from an outage
        outbox("faults.oversized-next", (write_row, {"occurrence": "next"}))
        assert relayer.relay_once() == 1
    finally:
        broker.config_set("proto-max-bulk-len", limit)
    big.refresh_from_db()
    assert big.status == "failed"
    assert "it failed each time within RELAY_UNKNOWN_TASK_GRACE (8 s)" in big.last_error
    assert [h["id"] for h in messages(broker)] == [
        celery_task_id(job.key)
        for job in (before, after, *Job.objects.filter(task="faults.oversized-next"))
    ]


@pytest.mark.django_db
def test_relay__a_row_of_another_engine_going_through_does_not_clear_a_broker_that_is_down(
    broker: redis.Redis, redis_server: RedisServer, dummy: Any
) -> None:
    celery_row, task_row = outbox(
        "faults.two-engines",
        (write_row, {"occurrence": "a"}),
        (background.elsewhere, {"label": "b"}),
    )
    redis_server.stop()
    try:
        with pytest.raises(BrokerUnavailableError):
            relay().relay_once()
    finally:
        redis_server.start()
    celery_row.refresh_from_db()
    task_row.refresh_from_db()
    # The Tasks backend took its row; the Celery row waits for its broker, not put off.
    assert (task_row.status, celery_row.status) == ("relayed", "outbox")
    assert (celery_row.target_unknown_since, celery_row.last_error) == (None, "")


# -- Django Tasks on another backend: refused, or down ---------------------------------------------


@pytest.fixture
def dummy() -> Any:
    from django_tasks import task_backends

    backend: Any = task_backends["elsewhere"]  # DummyBackend: keeps what it is given
    backend.clear()
    return backend


@pytest.mark.django_db
def test_relay__a_django_task_its_backend_refuses_fails_alone(
    dummy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ultimat3_jobs.tasks_compat import InvalidTaskError

    refused, fine = outbox(
        "faults.tasks-refused",
        (background.elsewhere, {"label": "refused"}),
        (background.elsewhere, {"label": "fine"}),
    )
    enqueue = type(dummy).enqueue

    def picky(self: Any, task: Any, args: Any, kwargs: Any) -> Any:
        if kwargs.get("label") == "refused":
            raise InvalidTaskError("Backend does not support run_after.")
        return enqueue(self, task, args, kwargs)

    monkeypatch.setattr(type(dummy), "enqueue", picky)
    assert relay().relay_once() == 1
    refused.refresh_from_db()
    fine.refresh_from_db()
    assert (refused.status, fine.status) == ("failed", "relayed")
    assert refused.last_error.startswith(
        'backend "elsewhere" refused Django Task "testproject.demo.background.elsewhere" '
        f"for job {refused.pk}: InvalidTaskError: Backend does not support run_after."
    )
    assert [r.kwargs for r in dummy.results] == [{"label": "fine"}]


@pytest.mark.django_db
def test_relay__a_django_task_backend_that_cannot_be_reached_holds_the_rows(
    dummy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = outbox("faults.tasks-down", (background.elsewhere, {"label": "x"}))

    def unreachable(self: Any, task: Any, args: Any, kwargs: Any) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(type(dummy), "enqueue", unreachable)
    with pytest.raises(BrokerUnavailableError, match='backend "elsewhere" cannot take'):
        relay().relay_once()
    [job] = rows
    job.refresh_from_db()
    assert (job.status, job.last_error) == ("outbox", "")


# -- a task unknown here: a rolling deploy ---------------------------------------------------------


@pytest.mark.django_db
def test_relay__an_unknown_task_waits_within_the_grace_and_the_rows_behind_it_go(
    broker: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    new, behind = outbox(
        "faults.unknown", (write_row, {"occurrence": "new"}), (write_row, {"occurrence": "b"})
    )
    Job.objects.filter(pk=new.pk).update(name="demo.next_release_task")
    clock = FrozenClock(NOW)
    relayer = relay(clock)
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.relay"):
        assert relayer.relay_once() == 1
    new.refresh_from_db()
    behind.refresh_from_db()
    assert behind.status == "relayed"
    assert (new.status, new.target_unknown_since, new.run_at) == ("outbox", NOW, NOW + TARGET_RETRY)
    assert 'Celery task "demo.next_release_task" is not registered' in new.last_error
    assert "waiting for a relay that knows it until 2026-06-01 00:06:01 UTC" in new.last_error
    [waiting] = events(caplog, "jobs.relay.target-waiting")
    assert (waiting["job_id"], waiting["code"], waiting["grace"]) == (
        new.pk,
        "jobs.relay.target-unknown",
        300.0,
    )
    # Put off, it is not looked at again before its time.
    clock.advance(TARGET_RETRY / 2)
    assert relayer.relay_once() == 0
    assert relayer.stats.waiting == 1
    # Looked at again, still unknown: the wait goes on from when it began.
    clock.advance(TARGET_RETRY)
    assert relayer.relay_once() == 0
    new.refresh_from_db()
    assert (new.status, new.target_unknown_since) == ("outbox", NOW)
    # The new release is deployed: its relay knows the task and sends the row.
    Job.objects.filter(pk=new.pk).update(name="demo.write_row")
    clock.advance(TARGET_RETRY)
    assert relayer.relay_once() == 1
    new.refresh_from_db()
    assert (new.status, new.target_unknown_since, new.attempts) == ("relayed", None, 1)


@pytest.mark.django_db
def test_relay__an_unknown_task_fails_once_the_grace_is_over(
    broker: redis.Redis, settings: Any
) -> None:
    settings.ULTIMAT3_JOBS = {"RELAY_UNKNOWN_TASK_GRACE": 8}
    [job] = outbox("faults.never", (write_row, {"occurrence": "never"}))
    Job.objects.filter(pk=job.pk).update(name="demo.never_deployed")
    clock = FrozenClock(NOW)
    relayer = relay(clock)
    assert relayer.relay_once() == 0
    clock.advance(TARGET_RETRY)
    assert relayer.relay_once() == 0
    job.refresh_from_db()
    # The last look is at the end of the grace, not a step after it.
    assert job.run_at == NOW + timedelta(seconds=8)
    clock.set(job.run_at)
    assert relayer.relay_once() == 0
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.last_error == (
        'Celery task "demo.never_deployed" is not registered in the relay\'s Celery app '
        '"testproject"; no relay knew it within RELAY_UNKNOWN_TASK_GRACE (8 s) '
        "[jobs.relay.target-unknown]\n"
        "fix: import the module that declares it in the relay process too (an installed app's "
        "tasks.py is; check CELERY settings and that run_relay runs the same code)"
    )
    assert relayer.stats.refused == 1
    # Retried from the admin once it is deployed: a fresh wait, in the outbox again.
    assert store_for().retry_failed(Job.objects.filter(pk=job.pk)) == 1
    job.refresh_from_db()
    assert (job.status, job.target_unknown_since) == ("outbox", None)


@pytest.mark.django_db
def test_relay__a_resend_whose_task_is_unknown_here_waits_and_is_never_failed(
    broker: redis.Redis,
) -> None:
    [job] = outbox("faults.resend", (write_row, {"occurrence": "r"}))
    clock = FrozenClock(NOW)
    relay(clock).relay_once()
    Job.objects.filter(pk=job.pk).update(name="demo.gone_from_this_relay")
    late = FrozenClock(NOW + timedelta(hours=2))
    old = relay(late, resend_after=timedelta(minutes=5))
    assert old.relay_once() == 0
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("relayed", 1)
    assert job.run_at == late() + timedelta(minutes=5)
    assert "is not registered" in job.last_error and "; not resent [" in job.last_error
    late.advance(timedelta(hours=1))
    assert old.relay_once() == 0
    job.refresh_from_db()
    assert job.status == "relayed"


@pytest.mark.django_db
def test_relay__a_resend_the_engine_refuses_is_put_off_and_never_failed(
    broker: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    [job] = outbox("faults.resend-refused", (write_row, {"occurrence": "r"}))
    relay().relay_once()
    # The first copy is out; a deploy since renamed the keyword, so the resend does not fit.
    Job.objects.filter(pk=job.pk).update(input={"day": "r"})
    late = FrozenClock(NOW + timedelta(hours=2))
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.relay"):
        assert relay(late, resend_after=timedelta(minutes=5)).relay_once() == 0
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("relayed", 1)
    assert job.run_at == late() + timedelta(minutes=5)
    assert "TypeError" in job.last_error and "[jobs.relay.refused]" in job.last_error
    [deferred] = events(caplog, "jobs.relay.resend-deferred")
    assert (deferred["job_id"], deferred["code"]) == (job.pk, "jobs.relay.refused")
    assert events(caplog, "jobs.relay.refused") == []
    # The first copy, sent before the deploy, still runs and marks the row done.
    job.input = {"occurrence": "r"}
    run_message(job, write_row)
    job.refresh_from_db()
    assert job.status == "succeeded"


# -- ExactlyOnceTask: how the body ends -----------------------------------------------------------


def once(how: str) -> Job:
    [job] = outbox(f"faults.once-{how}", (once_ends, {"label": f"once {how}", "how": how}))
    relay().relay_once()
    job.refresh_from_db()
    return job


def pings(label: str) -> int:
    return Ping.objects.filter(label=label).count()


@pytest.mark.django_db
def test_exactly_once_task__ignore_ends_the_row_succeeded_with_the_body_s_writes(
    broker: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    job = once("ignore")
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.relay"):
        run_message(job)
    job.refresh_from_db()
    assert (job.status, job.return_value, job.last_error) == ("succeeded", None, "")
    assert job.done_at is not None
    assert pings("once ignore") == 1
    [ignored] = events(caplog, "jobs.relay.ignored")
    assert (ignored["job_id"], ignored["replaced_by"]) == (job.pk, None)
    # A copy delivered again finds it done; nothing resends it.
    run_message(job)
    assert pings("once ignore") == 1
    far = relay(FrozenClock(NOW + timedelta(hours=1)), resend_after=timedelta(seconds=1))
    assert far.relay_once() == 0


@pytest.mark.django_db
def test_exactly_once_task__reject_without_requeue_fails_the_row_and_undoes_the_body(
    broker: redis.Redis,
) -> None:
    job = once("reject")
    result = run_message(job)
    assert isinstance(result.result, Reject)
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.done_at is not None
    assert "Reject" in job.last_error and "the body refused its message" in job.last_error
    assert pings("once reject") == 0
    run_message(job)
    assert pings("once reject") == 0
    far = relay(FrozenClock(NOW + timedelta(hours=1)), resend_after=timedelta(seconds=1))
    assert far.relay_once() == 0


@pytest.mark.django_db
def test_exactly_once_task__reject_with_requeue_keeps_nothing_for_celery_to_send_it_again(
    broker: redis.Redis,
) -> None:
    job = once("requeue")
    run_message(job)
    job.refresh_from_db()
    assert (job.status, job.done_at) == ("relayed", None)
    assert pings("once requeue") == 0


@pytest.mark.django_db
def test_exactly_once_task__replace_marks_the_row_done_and_publishes_the_replacement_once(
    broker: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    job = once("replace")
    before = len(messages(broker))
    # As a worker runs it (not eagerly): Celery publishes the replacement and raises Ignore.
    with (
        caplog.at_level(logging.INFO, logger="ultimat3_jobs.relay"),
        pytest.raises(Ignore) as raised,
    ):
        run_as_worker(job)
    # A prefork pool's child sends the exception to the worker's main process pickled: one it
    # cannot rebuild stops that process.
    sent = pickle.loads(pickle.dumps(raised.value))
    assert (type(sent), sent.replaced_by) == (type(raised.value), "demo.plain_row")
    # A second copy finds the row done and publishes nothing.
    assert run_as_worker(job) is None
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert pings("once replace") == 1
    published = messages(broker)[before:]
    assert [h["task"] for h in published] == ["demo.plain_row"]
    assert published[0]["id"] == celery_task_id(job.key)  # The replacement takes the task id.
    [replaced] = events(caplog, "jobs.relay.replaced")
    assert replaced["replaced_by"] == "demo.plain_row"


@pytest.mark.django_db
def test_exactly_once_task__a_return_value_the_database_refuses_fails_the_row(
    broker: redis.Redis,
) -> None:
    job = once("nul")
    run_message(job)
    job.refresh_from_db()
    # On every database: PostgreSQL's jsonb refuses a NUL, and a row keeps what any would.
    assert (job.status, job.return_value) == ("failed", None)
    assert "[jobs.job.result-unstorable]" in job.last_error
    assert 'the return value of "demo.once_ends" holds text with a NUL' in job.last_error
    assert pings("once nul") == 0  # The body is undone with the result it could not keep.


@pytest.mark.django_db
def test_plain_celery_task__a_return_value_the_database_refuses_fails_its_row_alone(
    broker: redis.Redis,
) -> None:
    nul, fine = outbox(
        "faults.plain-nul",
        (plain_ends, {"label": "plain nul", "how": "nul"}),
        (plain_ends, {"label": "plain fine", "how": "return"}),
    )
    assert relay().relay_once() == 2
    run_message(nul, plain_ends)
    run_message(fine, plain_ends)
    nul.refresh_from_db()
    fine.refresh_from_db()
    assert (nul.status, nul.return_value) == ("failed", None)
    assert "[jobs.job.result-unstorable]" in nul.last_error
    assert "fix: " in nul.last_error
    assert fine.status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_relay__a_django_task_whose_result_the_database_refuses_fails_alone_in_its_batch() -> None:
    rows = outbox(
        "faults.imm-nul",
        (background.record_immediately, {"label": "before"}),
        (background.unstorable_immediately, {"label": "returns"}),
        (background.unstorable_immediately, {"label": "raises", "raises": True}),
        (background.record_immediately, {"label": "after"}),
    )
    assert relay().relay_once() == 4
    assert relay().relay_once() == 0  # Nothing left behind to run again.
    before, returns, raises, after = (Job.objects.get(pk=row.pk) for row in rows)
    assert (before.status, before.return_value) == ("succeeded", "before")
    assert (after.status, after.return_value) == ("succeeded", "after")
    assert (returns.status, returns.return_value) == ("failed", None)
    assert "[jobs.job.result-unstorable]" in returns.last_error
    assert raises.status == "failed"
    assert "ValueError: raises \\x00" in raises.last_error
    assert sorted(Ping.objects.values_list("label", flat=True)) == ["after", "before"]


@pytest.mark.django_db
def test_relay__a_reported_result_the_database_refuses_fails_that_row_alone() -> None:
    from django_tasks import TaskResultStatus, task_backends

    backend: Any = task_backends["reporting"]
    backend.clear()
    rows = outbox(
        "faults.reported-nul",
        (background.reported, {"label": "nul"}),
        (background.reported, {"label": "fine"}),
    )
    relayer = relay()
    assert relayer.relay_once() == 2
    for result, value in zip(backend.results, ["a \x00", {"ok": 1}], strict=True):
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
    assert relayer.check_results() == 2
    nul, fine = (Job.objects.get(pk=row.pk) for row in rows)
    assert (nul.status, nul.return_value) == ("failed", None)
    assert "[jobs.job.result-unstorable]" in nul.last_error
    assert (fine.status, fine.return_value) == ("succeeded", {"ok": 1})


# -- a Celery worker that does not know the task ---------------------------------------------------


@pytest.mark.django_db
def test_relayed_task_unknown_to_the_celery_worker__a_plain_row_fails_an_exactly_once_waits(
    broker: redis.Redis,
) -> None:
    from celery.signals import task_unknown
    from kombu import Message

    plain, once = outbox(
        "faults.unknown-at-worker",
        (plain_row, {"label": "plain"}),
        (write_row, {"occurrence": "once"}),
    )
    assert relay().relay_once() == 2
    for job in (plain, once):
        # As a worker of the last release drops the message (celery.worker.consumer).
        headers = {JOB_HEADER: job.pk, DATABASE_HEADER: "default", KEY_HEADER: job.key}
        message = Message(body="{}", headers={"task": job.name, "id": "x", **headers})
        task_unknown.send(
            sender=None, message=message, exc=KeyError(job.name), name=job.name, id="x"
        )
    plain.refresh_from_db()
    once.refresh_from_db()
    assert plain.status == "failed"
    assert 'does not know the Celery task "demo.plain_row"' in plain.last_error
    assert "[jobs.relay.target-unknown]" in plain.last_error
    assert (
        once.status == "relayed"
    )  # Sent again after RELAY_RESEND_AFTER, to a worker that knows it.


# -- plain Celery tasks that ignore or reject ------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("how", "status"), [("ignore", "succeeded"), ("reject", "failed")])
def test_plain_celery_task__ignore_or_reject_ends_its_row(
    broker: redis.Redis, how: str, status: str
) -> None:
    [job] = outbox(f"faults.plain-{how}", (plain_ends, {"label": f"plain {how}", "how": how}))
    relay().relay_once()
    run_message(job, plain_ends)
    job.refresh_from_db()
    assert job.status == status
    assert job.done_at is not None
