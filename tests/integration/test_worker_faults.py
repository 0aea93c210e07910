"""The worker's faults against a real database: every job ends, a claimed job is not started.

A start mark, an outcome or a give-back whose write fails leaves no row ``running`` under a
live worker; a result or error the database cannot keep ends the job failed. The faults come
from ``testing.FaultyStore`` around the real store, or from the database itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import DataError, OperationalError, connection, connections
from django_tasks import TaskResultStatus
from django_tasks.signals import task_finished

from testproject.demo import background
from testproject.demo.models import Ping
from ultimat3_jobs import clock, lifecycle
from ultimat3_jobs.db import dedicated_connection
from ultimat3_jobs.declarations import job
from ultimat3_jobs.lifecycle import drop_broken_connections
from ultimat3_jobs.models import Job, JobStatus, Node
from ultimat3_jobs.pool import Child, ChildDied, ChildSetup
from ultimat3_jobs.registry import Registry
from ultimat3_jobs.store import store_for
from ultimat3_jobs.testing import Fault, FaultyStore, fail, faults
from ultimat3_jobs.worker import CLEAN_EXIT, Worker

from .factories import running
from .test_worker import QUICK, make_job, wait_until

UNSTORABLE = "jobs.job.result-unstorable"


def _worker(fault: Fault | None = None, **options: Any) -> tuple[Worker, FaultyStore]:
    store = FaultyStore(store_for("default"), fault or (lambda name, kwargs: None))
    worker = Worker(
        **{
            **QUICK,
            "node_id": "w1",
            "listen": False,
            "burst": True,
            "concurrency": 1,
            "prefetch": 5,
            "store": store.as_store(),
            **options,
        }
    )
    return worker, store


def _pings(count: int, prefix: str) -> list[Job]:
    now = clock.now()
    return [
        make_job(data={"label": f"{prefix}-{n}"}, run_at=now - timedelta(seconds=count - n))
        for n in range(count)
    ]


def _nothing_running() -> bool:
    return not Job.objects.filter(status=JobStatus.RUNNING).exists()


def _finishing(job_id: int) -> Any:
    """``when`` for a write whose finishes include ``job_id``'s."""
    return lambda kwargs: any(f.job_id == job_id for f in kwargs.get("finishes") or ())


# -- claimed is not started ---------------------------------------------------------------------


@pytest.fixture
def seen_started(fresh_registry: Registry) -> Iterator[dict[str, datetime | None]]:
    """A job ``test.seen_started`` that notes its row's ``started_at`` as it runs."""
    seen: dict[str, datetime | None] = {}

    @job(name="test.seen_started")
    def seen_started(label: str) -> None:
        seen[label] = Job.objects.get(input__label=label).started_at

    yield seen


@pytest.mark.django_db(transaction=True)
def test_run__a_job_claimed_ahead_is_marked_started_before_its_function_runs(
    seen_started: dict[str, datetime | None],
) -> None:
    for n in range(4):
        make_job("test.seen_started", data={"label": f"s-{n}"})
    # Jobs claimed ahead that wait behind one running longer than the poll interval go back
    # for other workers (``_release_waiting``) and are claimed again as started, unmarked: a
    # slow first job (a loaded machine, its query on a table earlier tests left full of dead
    # rows) must not set that off.
    worker, store = _worker(poll_interval=timedelta(seconds=5))
    assert worker.run() == CLEAN_EXIT
    assert sorted(seen_started) == ["s-0", "s-1", "s-2", "s-3"]
    assert all(seen_started.values()), seen_started
    # One claim for the four (the first went straight to the idle thread), three marks.
    assert store.calls.get("mark_started") == 3


@pytest.mark.django_db(transaction=True)
def test_run__a_start_mark_lost_with_the_connection_leaves_the_job_to_run_once_uncounted() -> None:
    made = _pings(3, "mark")
    worker, _ = _worker(fail("mark_started", OperationalError("connection lost")))
    assert worker.run() == CLEAN_EXIT
    rows = Job.objects.filter(pk__in=[job.pk for job in made])
    assert set(rows.values_list("status", "attempts")) == {(JobStatus.SUCCEEDED, 1)}
    assert Counter(Ping.objects.values_list("label", flat=True)) == {
        "mark-0": 1,
        "mark-1": 1,
        "mark-2": 1,
    }


