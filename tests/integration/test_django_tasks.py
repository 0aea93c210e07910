"""Django Tasks on ``JobsBackend``, through the framework's public API and ``run_worker``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import call_command
from django.db import connections, transaction
from django.dispatch import Signal
from django.test import override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, default_task_backend, task_backends
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued, task_finished, task_started

from testproject.demo import background
from testproject.demo.models import Ping
from ultimat3_jobs.backends import JobsBackend, finished_lost
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.cron import parse
from ultimat3_jobs.errors import InvalidJobInputError, TaskBackendError, UnknownDatabaseError
from ultimat3_jobs.handles import TaskHandle
from ultimat3_jobs.inputs import input_digest
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.manual import run_now
from ultimat3_jobs.models import Job
from ultimat3_jobs.planner import RoundPlan, occurrence_key, plan_task
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.store import store_for
from ultimat3_jobs.zones import resolve_zone


def burst() -> None:
    """What an operator runs: the worker, until nothing is due."""
    call_command("run_worker", "--burst", "--no-listen")


@pytest.fixture
def signals() -> Iterator[list[tuple[str, str, str]]]:
    """(signal, result id, status) for every framework signal sent meanwhile."""
    seen: list[tuple[str, str, str]] = []
    receivers = []
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receive(*, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            seen.append((_name, task_result.id, str(task_result.status)))

        signal.connect(receive, weak=False)
        receivers.append((signal, receive))
    yield seen
    for signal, receive in receivers:
        Signal.disconnect(signal, receive)


def test_backend__claims_every_capability() -> None:
    backend = task_backends["default"]
    assert type(backend).__name__ == "JobsBackend"
    assert default_task_backend.alias == "default"
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task


@pytest.mark.django_db(transaction=True)
def test_enqueue__ready_then_successful_with_its_return_value(
    signals: list[tuple[str, str, str]],
) -> None:
    result = background.add.enqueue(2, b=3)
    assert isinstance(result.id, str)
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert result.backend == "default"

    burst()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1
    assert len(result.worker_ids) == 1
    assert result.started_at is not None and result.finished_at is not None
    from_backend = task_backends["default"].get_result(result.id)
    assert from_backend.status == TaskResultStatus.SUCCESSFUL
    assert from_backend.return_value == 5
    assert background.add.get_result(result.id).return_value == 5
    assert signals == [
        ("enqueued", result.id, "READY"),
        ("started", result.id, "RUNNING"),
        ("finished", result.id, "SUCCESSFUL"),
    ]


def _as_told(result: Any) -> dict[str, Any]:
    """What a receiver reads of a result: status, value or errors, times, workers."""
    return {
        "status": result.status,
        "value": result.return_value if result.status == "SUCCESSFUL" else None,
        "errors": [e.exception_class_path for e in result.errors],
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "worker_ids": list(result.worker_ids),
    }


@pytest.mark.django_db(transaction=True)
def test_task_finished__its_result_is_the_one_the_database_then_returns() -> None:
    """A ``task_finished`` receiver reads the result as it is recorded: status, value or
    error, and the times, the same as ``get_result`` gives once the signal is sent."""
    seen: dict[str, dict[str, Any]] = {}

    def receive(*, task_result: Any, **kwargs: Any) -> None:
        seen[task_result.id] = _as_told(task_result)

    task_finished.connect(receive, weak=False)
    try:
        ok = background.add.enqueue(2, 3)
        failed = background.explode.enqueue(reason="on purpose")
        burst()
    finally:
        task_finished.disconnect(receive)
    for result in (ok, failed):
        assert seen[result.id] == _as_told(task_backends["default"].get_result(result.id))
    assert seen[ok.id]["value"] == 5
    assert seen[failed.id]["status"] == TaskResultStatus.FAILED
    assert seen[failed.id]["errors"] == ["builtins.ValueError"]


@pytest.mark.django_db(transaction=True)
def test_task_finished__a_failed_tasks_log_carries_its_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The framework's receiver logs a failed task with ``logger.exception``, for error
    monitoring: the record carries the task's own exception and traceback."""
    failed = background.explode.enqueue(reason="on purpose")
    with caplog.at_level(logging.INFO, logger="django_tasks"):
        burst()
    [record] = [
        r for r in caplog.records if r.name == "django_tasks" and "state=FAILED" in r.getMessage()
    ]
    assert failed.id in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "exploded: on purpose" in caplog.text
    assert "NoneType: None" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_enqueue__a_raising_task_ends_failed_with_its_error_after_one_run(
    signals: list[tuple[str, str, str]],
) -> None:
    result = background.explode.enqueue(reason="on purpose")

    burst()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1  # No retries: the framework has none.
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "exploded: on purpose" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert signals[-1] == ("finished", result.id, "FAILED")