@pytest.mark.django_db(transaction=True)
def test_run__a_cancelled_job_claimed_ahead_does_not_run(fresh_registry: Registry) -> None:
    @job(name="test.cancel_next")
    def cancel_next(label: str) -> None:
        # As the admin's Cancel would, while the next job waits claimed ahead.
        Job.objects.filter(input__label="next").update(status=JobStatus.CANCELLED)

    now = clock.now()
    make_job("test.cancel_next", data={"label": "first"}, run_at=now - timedelta(seconds=2))
    waiting = make_job("test.cancel_next", data={"label": "next"}, run_at=now)
    worker, _ = _worker()
    assert worker.run() == CLEAN_EXIT
    assert Job.objects.get(pk=waiting.pk).status == JobStatus.CANCELLED
    assert (worker.outcomes["succeeded"], worker.outcomes["lost"]) == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_run__waiting_jobs_whose_give_back_failed_are_freed_and_run_once_each() -> None:
    now = clock.now()
    make_job(
        "demo.slow_ping", data={"label": "slow", "seconds": 0.6}, run_at=now - timedelta(seconds=9)
    )
    waiting = _pings(3, "wait")
    # Polls every 0.05 s: the waiting jobs are given back long before 0.6 s; that fails once.
    worker, store = _worker(fail("release", OperationalError("connection lost")), burst=False)
    worker.start()
    try:
        wait_until(
            lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4,
            what="every job to run",
        )
    finally:
        worker.stop()
    assert store.calls.get("release", 0) >= 1
    rows = Job.objects.filter(pk__in=[job.pk for job in waiting])
    assert set(rows.values_list("attempts", flat=True)) == {1}
    assert sorted(Ping.objects.values_list("label", flat=True)) == [
        "slow",
        "wait-0",
        "wait-1",
        "wait-2",
    ]


# -- every job ends -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run__an_outcome_the_database_refuses_ends_that_job_failed_and_the_others_written() -> None:
    first, *others = _pings(3, "refused")
    refused = DataError("value refused")
    worker, _ = _worker(
        faults(
            fail("finish_and_claim", refused, when=_finishing(first.pk)),
            fail("finish", refused, when=_finishing(first.pk)),
        )
    )
    assert worker.run() == CLEAN_EXIT
    row = Job.objects.get(pk=first.pk)
    assert row.status == JobStatus.FAILED
    assert UNSTORABLE in row.last_error and "value refused" in row.last_error
    rows = Job.objects.filter(pk__in=[job.pk for job in others])
    assert set(rows.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}
    assert _nothing_running()


@pytest.mark.django_db(transaction=True)
def test_run__an_outcome_refused_even_as_a_failure_goes_back_and_runs_again_counted() -> None:
    first, *_ = _pings(2, "twice")
    refused = DataError("value refused")
    worker, _ = _worker(
        faults(
            fail("finish_and_claim", refused, when=_finishing(first.pk)),
            fail("finish", refused, refused, when=_finishing(first.pk)),
        )
    )
    assert worker.run() == CLEAN_EXIT
    row = Job.objects.get(pk=first.pk)
    # Its first outcome never landed: back to the queue with that attempt counted, run again.
    assert (row.status, row.attempts) == (JobStatus.SUCCEEDED, 2)
    assert Counter(Ping.objects.values_list("label", flat=True))["twice-0"] == 2
    assert _nothing_running()


@pytest.mark.django_db(transaction=True)
def test_run__an_outcome_write_that_loses_the_connection_is_written_once_it_is_back() -> None:
    made = _pings(3, "away")
    worker, _ = _worker(
        fail(
            "finish_and_claim",
            OperationalError("connection lost"),
            when=lambda kwargs: bool(kwargs["finishes"]),
        )
    )
    assert worker.run() == CLEAN_EXIT
    rows = Job.objects.filter(pk__in=[job.pk for job in made])
    assert set(rows.values_list("status", "attempts")) == {(JobStatus.SUCCEEDED, 1)}
    assert Ping.objects.count() == 3


@pytest.fixture
def unstorable_errors(fresh_registry: Registry) -> None:
    """Jobs whose exceptions hold text no row keeps, or cannot even be turned into text."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    @job(name="test.nul_error", max_attempts=1)
    def nul_error() -> None:
        raise ValueError("broken \x00 text \ud800 here")

    @job(name="test.unprintable_error", max_attempts=1)
    def unprintable_error() -> None:
        raise Unprintable()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("unstorable_errors")
def test_run__a_job_whose_error_text_cannot_be_stored_ends_failed() -> None:
    nul = make_job("test.nul_error", data={}, max_attempts=1)
    unprintable = make_job("test.unprintable_error", data={}, max_attempts=1)
    after = make_job(data={"label": "after"})
    worker, _ = _worker()
    assert worker.run() == CLEAN_EXIT
    row = Job.objects.get(pk=nul.pk)
    assert row.status == JobStatus.FAILED
    assert "broken \\x00 text \\ud800 here" in row.last_error
    row = Job.objects.get(pk=unprintable.pk)
    assert row.status == JobStatus.FAILED
    assert "Unprintable" in row.last_error
    assert Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED
    assert _nothing_running()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("returning", "says"), [("unstorable", "NUL"), ("not_json", "is not JSON")], ids=["nul", "set"]
)
def test_run__a_django_task_returning_what_no_row_keeps_ends_failed_and_the_next_job_runs(
    returning: str, says: str
) -> None:
    bad = getattr(background, returning).enqueue("text")
    good = background.add.enqueue(1, 2)
    worker, _ = _worker(concurrency=2, node_id="w-nul")
    assert worker.run() == CLEAN_EXIT
    bad.refresh()
    assert bad.status == TaskResultStatus.FAILED
    [error] = bad.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.ResultUnstorableError"
    assert UNSTORABLE in error.traceback and says in error.traceback
    good.refresh()
    assert (good.status, good.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    assert set(Job.objects.values_list("worker", flat=True)) == {"w-nul"}
    assert _nothing_running()


@pytest.mark.django_db(transaction=True)
def test_run__a_django_task_outcome_the_database_refuses_ends_it_failed() -> None:
    result = background.add.enqueue(2, 2)
    refused, ours = DataError("value refused"), _finishing(int(result.id))
    # Refused in the dispatcher's batch, then alone: the row keeps the refusal instead.
    worker, _ = _worker(
        faults(fail("finish_and_claim", refused, when=ours), fail("finish", refused, when=ours))
    )
    assert worker.run() == CLEAN_EXIT
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.ResultUnstorableError"
    assert UNSTORABLE in Job.objects.get(pk=int(result.id)).last_error
    assert _nothing_running()


@pytest.mark.django_db(transaction=True)
def test_run__a_django_task_whose_every_write_is_refused_goes_back_counted() -> None:
    result = background.add.enqueue(3, 3)
    refused, ours = DataError("value refused"), _finishing(int(result.id))
    worker, _ = _worker(
        faults(
            fail("finish_and_claim", refused, when=ours),
            fail("finish", refused, refused, when=ours),  # Alone, then as the refusal.
        ),
        burst=False,
    )
    worker.start()
    try:
        # One run is all a Django Task has: back with it counted, it ends failed.
        wait_until(
            lambda: Job.objects.filter(pk=int(result.id), status=JobStatus.FAILED).exists(),
            what="the row to end failed",
        )
    finally:
        worker.stop()
    row = Job.objects.get(pk=int(result.id))
    assert (row.status, row.attempts) == (JobStatus.FAILED, 1)
    assert "could not record how this attempt ended" in row.last_error


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_run__the_dispatchers_connection_terminated_mid_batch_loses_no_outcome(
    fresh_registry: Registry,
) -> None:
    @job(name="test.terminate_dispatcher")
    def terminate_dispatcher(label: str) -> None:
        # One job thread, no LISTEN: the only other connection is the dispatcher's. It may
        # be between connections (closed in a quiet spell): its next turn opens one.
        deadline = time.monotonic() + 10
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                if cursor.fetchall():
                    break
                assert time.monotonic() < deadline, "no dispatcher connection found"
                time.sleep(0.02)

    now = clock.now()
    killer = make_job(
        "test.terminate_dispatcher", data={"label": "k"}, run_at=now - timedelta(seconds=5)
    )
    made = _pings(3, "terminated")
    worker, _ = _worker()
    assert worker.run() == CLEAN_EXIT
    rows = Job.objects.filter(pk__in=[killer.pk, *(job.pk for job in made)])
    assert set(rows.values_list("status", "attempts")) == {(JobStatus.SUCCEEDED, 1)}
    assert Ping.objects.count() == 3


def _terminate_own_backend(method: str, when: Any = None) -> tuple[Fault, list[str]]:
    """A ``Fault`` that lets the first call of ``method`` (that ``when`` accepts) through on a
    connection cut just before it: the calling thread's backend, terminated from another
    thread. With it, the methods still to cut: empty once it struck."""
    left = [method]

    def fault(name: str, kwargs: dict[str, Any]) -> None:
        if name not in left or (when is not None and not when(kwargs)):
            return
        left.remove(name)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            [(pid,)] = cursor.fetchall()

        def terminate() -> None:
            try:
                with connection.cursor() as cursor:
                    # Waits for the backend to be gone: the write below meets a dead socket.
                    cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            finally:
                connection.close()

        killer = threading.Thread(target=terminate)
        killer.start()
        killer.join()

    return fault, left


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_run__a_django_task_outcome_cut_with_its_connection_is_written_on_a_fresh_one() -> None:
    result = background.add.enqueue(4, 4)
    after = make_job(data={"label": "after-cut"})
    cut, left = _terminate_own_backend("finish_and_claim", when=_finishing(int(result.id)))
    worker, _ = _worker(cut, burst=False)
    worker.start()
    try:
        wait_until(
            lambda: (
                not Job.objects.filter(
                    pk__in=[int(result.id), after.pk],
                    status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
                ).exists()
            ),
            what="both jobs to end while the worker lives",
        )
    finally:
        worker.stop()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 8)
    assert Job.objects.get(pk=int(result.id)).attempts == 1
    # The outcome's first write met the cut; a later one, on a fresh connection, landed.
    assert left == []
    assert Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED
    assert worker.outcomes["succeeded"] == 2


@pytest.mark.django_db(transaction=True)
def test_run__a_child_that_cannot_start_gives_its_job_back_uncounted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    made = make_job(data={"label": "no-child"})

    def cannot_start(self: Child) -> None:
        raise ChildDied(1)

    with monkeypatch.context() as patched:
        patched.setattr(Child, "ensure", cannot_start)
        worker, _ = _worker(pool="process", burst=False)
        with caplog.at_level(logging.ERROR, logger="ultimat3_jobs.worker"):
            worker.start()
            try:
                wait_until(
                    lambda: any(
                        getattr(r, "event", "") == "jobs.worker.child-start-failed"
                        for r in caplog.records
                    ),
                    what="the child's start to fail",
                )
            finally:
                worker.stop()
        assert worker.exit_code == CLEAN_EXIT
    row = Job.objects.get(pk=made.pk)
    # It never ran: back in the queue with no attempt used, whatever the slot went through.
    assert (row.status, row.attempts, row.worker) == (JobStatus.QUEUED, 0, "")
    assert not Ping.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_run__jobs_claimed_while_the_children_start_are_not_marked_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each slot's child sets Django up first (most of a second): a job claimed meanwhile is
    # marked started only once a child can run it, so a worker killed then costs it nothing.
    made = [make_job(data={"label": f"early-{n}"}) for n in range(2)]
    release = threading.Event()

    def starting(self: Child) -> None:
        release.wait(30)
        raise ChildDied(1)

    monkeypatch.setattr(Child, "ensure", starting)
    worker, _ = _worker(pool="process", burst=False, concurrency=2)
    worker.start()
    try:
        wait_until(
            lambda: Job.objects.filter(status=JobStatus.RUNNING).count() == 2,
            what="both jobs to be claimed",
        )
        rows = Job.objects.filter(pk__in=[m.pk for m in made])
        # Unmarked, a recovery gives each back with its attempt uncounted.
        assert [r.started_at for r in rows] == [None, None]
    finally:
        release.set()
        worker.stop()


def _child() -> Child:
    setup = ChildSetup(
        databases={}, using="default", node_id="w1", backoff_base=2, backoff_max_s=60,
        retry_every_s=1,
    )  # fmt: skip
    return Child(setup)


def test_child__one_that_dies_starting_is_told_with_its_exit_code_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real child, whose settings cannot be imported: it exits 1 before it is ready.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.integration.no_such_settings")
    child = _child()
    with pytest.raises(ChildDied) as died:
        child.ensure()
    assert died.value.exit_code == 1
    assert child.pid is None and len(child.pids) == 1


def test_child__a_start_given_up_ends_at_once_and_kills_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_child_settings")
    child, raised = _child(), []

    def start() -> None:
        try:
            child.ensure()
        except ChildDied as error:
            raised.append(error)

    starting = threading.Thread(target=start)
    starting.start()
    wait_until(lambda: child.pids, what="the child to be spawned")
    child.cancel()
    starting.join(10)  # Its settings take a minute: only the cancel ends the start this soon.
    assert not starting.is_alive() and len(raised) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(child.pids[0], 0)
    # Given up for good: no other child is started.
    with pytest.raises(ChildDied):
        child.ensure()
    assert len(child.pids) == 1


@pytest.mark.django_db(transaction=True)
def test_run__a_django_task_past_the_timeout_ends_failed_with_the_timeout_as_its_error(
    settings: Any,
) -> None:
    settings.ULTIMAT3_JOBS = {"JOB_TIMEOUT": 1}  # Its setting_changed clears the settings.
    told: list[tuple[str, str, list[str]]] = []

    def receive(*, task_result: Any, **kwargs: Any) -> None:
        paths = [error.exception_class_path for error in task_result.errors]
        told.append((task_result.id, str(task_result.status), paths))

    task_finished.connect(receive, weak=False)
    result = background.nap.enqueue(3)
    after = background.add.enqueue(1, 1)
    worker, _ = _worker(burst=False)
    worker.start()
    try:
        wait_until(
            lambda: (
                not Job.objects.filter(
                    pk__in=[int(result.id), int(after.id)],
                    status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
                ).exists()
            ),
            what="both to end",
        )
    finally:
        worker.stop()
        task_finished.disconnect(receive)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.JobTimeoutError"
    assert "jobs.job.timeout" in Job.objects.get(pk=int(result.id)).last_error
    after.refresh()  # The slot ran the next one.
    assert (after.status, after.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    # Its task_finished was sent too, as for a task that raised: its receivers hear of it.
    assert (result.id, "FAILED", ["ultimat3_jobs.errors.JobTimeoutError"]) in told
    assert (after.id, "SUCCESSFUL", []) in told


def _terminated_while_idle() -> None:
    """This thread's connection, looked at and then terminated by the server while idle:
    nothing has told the client yet."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [(pid,)] = cursor.fetchall()
    drop_broken_connections()
    assert connection.connection is not None
    with dedicated_connection("default", "terminator") as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_until(
            lambda: (
                not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchall()
            )
        )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_drop_broken_connections__closes_a_connection_the_server_hung_up_on_while_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database restart between two jobs terminates a busy thread's idle connection, and
    nothing has told the client yet: the next job must not meet it as its first query's error
    (a Django Task is never retried). Once another loop has opened a connection (as the
    dispatcher does before it claims again), it is closed before the job; a live one stays
    open, and with no connection opened since the last look, none is looked at."""
    monkeypatch.setattr(lifecycle, "HANG_UP_LOOK_EVERY", 3600.0)
    _terminated_while_idle()
    drop_broken_connections()
    assert connection.connection is not None  # Nothing opened since: not looked at.
    reconnect = threading.Thread(target=_reconnect)
    reconnect.start()
    reconnect.join()
    drop_broken_connections()
    assert connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchall() == [(1,)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_drop_broken_connections__a_backend_terminated_alone__is_closed_once_the_look_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend terminated on its own (``pg_terminate_backend``, ``idle_session_timeout``)
    makes no other loop reconnect: the thread looks again once ``HANG_UP_LOOK_EVERY`` has
    passed since its last look, and closes it before the job."""
    monkeypatch.setattr(lifecycle, "HANG_UP_LOOK_EVERY", 3600.0)
    _terminated_while_idle()
    drop_broken_connections()
    assert connection.connection is not None  # Looked at last within the interval.
    monkeypatch.setattr(lifecycle, "HANG_UP_LOOK_EVERY", 0.2)
    time.sleep(0.25)
    drop_broken_connections()
    assert connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchall() == [(1,)]