@pytest.mark.django_db(transaction=True)
def test_enqueue__inside_a_rolled_back_transaction_runs_nothing() -> None:
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        result = background.record.enqueue("rolled back")
        raise Undo()

    burst()

    assert not Ping.objects.filter(label="rolled back").exists()
    with pytest.raises(TaskResultDoesNotExist):
        background.record.get_result(result.id)


@pytest.mark.django_db(transaction=True)
def test_enqueue__run_after_in_the_future_is_not_run_and_burst_still_exits() -> None:
    later = background.record.using(run_after=timezone.now() + timedelta(hours=1))
    result = later.enqueue("later")
    now = background.record.enqueue("now")

    burst()  # Returns: a job due in an hour is not work for a burst.

    result.refresh()
    now.refresh()
    assert result.status == TaskResultStatus.READY
    assert now.status == TaskResultStatus.SUCCESSFUL
    # Read back, the result says when it is due, as the enqueued one did; the other is not.
    assert background.record.get_result(result.id).task.run_after == later.run_after
    assert background.record.get_result(now.id).task.run_after is None
    # Put off for a worker that knows its task, a row's due time is no longer its run_after.
    put_off = background.record.enqueue("put off")
    Job.objects.filter(pk=put_off.id).update(
        run_at=timezone.now() + timedelta(seconds=5), target_unknown_since=timezone.now()
    )
    assert background.record.get_result(put_off.id).task.run_after is None
    assert list(Ping.objects.values_list("label", flat=True)) == ["now"]


@pytest.mark.django_db(transaction=True)
def test_enqueue__priorities_run_high_to_low_with_one_thread() -> None:
    for priority in (-5, 0, 50, -100, 100, 7):
        background.record.using(priority=priority).enqueue(f"p{priority}")

    call_command("run_worker", "--burst", "--no-listen", "--concurrency", "1")

    ran = list(Ping.objects.order_by("pk").values_list("label", flat=True))
    assert ran == ["p100", "p50", "p7", "p0", "p-5", "p-100"]


@pytest.mark.django_db(transaction=True)
def test_enqueue__a_task_on_another_declared_queue_runs() -> None:
    result = background.send_email.enqueue(to="ops@example.com")
    assert result.task.queue_name == "emails"

    call_command("run_worker", "--burst", "--no-listen", "--queues", "emails")

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"sent": "ops@example.com"}
    assert result.task.priority == 10


@pytest.mark.django_db(transaction=True)
def test_enqueue__an_async_task_runs() -> None:
    result = background.add_later.enqueue(20, 22)

    burst()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


@pytest.mark.django_db(transaction=True)
def test_enqueue__nested_args_and_kwargs_round_trip() -> None:
    args = [1, [2, [3, {"four": 4}]], None, "five", 6.5, True]
    kwargs = {"deep": {"list": [1, {"x": [None, False]}]}, "text": "é"}
    result = background.echo.enqueue(*args, **kwargs)
    assert result.args == args
    assert result.kwargs == kwargs

    burst()

    again = background.echo.get_result(result.id)
    assert again.args == args
    assert again.kwargs == kwargs
    assert again.return_value == {"args": args, "kwargs": kwargs}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_enqueue__a_task_taking_context_sees_its_own_result(pool: str) -> None:
    """In a child process too: its row is made from the claim and sent to the child."""
    result = background.attempt_of.enqueue(label="ctx")

    call_command("run_worker", "--burst", "--no-listen", "--pool", pool)

    result.refresh()
    assert result.return_value == {"label": "ctx", "attempt": 1, "id": result.id}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bad",
    ["999999999", "abc", "", "-1", "0", str(2**70), "{id}.0", " {id}", "+{id}", "0{id}", "\uff11"],
)
def test_get_result__an_unknown_or_malformed_id_does_not_exist(bad: str) -> None:
    real = background.add.enqueue(1, 1)  # Variants of a real id must not find it.
    assert task_backends["default"].get_result(real.id).id == real.id
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(bad.format(id=real.id))