def _reconnect() -> None:
    """A loop's new connection, in a thread of its own, as the dispatcher opens one after a
    restart."""
    connections["default"].ensure_connection()
    connections.close_all()


# -- rows written around the app ------------------------------------------------------------------

POISONS = {
    "run_at_minus_infinity": "UPDATE ultimat3_jobs_job SET run_at = '-infinity' WHERE id = %s",
    "run_at_before_year_1": (
        "UPDATE ultimat3_jobs_job SET run_at = '0001-01-01 00:00+05' WHERE id = %s"
    ),
    "input_nested_5000_deep": (
        "UPDATE ultimat3_jobs_job SET input = "
        "jsonb_build_object('label', (repeat('[', 5000) || repeat(']', 5000))::jsonb) "
        "WHERE id = %s"
    ),
    "input_a_string": "UPDATE ultimat3_jobs_job SET input = '\"text\"' WHERE id = %s",
    "input_null": "UPDATE ultimat3_jobs_job SET input = 'null' WHERE id = %s",
    "input_an_array": "UPDATE ultimat3_jobs_job SET input = '[1, 2]' WHERE id = %s",
    "task_created_at_in_year_294270": (  # Past what a bigint of microseconds holds.
        "UPDATE ultimat3_jobs_job SET created_at = '294270-06-01 00:00+00' WHERE id = %s"
    ),
    "task_created_at_infinity": (
        "UPDATE ultimat3_jobs_job SET created_at = 'infinity' WHERE id = %s"
    ),
}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("poison", sorted(POISONS))
def test_run__a_row_written_by_sql_that_no_worker_can_read_fails_alone_and_the_batch_runs(
    poison: str,
) -> None:
    # The rows share one claim: before, the claim itself failed (an infinite instant) or its
    # reading raised after it committed, the whole batch left running and the worker dead.
    good = _pings(6, "good")
    bad = (
        background.add.enqueue(1, 2).id
        if poison.startswith("task_")
        else make_job(data={"label": "bad"}, run_at=clock.now() - timedelta(seconds=30)).id
    )
    with connection.cursor() as cursor:
        cursor.execute(POISONS[poison], [int(bad)])
    worker, _ = _worker(concurrency=2, node_id="w-poison")

    assert worker.run() == CLEAN_EXIT

    row = Job.objects.filter(pk=bad).values("status", "attempts", "last_error").get()
    assert row["status"] == JobStatus.FAILED
    assert "jobs.job.row-unreadable" in row["last_error"]
    assert row["attempts"] == 1
    statuses = Counter(
        Job.objects.filter(pk__in=[j.pk for j in good]).values_list("status", flat=True)
    )
    assert statuses == {JobStatus.SUCCEEDED: 6}
    assert Ping.objects.count() == 6
    assert _nothing_running()
    if poison.startswith("task_"):
        # Its TaskError's class (its result cannot be loaded: Django reads no infinite instant).
        kept = Job.objects.filter(pk=bad).values_list("error_class", flat=True).get()
        assert kept == "ultimat3_jobs.errors.JobRowUnreadableError"


@pytest.mark.django_db(transaction=True)
def test_run__an_error_the_loop_does_not_handle_ends_it_with_a_stopped_line_that_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _pings(2, "crash")
    worker, _ = _worker(fail("finish_and_claim", RuntimeError("not a database error")))

    with (
        caplog.at_level(logging.INFO, logger="ultimat3_jobs.worker"),
        pytest.raises(RuntimeError, match="not a database error"),
    ):
        worker.run()

    [stopped] = [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.stopped"]
    fields = getattr(stopped, "fields", {})
    assert (fields["reason"], fields["exit_code"]) == ("crashed", 1)


# -- what a job leaves behind ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_run__a_job_that_leaves_its_transaction_open_fails_and_the_next_jobs_keep_their_writes(
    pool: str,
) -> None:
    now = clock.now()
    leaky = make_job(
        "demo.ping_uncommitted",
        data={"label": "uncommitted"},
        run_at=now - timedelta(seconds=3),
        max_attempts=1,
    )
    after = _pings(2, "after")
    worker, _ = _worker(pool=pool)
    assert worker.run() == CLEAN_EXIT
    leaky.refresh_from_db()
    assert leaky.status == JobStatus.FAILED
    assert "JobTransactionLeftOpenError" in leaky.last_error
    assert "what it wrote there was rolled back" in leaky.last_error
    # The jobs its thread (or child) ran next wrote on a clean connection, their marks too.
    assert sorted(Ping.objects.values_list("label", flat=True)) == ["after-0", "after-1"]
    rows = Job.objects.filter(pk__in=[job.pk for job in after])
    assert {(row.status, row.started_at is not None) for row in rows} == {
        (JobStatus.SUCCEEDED, True)
    }