@pytest.mark.django_db(transaction=True)
def test_aenqueue__writes_the_same_row() -> None:
    import asyncio

    async def go() -> str:
        result = await background.add.aenqueue(1, 1)
        # The enqueue ran in asgiref's thread for sync code: close the connection it opened.
        await sync_to_async(connections.close_all)()
        return result.id

    result_id = asyncio.run(go())

    burst()

    assert background.add.get_result(result_id).return_value == 2


def test_checks__a_schedule_entry_on_another_backend_is_relayed_not_warned_about(
    fresh_registry: Any,
) -> None:
    from ultimat3_jobs import task
    from ultimat3_jobs.checks import check_scheduled_jobs

    @task(cron="0 3 * * *", tz="UTC", name="checks.elsewhere")
    def uses_elsewhere(occurrence: datetime) -> list[Any]:
        return [(background.elsewhere, {"label": "x"}), (background.add, {"a": 1, "b": 2})]

    messages = check_scheduled_jobs()
    assert [m for m in messages if m.id == "ultimat3_jobs.W004"] == []
    [(relayed, _), (ours, _)] = uses_elsewhere.entries()
    assert (relayed.relay, ours.relay) == ("tasks", "")


@override_settings(ULTIMAT3_JOBS={"JOB_TIMEOUT": 45})
def test_describe__a_task_our_worker_runs_has_the_default_timeout_a_relayed_one_none() -> None:
    from ultimat3_jobs.backends import RelayedTaskHandle, django_task_handle

    ours = django_task_handle(background.add).describe()
    relayed = RelayedTaskHandle(background.elsewhere).describe()
    assert (ours["kind"], ours["timeout"]) == ("django-task", 45.0)
    assert (relayed["kind"], relayed["timeout"]) == ("relayed-django-task", None)


class RenamedJobsBackend(JobsBackend):
    """A ``JobsBackend`` under a class of its own: the sender of its tasks' signals."""


@pytest.mark.django_db
def test_run__signals_are_sent_by_the_backend_class_tasks_names_now() -> None:
    senders: list[type] = []

    def receive(sender: type, **kwargs: Any) -> None:
        senders.append(sender)

    tasks: dict[str, Any] = dict(settings.TASKS)
    renamed = {
        **tasks,
        "default": {**tasks["default"], "BACKEND": f"{__name__}.RenamedJobsBackend"},
    }
    task_started.connect(receive, weak=False)
    try:
        background.add.enqueue(1, 2)
        burst()
        with override_settings(TASKS=renamed):
            background.add.enqueue(3, 4)
            burst()
        background.add.enqueue(5, 6)
        burst()
    finally:
        task_started.disconnect(receive)
    assert senders == [JobsBackend, RenamedJobsBackend, JobsBackend]


# -- scheduled: a @task whose entries are Django Tasks ----------------------------------------

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
MINUTE = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)


def every_minute(entries: Callable[[datetime], list[Any]], name: str) -> TaskHandle:
    return TaskHandle(
        entries,
        name=name,
        schedule=parse("* * * * *"),
        zone=resolve_zone("UTC", name),
        catch_up="skip",
        max_catch_up=10,
    )


def fire_once(handle: TaskHandle) -> tuple[Scheduler, FrozenClock]:
    """Arm ``handle``, then run the round of its next occurrence (MINUTE)."""
    clock = FrozenClock(T0)
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state,
        leader=SoleLeader(),
        clock=clock,
        tasks=[handle],
        drain_on_shutdown=False,
    )
    state.sync([handle])
    scheduler.tick()
    clock.set(MINUTE + timedelta(milliseconds=200))
    scheduler.tick()
    return scheduler, clock


@pytest.mark.django_db(transaction=True)
def test_round__a_django_task_entry_is_written_with_the_occurrence_key_and_runs(
    signals: list[tuple[str, str, str]],
) -> None:
    handle = every_minute(
        lambda at: [(background.send_email, {"to": f"{at:%H:%M}@example.com"})], "dt.mail"
    )
    fire_once(handle)
    [job] = Job.objects.filter(task="dt.mail")
    assert signals == [("enqueued", str(job.pk), "READY")]
    assert job.key == occurrence_key(
        "dt.mail", MINUTE, f"testproject.demo.background.send_email:{input_digest(job.input)}"
    )
    assert (job.backend, job.queue, job.priority, job.max_attempts) == ("default", "emails", 10, 1)
    assert job.occurrence == MINUTE

    # The same occurrence planned again (a second scheduler's round) finds the key taken.
    again = store_for().insert_round(
        [{**{f: getattr(job, f) for f in ROUND_FIELDS}, "key": job.key}]
    )
    assert again == {job.key: (job.pk, False)}

    call_command("run_worker", "--burst", "--no-listen", "--queues", "emails")

    result = background.send_email.get_result(str(job.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"sent": "00:01@example.com"}
    assert result.kwargs == {"to": "00:01@example.com"}


ROUND_FIELDS = (
    "name",
    "input",
    "queue",
    "max_attempts",
    "run_at",
    "created_at",
    "task",
    "occurrence",
    "catch_up",
    "enqueued_by",
    "priority",
    "backend",
)


def test_plan__an_entry_on_another_backend_is_planned_as_an_outbox_row() -> None:
    handle = every_minute(lambda at: [(background.elsewhere, {"label": "x"})], "dt.elsewhere")
    plan = RoundPlan(now=MINUTE + timedelta(seconds=1), database="default")
    step = plan_task(
        handle,
        watermark=T0,
        paused=False,
        now=plan.now,
        misfire_grace=timedelta(minutes=1),
        next_after=lambda after: MINUTE if after < MINUTE else MINUTE + timedelta(minutes=1),
        plan=plan,
    )
    assert step.failed is None and not plan.held
    [occurrence] = plan.fired
    [planned] = occurrence.jobs
    assert (planned.job.relay, planned.job.backend) == ("tasks", "elsewhere")
    assert plan.watermarks["dt.elsewhere"][1] >= MINUTE


def test_plan__a_jobs_backend_on_another_database_is_refused() -> None:
    handle = every_minute(lambda at: [(background.add, {"a": 1, "b": 2})], "dt.otherdb")
    with pytest.raises(TaskBackendError, match="not the scheduler's"):
        for entry, _ in handle.entries(MINUTE):
            entry.check_backend("replica")


@pytest.mark.django_db
def test_round__an_entry_on_another_backend_is_one_outbox_row_our_worker_leaves() -> None:
    handle = every_minute(lambda at: [(background.elsewhere, {"label": "x"})], "dt.outbox")
    scheduler, _clock = fire_once(handle)
    scheduler.tick()  # The same occurrence again writes nothing more.
    [job] = Job.objects.filter(task="dt.outbox")
    assert (job.status, job.relay, job.backend) == ("outbox", "tasks", "elsewhere")
    burst()
    job.refresh_from_db()
    assert job.status == "outbox"


def test_entries__a_django_task_takes_keyword_arguments_that_fit_it() -> None:
    bad = every_minute(lambda at: [(background.add, {"a": 1})], "dt.bad")
    with pytest.raises(InvalidJobInputError, match="does not fit"):
        bad.entries(MINUTE)
    context = every_minute(lambda at: [(background.attempt_of, {"label": "x"})], "dt.ctx")
    [(entry, data)] = context.entries(MINUTE)
    assert data == {"label": "x"}
    assert entry.name == "testproject.demo.background.attempt_of"


@pytest.mark.django_db(transaction=True)
def test_run_now__a_task_whose_entries_are_django_tasks(
    signals: list[tuple[str, str, str]],
) -> None:
    handle = every_minute(lambda at: [(background.add, {"a": 2, "b": 2})], "dt.manual")
    run = run_now(handle, user="alice")
    [entry] = run.created
    result_id = str(entry.result.job_id)
    assert background.add.get_result(result_id).status == TaskResultStatus.READY
    assert signals == [("enqueued", result_id, "READY")]

    burst()

    assert background.add.get_result(result_id).return_value == 4
    assert Job.objects.get(pk=entry.result.job_id).enqueued_by == "admin:alice"


def test_checks__a_jobs_backend_on_a_missing_database_is_an_error() -> None:
    from ultimat3_jobs.checks import check_task_backends

    tasks = {
        "default": {"BACKEND": "ultimat3_jobs.backends.JobsBackend"},
        "far": {
            "BACKEND": "ultimat3_jobs.backends.JobsBackend",
            "OPTIONS": {"DATABASE": "nowhere"},
        },
    }
    with override_settings(TASKS=tasks):
        messages = check_task_backends()
        # At run time, the same words and fix as the check's.
        with pytest.raises(UnknownDatabaseError) as refused:
            task_backends["far"].enqueue(background.add, (1, 2), {})
    [error] = [m for m in messages if m.id == "ultimat3_jobs.E005"]
    assert 'TASKS["far"]' in error.msg
    assert "nowhere" in error.msg
    assert "default" in str(error.hint)
    assert (refused.value.message, refused.value.fix) == (error.msg, error.hint)
    assert refused.value.code == "jobs.database-unknown"


@pytest.fixture
def raising_receiver() -> Iterator[list[str]]:
    """A receiver of ``task_enqueued`` and ``task_finished`` that raises, as a buggy one
    would, for an ``add`` whose first argument is 13; the ids of the results it was given."""
    given: list[str] = []

    def receive(*, task_result: Any, **kwargs: Any) -> None:
        given.append(task_result.id)
        if task_result.args[:1] == [13]:
            raise RuntimeError("receiver bug")

    for signal in (task_enqueued, task_finished):
        signal.connect(receive, weak=False)
    yield given
    for signal in (task_enqueued, task_finished):
        Signal.disconnect(signal, receive)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_task_finished__a_receiver_that_raises_fails_nothing_and_the_worker_goes_on(
    pool: str, raising_receiver: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    results = [background.add.enqueue(a, 1) for a in (1, 13, 2, 3)]
    capsys.readouterr()
    call_command(
        "run_worker", "--burst", "--no-listen", "--pool", pool, "--concurrency", "2",
        "--log-format", "json",
    )  # fmt: skip
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    by_event = {line["event"]: line for line in lines}
    # Counted by the worker, the child's runs too.
    stopped = by_event["jobs.worker.stopped"]
    assert (stopped["reason"], stopped["succeeded"]) == ("burst", 4)
    if pool == "thread":  # A child's log lines are its own process's.
        failed = by_event["jobs.task.receiver-failed"]
        assert failed["code"] == "jobs.task.receiver-failed"
        assert "task_finished" in failed["error"] and "receiver bug" in failed["error"]


@pytest.mark.django_db(transaction=True)
def test_task_enqueued__a_receiver_that_raises_after_the_commit_is_logged_not_raised(
    raising_receiver: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR), transaction.atomic():
        result = background.add.enqueue(13, 1)
        later = background.add.enqueue(1, 1)
    assert raising_receiver == [result.id, later.id]  # The next callback ran too.
    [failed] = [r for r in caplog.records if getattr(r, "event", "") == "jobs.task.receiver-failed"]
    assert failed.fields["result"] == result.id  # type: ignore[attr-defined]
    assert "task_enqueued" in failed.fields["error"]  # type: ignore[attr-defined]
    assert Job.objects.filter(pk=int(result.id)).exists()


@pytest.mark.django_db(transaction=True)
def test_recover__a_django_task_a_lost_worker_failed_is_told_finished(
    signals: list[tuple[str, str, str]],
) -> None:
    from ultimat3_jobs.worker import Worker

    result = background.add.enqueue(1, 2)
    [claimed] = store_for("default").claim(worker="dead-node", limit=1, now=timezone.now())
    Job.objects.filter(pk=claimed.id).update(started_at=timezone.now())

    Worker(stale_after=timedelta(seconds=60), drain_on_shutdown=False).recover()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert signals[-1] == ("finished", result.id, "FAILED")
    [error] = result.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.WorkerLostError"

    # A task that failed of its own run as the loss was written is told by its own worker.
    own = background.explode.enqueue(reason="its own")
    burst()
    assert signals[-1] == ("finished", own.id, "FAILED")
    told = len(signals)
    finished_lost([int(result.id), int(own.id)], using="default")
    assert [s[1] for s in signals[told:]] == [result.id]


@pytest.mark.django_db
def test_get_result__a_row_claimed_ahead_has_made_no_attempt() -> None:
    result = background.add.enqueue(2, 2)
    store_for("default").claim(worker="w-ahead", limit=5, now=timezone.now())
    # Claimed ahead of a free thread: its start not marked yet.
    Job.objects.filter(pk=int(result.id)).update(started_at=None)
    ahead = background.add.get_result(result.id)
    assert (ahead.status, ahead.attempts, ahead.worker_ids) == (TaskResultStatus.READY, 0, [])


@pytest.mark.django_db
@pytest.mark.parametrize("value", [{1, 2}, datetime(2026, 1, 1, tzinfo=UTC), b"\xff"])
def test_enqueue__an_argument_that_is_no_json_is_refused_with_the_fix(value: Any) -> None:
    with pytest.raises(InvalidJobInputError, match="not JSON-serialisable") as refused:
        background.add.enqueue(value, 1)
    assert refused.value.code == "jobs.job.input-invalid"
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_recover__a_django_task_whose_worker_died_ends_failed_not_run_twice() -> None:
    result = background.add.enqueue(1, 2)
    [claimed] = store_for("default").claim(worker="dead-node", limit=1, now=timezone.now())
    assert claimed.id == int(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == ["dead-node"]

    recovered = store_for("default").recover(stale_after=timedelta(seconds=60), now=timezone.now())

    assert recovered.failed == 1
    result.refresh()
    assert result.status == TaskResultStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_run__a_task_this_worker_cannot_import_waits_uncounted_then_fails_with_its_error(
    signals: list[tuple[str, str, str]],
) -> None:
    # A task of the new release, claimed by a worker of the last one in a rolling deploy.
    result = background.add.enqueue(1, 2)
    path = Job.objects.get(pk=int(result.id)).name
    Job.objects.filter(pk=int(result.id)).update(name="testproject.demo.next_release.add")

    burst()

    row = Job.objects.get(pk=int(result.id))
    assert (row.status, row.attempts, row.worker, row.started_at) == ("queued", 0, "", None)
    assert row.target_unknown_since is not None
    assert 'task "testproject.demo.next_release.add" cannot be imported in worker' in (
        row.last_error
    )
    assert "ModuleNotFoundError" in row.last_error
    assert [s[0] for s in signals] == ["enqueued"]  # Never started, so never finished.

    # Its code arrives within the grace: it runs on its first attempt.
    Job.objects.filter(pk=row.pk).update(name=path, run_at=timezone.now())
    burst()
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == ("SUCCESSFUL", 3, 1)

    # One no worker could import within the grace fails with what its import raised.
    gone = background.add.enqueue(2, 2)
    Job.objects.filter(pk=int(gone.id)).update(
        name="testproject.demo.next_release.add",
        target_unknown_since=timezone.now() - timedelta(seconds=300),
    )
    burst()
    row = Job.objects.get(pk=int(gone.id))
    assert (row.status, row.attempts) == ("failed", 1)
    assert row.error_class == "builtins.ModuleNotFoundError"


def test_validate_task__a_queue_wider_than_the_job_row_is_refused_at_declaration() -> None:
    wide = "q" * 101
    with (
        override_settings(
            TASKS={"default": {"BACKEND": "ultimat3_jobs.backends.JobsBackend", "QUEUES": [wide]}}
        ),
        pytest.raises(InvalidTaskError, match="longer than 100"),
    ):
        background.add.using(queue_name=wide)


def test_checks__a_queue_no_worker_option_can_name_is_warned_about() -> None:
    from ultimat3_jobs.checks import check_task_backends

    queues = ["default", "mail,sms", " padded", "emails"]
    with override_settings(
        TASKS={"default": {"BACKEND": "ultimat3_jobs.backends.JobsBackend", "QUEUES": queues}}
    ):
        messages = check_task_backends()
    warned = sorted(m.msg for m in messages if m.id == "ultimat3_jobs.W005")
    assert len(warned) == 2
    assert "' padded'" in warned[0]
    assert "'mail,sms'" in warned[1]
    assert all("run_worker --queues" in text for text in warned)


# -- refused before writing; announced after commit -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue__arguments_a_row_cannot_hold_are_refused_and_the_transaction_goes_on() -> None:
    with transaction.atomic():
        Ping.objects.create(label="before")
        with pytest.raises(InvalidJobInputError, match="NUL"):
            background.record.enqueue("bad\x00")
        with pytest.raises(InvalidJobInputError, match="NUL"):
            background.record.enqueue(label="bad\x00")
        with pytest.raises(InvalidJobInputError, match="surrogate"):
            background.echo.enqueue(["\ud800"])
        deep: list[object] = []
        for _ in range(5_000):  # Past Python's recursion limit: the framework's walk recurses.
            deep = [deep]
        with pytest.raises(InvalidJobInputError, match="nest too deep"):
            background.echo.enqueue(deep)
        Ping.objects.create(label="after")  # The caller's transaction is still usable.
    assert list(Ping.objects.order_by("pk").values_list("label", flat=True)) == ["before", "after"]
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue__task_enqueued_is_sent_once_at_commit_never_for_a_rollback(
    signals: list[tuple[str, str, str]],
) -> None:
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        background.add.enqueue(1, 1)
        raise Undo()
    assert signals == []
    with transaction.atomic():
        result = background.add.enqueue(2, 2)
        assert signals == []  # Not before the row is there for others to see.
    assert signals == [("enqueued", result.id, "READY")]


@pytest.mark.django_db(transaction=True)
def test_run_now_and_round__announce_their_django_tasks_only_once_committed(
    signals: list[tuple[str, str, str]],
) -> None:
    class Undo(Exception):
        pass

    manual = every_minute(lambda at: [(background.add, {"a": 1, "b": 1})], "dt.undone")
    scheduled = every_minute(lambda at: [(background.add, {"a": 3, "b": 3})], "dt.undone_round")
    with pytest.raises(Undo), transaction.atomic():
        run_now(manual, user="alice")
        fire_once(scheduled)
        assert signals == []
        raise Undo()
    assert signals == []
    assert not Job.objects.exists()
    with transaction.atomic():
        run = run_now(manual, user="alice")
        assert signals == []
    [entry] = run.created
    assert signals == [("enqueued", str(entry.result.job_id), "READY")]


@pytest.mark.django_db(transaction=True)
def test_run__a_return_value_nested_past_the_recursion_limit_ends_failed_as_unstorable() -> None:
    result = background.nested.enqueue(5_000)
    fine = background.nested.enqueue(3)

    burst()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.ResultUnstorableError"
    assert "nests too deep" in error.traceback
    fine.refresh()
    assert (fine.status, fine.return_value) == (TaskResultStatus.SUCCESSFUL, [[[[]]]])


@pytest.mark.django_db(transaction=True)
def test_enqueue__a_bool_or_whole_float_priority_is_stored_as_the_integer_it_is() -> None:
    # The framework's range check lets both through; the column is an integer.
    high = background.add.using(priority=True).enqueue(1, 1)
    five = background.add.using(priority=5.0).enqueue(1, 1)  # type: ignore[arg-type]
    rows = dict(Job.objects.values_list("pk", "priority"))
    assert (rows[int(high.id)], rows[int(five.id)]) == (1, 5)