@pytest.mark.django_db(transaction=True)
def test_run__a_django_task_that_leaves_its_transaction_open_fails_with_that_error() -> None:
    uncommitted = background.record_uncommitted.enqueue("uncommitted")
    after = background.record.enqueue("after")
    worker, _ = _worker()
    assert worker.run() == CLEAN_EXIT
    uncommitted.refresh()
    assert uncommitted.status == TaskResultStatus.FAILED
    [error] = uncommitted.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.JobTransactionLeftOpenError"
    after.refresh()
    assert (after.status, after.return_value) == (TaskResultStatus.SUCCESSFUL, "after")
    assert list(Ping.objects.values_list("label", flat=True)) == ["after"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_run__a_job_past_its_timeout_has_its_statement_cancelled_and_its_locks_let_go(
    pool: str,
) -> None:
    # The job's function blocks in the server (pg_sleep) holding a lock: a killed child, or an
    # abandoned thread, would leave the server running it, the lock held, for its ten minutes.
    stuck = make_job(
        "demo.hold_lock_in_query", data={"label": "stuck", "key": 4242}, max_attempts=1
    )
    worker, _ = _worker(pool=pool)
    assert worker.run() == CLEAN_EXIT
    stuck.refresh_from_db()
    assert stuck.status == JobStatus.FAILED
    assert "jobs.job.timeout" in stuck.last_error
    with dedicated_connection("default", "probe") as other:

        def lock_free() -> bool:
            [(taken,)] = other.execute("SELECT pg_try_advisory_lock(4242)").fetchall()
            if taken:
                other.execute("SELECT pg_advisory_unlock(4242)")
            return bool(taken)

        wait_until(lock_free, what="the timed-out job's lock to be let go", timeout=10)
        sleeping = other.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)' "
            "AND state = 'active'"
        ).fetchall()
        assert sleeping == [(0,)]
    assert not Ping.objects.filter(label="stuck").exists()


@pytest.mark.django_db(transaction=True)
def test_run__backing_off_from_claims_that_fail_with_the_database_up_it_still_heartbeats() -> None:
    # A migration's lock, a statement timeout: the claim fails, the heartbeat would not. It
    # stopped for the backoff's seconds, and the health checks judged the worker dead.
    def claims_fail(name: str, kwargs: dict[str, Any]) -> BaseException | None:
        if name in ("claim", "finish_and_claim"):
            error = OperationalError("canceling statement due to lock timeout")
            error.__cause__ = psycopg.errors.LockNotAvailable()  # SQLSTATE 55P03
            return error
        return None

    worker, _ = _worker(
        claims_fail, node_id="w-backing-off", burst=False, poll_interval=timedelta(seconds=5)
    )
    worker.node.every = timedelta(seconds=0.2)

    with running(worker):
        time.sleep(0.6)
        first = _last_seen("w-backing-off")
        time.sleep(1.0)
        then = _last_seen("w-backing-off")
    assert then > first


def _last_seen(node_id: str) -> datetime:
    return Node.objects.get(node_id=node_id).last_seen_at
