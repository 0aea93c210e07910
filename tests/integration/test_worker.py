"""The worker against a real database: claims, outcomes, retries, recovery, drain, pruning."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from testproject.demo.models import Ping
from testproject.demo.tasks import always_fail, ping, slow_ping
from ultimat3_jobs import clock
from ultimat3_jobs.attempts import Outcome
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.db import execute_bound
from ultimat3_jobs.declarations import job
from ultimat3_jobs.errors import ConfigurationError
from ultimat3_jobs.models import Job, JobStatus, Node, Occurrence, Task
from ultimat3_jobs.registry import Registry, registry
from ultimat3_jobs.retention import prune
from ultimat3_jobs.store import ClaimedJob, sql, store_for
from ultimat3_jobs.worker import ABANDONED_EXIT, CLEAN_EXIT, Worker

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
QUICK: dict[str, Any] = {
    "poll_interval": timedelta(seconds=0.05),
    "heartbeat_interval": timedelta(seconds=0.2),
    "backoff_max": timedelta(seconds=0.05),
    "drain_on_shutdown": False,
}


def quick_worker(**options: Any) -> Worker:
    """A worker that polls, heartbeats and backs off in fractions of a second."""
    return Worker(**{**QUICK, **options})


def make_job(
    name: str = "demo.ping",
    *,
    data: dict[str, Any] | None = None,
    run_at: datetime | None = None,
    queue: str = "default",
    status: str = JobStatus.QUEUED,
    attempts: int = 0,
    max_attempts: int = 3,
    worker: str = "",
    created_at: datetime | None = None,
    finished_at: datetime | None = None,
    started: bool | None = None,
) -> Job:
    """A job row; a running one has started (its function ran) unless ``started=False``: a
    claimed-ahead row, not started yet."""
    now = clock.now()  # The worker's clock, which keeps milliseconds only.
    if started is None:
        started = status == JobStatus.RUNNING
    return Job.objects.create(
        name=name,
        key=f"{name}:{uuid.uuid4().hex}",
        input={"label": uuid.uuid4().hex} if data is None else data,
        queue=queue,
        run_at=run_at or now,
        created_at=created_at or now,
        status=status,
        attempts=attempts,
        max_attempts=max_attempts,
        worker=worker,
        started_at=now if started else None,
        finished_at=finished_at,
    )


def make_node(node_id: str, *, seen_ago: timedelta, stopped: bool = False) -> Node:
    now = timezone.now()
    return Node.objects.create(
        node_id=node_id,
        role="worker",
        host="elsewhere",
        pid=1,
        started_at=now - timedelta(hours=1),
        last_seen_at=now - seen_ago,
        stopped_at=now if stopped else None,
    )


def wait_until(condition: Callable[[], Any], timeout: float = 10, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def recorded(fresh_registry: Registry) -> Iterator[list[dict[str, Any]]]:
    """A job ``test.record`` that appends its input here: what ran, with which arguments."""
    calls: list[dict[str, Any]] = []

    @job(name="test.record")
    def record(**kwargs: Any) -> None:
        calls.append(kwargs)

    yield calls


@pytest.fixture
def quiet_logger() -> Iterator[None]:
    """``run_worker`` reconfigures the app's logger; put it back for the tests after us."""
    root = logging.getLogger("ultimat3_jobs")
    saved = (list(root.handlers), root.level, root.propagate)
    try:
        yield
    finally:
        root.handlers[:], root.level, root.propagate = saved


# -- claiming ------------------------------------------------------------------------------------


def claim(
    worker: str, limit: int, *, now: datetime | None = None, queues: set[str] | None = None
) -> list[ClaimedJob]:
    """What a worker's claim hands it: the store's, as the loop calls it."""
    return store_for("default").claim(
        worker=worker,
        limit=limit,
        now=now or clock.now(),
        queues=frozenset(queues) if queues else None,
    )


@pytest.mark.django_db
def test_claim__takes_due_jobs_oldest_first_and_counts_the_attempt() -> None:
    later = make_job(run_at=T0 - timedelta(seconds=1))
    older = make_job(run_at=T0 - timedelta(seconds=5))
    claimed = claim("w1", 10, now=T0)
    assert [j.id for j in claimed] == [older.pk, later.pk]
    rows = Job.objects.filter(pk__in=[older.pk, later.pk])
    assert set(rows.values_list("status", "attempts", "worker", "started_at")) == {
        (JobStatus.RUNNING, 1, "w1", T0)
    }
    assert claimed[0].input == older.input  # JSON comes back decoded.


@pytest.mark.django_db
def test_claim__leaves_future_jobs_other_queues_and_running_ones() -> None:
    due = make_job(run_at=T0, queue="emails")
    make_job(run_at=T0 + timedelta(seconds=1), queue="emails")
    make_job(run_at=T0, queue="reports")
    make_job(run_at=T0, queue="emails", status=JobStatus.RUNNING, worker="other")
    assert [j.id for j in claim("w1", 10, now=T0, queues={"emails"})] == [due.pk]
    assert claim("w1", 10, now=T0, queues={"emails"}) == []


@pytest.mark.django_db(transaction=True)
def test_claim__of_several_queues_takes_their_jobs_in_one_claim_order_and_locks_none_left() -> None:
    # Priority first, then the longest due, then id, across the queues claimed.
    at = {n: T0 - timedelta(seconds=n) for n in range(10)}
    emails = [make_job(run_at=at[9], queue="emails"), make_job(run_at=at[3], queue="emails")]
    reports = [make_job(run_at=at[6], queue="reports"), make_job(run_at=at[1], queue="reports")]
    urgent = make_job(run_at=at[0], queue="reports")
    Job.objects.filter(pk=urgent.pk).update(priority=5)
    other = make_job(run_at=at[8], queue="other")
    claimed = claim("w1", 3, now=T0, queues={"emails", "reports"})
    assert [j.id for j in claimed] == [urgent.pk, emails[0].pk, reports[0].pk]
    # The rows each queue locked past the limit went back with the claim's commit.
    rest = claim("w2", 10, now=T0, queues={"emails", "reports", "other"})
    assert [j.id for j in rest] == [other.pk, emails[1].pk, reports[1].pk]


def _queued_rows(queue: str, count: int, run_at: str, priority: int = 0) -> None:
    """``count`` queued rows of ``queue`` at once, ``run_at`` an SQL expression of ``n`` and
    of one ``%s``, T0."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ultimat3_jobs_job (name, key, input, status, queue, attempts, "
            "max_attempts, run_at, created_at, last_error, task, catch_up, enqueued_by, worker, "
            "priority, backend, relay, trace_context, args) "
            f"SELECT 'demo.ping', %s || n, '{{}}', 'queued', %s, 0, 3, {run_at}, %s, '', '', "
            "false, 'code', '', %s, '', '', '', '[]' FROM generate_series(1, %s) AS n",
            [f"{queue}:{priority}:{run_at}:", queue, T0, T0, priority, count],
        )


def _blocks_read(statement: str, params: dict[str, Any]) -> int:
    """The buffers a claim statement touches, run as the store runs it, then rolled back."""
    with transaction.atomic():
        execute_bound("default", sql.CLAIM_PLANNER, ())
        [(plan,)] = execute_bound(
            "default", f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", params
        )
        transaction.set_rollback(True)
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("queues", [None, ["mine"]], ids=["every queue", "given queues"])
def test_claim__reads_neither_jobs_not_due_yet_nor_another_queues_backlog(
    queues: list[str] | None,
) -> None:
    # 200,000 jobs of two priorities due tomorrow, behind the three due now; for a worker of
    # given queues, 50,000 more due before them in another queue. One walk of an index whose
    # first column is the priority read every entry not due yet; a queue filter on the ready
    # index read every row of the other queue.
    for priority in (0, 5):
        _queued_rows("mine", 100_000, "%s + interval '1 day' + n * interval '1 ms'", priority)
    if queues:
        _queued_rows("backlog", 50_000, "%s - n * interval '1 ms'")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ultimat3_jobs_job")
    mine = [make_job(run_at=T0 - timedelta(seconds=n), queue="mine") for n in range(3)]
    Job.objects.filter(pk=mine[2].pk).update(priority=-5)
    Job.objects.filter(pk=mine[0].pk).update(priority=5)
    params = {"now": T0, "limit": 10, "start": 10, "worker": "w1"}
    statement = sql.CLAIM_ANY_QUEUE if queues is None else sql.CLAIM_QUEUES
    read = _blocks_read(statement, {**params, "queues": queues} if queues else params)
    # The three claimed rows, their new index entries and the levels' descents: 81 and 92
    # blocks alone, more where earlier tests left dead entries behind; 1,435 and 4,780 when one
    # walk read what is not due and the queue filter the other queue.
    assert read < 500, read
    claimed = claim("w1", 10, now=T0, queues=set(queues) if queues else None)
    assert [j.id for j in claimed] == [mine[0].pk, mine[1].pk, mine[2].pk]


@pytest.mark.django_db
def test_claim__respects_the_limit_and_never_hands_a_job_out_twice() -> None:
    jobs = [make_job() for _ in range(5)]
    first = claim("w1", 3)
    second = claim("w2", 3)
    assert len(first) == 3
    assert len(second) == 2
    assert sorted(j.id for j in first + second) == [j.pk for j in jobs]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_claim__concurrent_claimers_split_the_jobs_without_overlap() -> None:
    Job.objects.bulk_create(
        [Job(name="demo.ping", key=f"k{i}", input={}, run_at=T0, created_at=T0) for i in range(300)]
    )
    got: dict[str, list[int]] = {}
    start = threading.Barrier(4)

    def claimer(name: str) -> None:
        try:
            start.wait()
            mine: list[int] = []
            while batch := claim(name, 7):
                mine += [j.id for j in batch]
            got[name] = mine
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    everything = [pk for ids in got.values() for pk in ids]
    assert len(everything) == 300
    assert len(set(everything)) == 300
    assert sum(1 for ids in got.values() if ids) > 1, "one claimer took everything"


# -- running and recording ----------------------------------------------------------------------


def burst_worker(**options: Any) -> Worker:
    """A worker that runs what is due now, then returns: ``run()`` is the public path."""
    return Worker(**{"node_id": "w1", "burst": True, "drain_on_shutdown": False, **options})


def ran(worker: Worker) -> list[Outcome]:
    """Run ``worker`` to the end: how each attempt it claimed ended."""
    assert worker.run() == CLEAN_EXIT
    outcomes = [outcome for outcome, count in worker.outcomes.items() for _ in range(count)]
    assert len(outcomes) == worker.claimed
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_run__passes_the_input_as_keyword_arguments_and_records_success(
    recorded: list[dict[str, Any]],
) -> None:
    made = make_job("test.record", data={"day": "2026-06-01", "n": 3})
    assert ran(burst_worker()) == ["succeeded"]
    assert recorded == [{"day": "2026-06-01", "n": 3}]
    row = Job.objects.get(pk=made.pk)
    assert row.status == JobStatus.SUCCEEDED
    assert row.started_at is not None and row.finished_at is not None
    assert row.started_at <= row.finished_at
    assert row.last_error == ""


@pytest.mark.django_db(transaction=True)
def test_run__failure_is_requeued_with_backoff_and_its_traceback() -> None:
    clock = FrozenClock(T0)
    made = make_job("demo.always_fail", data={"label": "x"}, run_at=T0)
    options: dict[str, Any] = {
        "clock": clock,
        "backoff_base": 2,
        "backoff_max": timedelta(hours=1),
        "rand": lambda: 0.5,
    }
    # One attempt: the burst claims nothing more, as the job is not due before its backoff ends.
    assert ran(burst_worker(**options)) == ["retrying"]
    row = Job.objects.get(pk=made.pk)
    assert row.status == JobStatus.QUEUED
    assert row.attempts == 1
    assert row.run_at == T0 + timedelta(seconds=1)  # 2 ** 1 seconds, half of it by the jitter.
    assert row.worker == ""
    assert row.finished_at is None
    assert "RuntimeError: demo failure: x" in row.last_error
    assert "Traceback" in row.last_error
    clock.advance(1)
    assert ran(burst_worker(**options)) == ["retrying"]  # Due now: claimed and run again.
    assert Job.objects.get(pk=made.pk).attempts == 2


@pytest.mark.django_db(transaction=True)
def test_run__the_last_attempt_ends_failed_with_its_error() -> None:
    made = make_job("demo.always_fail", data={"label": "y"}, attempts=2, max_attempts=3)
    assert ran(burst_worker()) == ["failed"]
    row = Job.objects.get(pk=made.pk)
    assert (row.status, row.attempts) == (JobStatus.FAILED, 3)
    assert row.finished_at is not None
    assert "demo failure: y" in row.last_error


@pytest.mark.django_db(transaction=True)
def test_run__a_job_this_worker_does_not_know_waits_uncounted_for_a_worker_that_does(
    fresh_registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    # A job of the new release, claimed by a worker of the last one in a rolling deploy.
    made = make_job("nowhere.new", data={"label": "n"}, max_attempts=5)
    worker = burst_worker()
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs.worker"):
        assert worker.run() == CLEAN_EXIT
    row = Job.objects.get(pk=made.pk)
    assert (row.status, row.attempts, row.worker, row.started_at) == (
        JobStatus.QUEUED,
        0,
        "",
        None,
    )
    assert row.target_unknown_since is not None
    assert timedelta(seconds=4) < row.run_at - row.target_unknown_since <= timedelta(seconds=5)
    assert 'job "nowhere.new" is not declared in worker w1; waiting' in row.last_error
    [waiting] = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.job-unknown-waiting"
    ]
    assert waiting.fields["code"] == "jobs.job.unknown"  # type: ignore[attr-defined]
    assert worker.outcomes["failed"] == 0
    # The new release's worker declares it, and runs it on its first attempt.
    seen: list[str] = []

    @job(name="nowhere.new")
    def new(label: str) -> None:
        seen.append(label)

    Job.objects.filter(pk=made.pk).update(run_at=clock.now())
    assert ran(burst_worker()) == ["succeeded"]
    assert seen == ["n"]
    assert Job.objects.get(pk=made.pk).attempts == 1


@pytest.mark.django_db(transaction=True)
def test_run__a_job_no_worker_declared_within_the_grace_fails_unrun() -> None:
    made = make_job("nowhere.gone", data={}, max_attempts=5)
    Job.objects.filter(pk=made.pk).update(target_unknown_since=clock.now() - timedelta(seconds=300))
    assert ran(burst_worker()) == ["failed"]
    row = Job.objects.get(pk=made.pk)
    assert (row.status, row.attempts) == (JobStatus.FAILED, 1)
    assert row.last_error.startswith(
        'job "nowhere.gone" is not declared in this worker, nor in any that claimed it within '
        "UNKNOWN_JOB_GRACE (300 s) [jobs.job.unknown]\nfix: deploy the code that declares it"
    )


@pytest.mark.django_db(transaction=True)
def test_run__input_that_does_not_fit_the_function_is_a_failure() -> None:
    made = make_job("demo.ping", data={"wrong": 1}, max_attempts=1)
    assert ran(burst_worker()) == ["failed"]
    assert "TypeError" in Job.objects.get(pk=made.pk).last_error


@pytest.mark.django_db(transaction=True)
def test_run__a_job_cancelled_while_running_stays_cancelled(fresh_registry: Registry) -> None:
    @job(name="test.cancelled_meanwhile")
    def cancelled_meanwhile(key: str) -> None:
        # As the admin's Cancel would, while the job runs.
        Job.objects.filter(key=key).update(status=JobStatus.CANCELLED)

    made = make_job("test.cancelled_meanwhile", data={})
    Job.objects.filter(pk=made.pk).update(input={"key": made.key})
    assert ran(burst_worker()) == ["lost"]
    assert Job.objects.get(pk=made.pk).status == JobStatus.CANCELLED


# -- heartbeats and recovery --------------------------------------------------------------------


@pytest.mark.django_db
def test_heartbeat__creates_the_node_row_then_refreshes_it() -> None:
    worker = Worker(node_id="w1", drain_on_shutdown=False)
    worker.heartbeat()
    first = Node.objects.get(node_id="w1")
    assert first.role == "worker"
    assert first.stopped_at is None
    Node.objects.filter(node_id="w1").update(last_seen_at=T0)
    worker.heartbeat()
    assert Node.objects.get(node_id="w1").last_seen_at > T0


@pytest.mark.django_db
def test_recover__requeues_a_dead_workers_jobs_keeping_their_attempts() -> None:
    make_node("dead", seen_ago=timedelta(minutes=5))
    orphan = make_job(status=JobStatus.RUNNING, worker="dead", attempts=1)
    never_seen = make_job(status=JobStatus.RUNNING, worker="ghost", attempts=2)
    result = Worker(node_id="w1", stale_after=timedelta(seconds=60)).recover()
    assert (result.requeued, result.failed) == (2, 0)
    rows = Job.objects.filter(pk__in=[orphan.pk, never_seen.pk]).order_by("pk")
    assert list(rows.values_list("status", "attempts", "worker")) == [
        (JobStatus.QUEUED, 1, ""),
        (JobStatus.QUEUED, 2, ""),
    ]
    assert "worker dead stopped heartbeating" in rows[0].last_error


@pytest.mark.django_db
def test_recover__a_job_that_kept_killing_its_worker_ends_failed() -> None:
    make_node("dead", seen_ago=timedelta(minutes=5))
    from prometheus_client import REGISTRY

    killer = make_job(
        "demo.killer", status=JobStatus.RUNNING, worker="dead", attempts=3, max_attempts=3
    )
    labels = {"name": "demo.killer", "queue": "default"}
    before = REGISTRY.get_sample_value("ultimat3_jobs_worker_jobs_failed_total", labels) or 0
    result = Worker(node_id="w1", stale_after=timedelta(seconds=60)).recover()
    assert (result.requeued, result.failed) == (0, 1)
    # Counted as any job this worker ends failed.
    after = REGISTRY.get_sample_value("ultimat3_jobs_worker_jobs_failed_total", labels)
    assert after == before + 1
    row = Job.objects.get(pk=killer.pk)
    assert (row.status, row.attempts) == (JobStatus.FAILED, 3)
    assert row.finished_at is not None
    assert "its worker died during each of them" in row.last_error


@pytest.mark.django_db
def test_recover__leaves_live_workers_alone_but_not_stopped_ones() -> None:
    make_node("alive", seen_ago=timedelta(seconds=1))
    make_node("stopped", seen_ago=timedelta(seconds=1), stopped=True)
    busy = make_job(status=JobStatus.RUNNING, worker="alive", attempts=1)
    left = make_job(status=JobStatus.RUNNING, worker="stopped", attempts=1)
    result = Worker(node_id="w1", stale_after=timedelta(seconds=60)).recover()
    assert (result.requeued, result.failed) == (1, 0)
    assert Job.objects.get(pk=busy.pk).status == JobStatus.RUNNING
    assert Job.objects.get(pk=left.pk).status == JobStatus.QUEUED


def test_worker__refuses_a_stale_limit_a_live_worker_could_cross() -> None:
    with pytest.raises(ConfigurationError, match="WORKER_STALE_AFTER") as raised:
        Worker(heartbeat_interval=timedelta(seconds=5), stale_after=timedelta(seconds=10))
    assert "HEARTBEAT_INTERVAL" in raised.value.message


# -- the loop -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run__burst_runs_everything_due_then_returns_clean() -> None:
    labels = [f"burst-{n}" for n in range(12)]
    for label in labels:
        ping.enqueue({"label": label})
    ping.enqueue({"label": "later"}, run_at=timezone.now() + timedelta(hours=1))
    worker = quick_worker(burst=True, concurrency=3)
    assert worker.run() == CLEAN_EXIT
    assert sorted(Ping.objects.values_list("label", flat=True)) == sorted(labels)
    assert worker.outcomes["succeeded"] == 12
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 1
    assert Node.objects.get(node_id=worker.node_id).stopped_at is not None


@pytest.mark.django_db(transaction=True)
def test_run__max_jobs_stops_after_that_many() -> None:
    for n in range(5):
        ping.enqueue({"label": f"max-{n}"})
    worker = quick_worker(max_jobs=2, concurrency=2)
    assert worker.run() == CLEAN_EXIT
    assert Ping.objects.count() == 2
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 3


@pytest.mark.django_db(transaction=True)
def test_run__retries_a_failing_job_until_it_ends_failed() -> None:
    made = always_fail.enqueue({"label": "again"})
    worker = quick_worker(listen=False)
    worker.start()
    try:
        wait_until(
            lambda: Job.objects.filter(pk=made.job_id, status=JobStatus.FAILED).exists(),
            what="the job to run out of attempts",
        )
    finally:
        worker.stop()
    row = Job.objects.get(pk=made.job_id)
    assert row.attempts == 3
    assert "demo failure: again" in row.last_error
    assert worker.outcomes["retrying"] == 2
    assert worker.exit_code == CLEAN_EXIT


@pytest.mark.django_db(transaction=True)
def test_stop__waits_for_the_job_in_flight_and_claims_nothing_more() -> None:
    made = slow_ping.enqueue({"label": "in flight", "seconds": 0.5})
    worker = quick_worker(listen=False, drain_grace=timedelta(seconds=10))
    worker.start()
    wait_until(lambda: worker.in_flight() == [made.job_id], what="the job to start")
    waiting = ping.enqueue({"label": "never claimed"})
    worker.stop("test")
    assert worker.exit_code == CLEAN_EXIT
    assert Job.objects.get(pk=made.job_id).status == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=waiting.job_id).status == JobStatus.QUEUED
    assert list(Ping.objects.values_list("label", flat=True)) == ["in flight"]


@pytest.mark.django_db(transaction=True)
def test_stop__past_the_grace_gives_the_job_back_to_the_queue() -> None:
    made = slow_ping.enqueue({"label": "too slow", "seconds": 1.5})
    worker = quick_worker(listen=False, drain_grace=timedelta(seconds=0.2))
    worker.start()
    wait_until(lambda: worker.in_flight() == [made.job_id], what="the job to start")
    worker.stop("test")
    assert worker.exit_code == ABANDONED_EXIT
    row = Job.objects.get(pk=made.job_id)
    assert (row.status, row.attempts, row.worker) == (JobStatus.QUEUED, 1, "")
    assert "stopped before this attempt finished" in row.last_error
    assert worker.join(timeout=5)  # The abandoned attempt ends; its outcome is not written.
    assert Job.objects.get(pk=made.job_id).status == JobStatus.QUEUED
    assert worker.outcomes["lost"] == 1


@pytest.mark.django_db(transaction=True)
def test_run__recovers_a_dead_workers_job_and_runs_it() -> None:
    make_node("dead", seen_ago=timedelta(minutes=5))
    orphan = make_job(status=JobStatus.RUNNING, worker="dead", attempts=1, data={"label": "saved"})
    worker = quick_worker(burst=True, stale_after=timedelta(seconds=60))
    assert worker.run() == CLEAN_EXIT
    row = Job.objects.get(pk=orphan.pk)
    assert (row.status, row.attempts, row.worker) == (JobStatus.SUCCEEDED, 2, worker.node_id)
    assert list(Ping.objects.values_list("label", flat=True)) == ["saved"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_run__notify_wakes_the_worker_long_before_the_next_poll() -> None:
    worker = Worker(
        poll_interval=timedelta(seconds=30),
        heartbeat_interval=timedelta(seconds=20),
        drain_on_shutdown=False,
    )
    worker.start()
    try:
        wait_until(lambda: worker.listening, what="LISTEN")
        time.sleep(0.1)  # Let the dispatcher settle into its long wait.
        started = time.monotonic()
        ping.enqueue({"label": "woken"})
        wait_until(lambda: Ping.objects.filter(label="woken").exists(), timeout=5, what="run")
        assert time.monotonic() - started < 2
    finally:
        worker.stop()


@pytest.mark.django_db(transaction=True)
def test_run__polling_finds_jobs_without_listen() -> None:
    worker = quick_worker(listen=False)
    worker.start()
    try:
        time.sleep(0.1)
        ping.enqueue({"label": "polled"})
        wait_until(lambda: Ping.objects.filter(label="polled").exists(), timeout=5, what="run")
    finally:
        assert not worker.listening
        worker.stop()


# -- pruning ------------------------------------------------------------------------------------


def _old_and_new_rows() -> dict[str, Job]:
    now = timezone.now()
    old = now - timedelta(days=20)
    fresh = now - timedelta(days=1)
    for when in (old, fresh):
        Occurrence.objects.create(task="t", outcome="fired", occurrence=when, recorded_at=when)
    make_node("gone", seen_ago=timedelta(days=20))
    return {
        "old_succeeded": make_job(status=JobStatus.SUCCEEDED, finished_at=old, created_at=old),
        "old_failed": make_job(status=JobStatus.FAILED, finished_at=old, created_at=old),
        "old_cancelled": make_job(status=JobStatus.CANCELLED, created_at=old),
        "old_queued": make_job(status=JobStatus.QUEUED, created_at=old, run_at=old),
        "old_running": make_job(status=JobStatus.RUNNING, created_at=old, worker="w"),
        "new_succeeded": make_job(status=JobStatus.SUCCEEDED, finished_at=fresh),
    }


@pytest.mark.django_db
def test_prune__deletes_finished_jobs_and_records_past_retention_only() -> None:
    jobs = _old_and_new_rows()
    result = prune(older_than=timedelta(days=14), batch_size=2)
    assert (result.jobs, result.occurrences, result.nodes) == (3, 1, 1)
    left = set(Job.objects.values_list("pk", flat=True))
    assert left == {jobs[k].pk for k in ("old_queued", "old_running", "new_succeeded")}
    assert Occurrence.objects.exclude(outcome="pruned").count() == 1
    assert not Node.objects.filter(node_id="gone").exists()
    # The prune is on record, under the app's prune task, its cutoff as the occurrence.
    record = Occurrence.objects.get(outcome="pruned")
    assert (record.task, record.occurrence) == ("ultimat3_jobs.prune", result.cutoff)
    assert record.detail == "deleted 3 finished job(s), 1 record(s), 1 node(s)"
    # Before that cutoff, what a task seen by then fired may have left no trace.
    _task_seen("old.task", days_ago=30)
    _task_seen("new.task", days_ago=1)
    assert store_for().pruned_before("old.task") == result.cutoff
    assert store_for().pruned_before("new.task") is None  # Nothing of it was that old.
    assert store_for().pruned_before("never.seen") is None


def _task_seen(name: str, *, days_ago: int) -> None:
    seen = timezone.now() - timedelta(days=days_ago)
    Task.objects.create(name=name, cron="0 3 * * *", tz="UTC")
    Task.objects.filter(name=name).update(first_seen_at=seen)  # Past the field's auto_now_add.


def _old_record(days_ago: float) -> None:
    when = timezone.now() - timedelta(days=days_ago)
    Occurrence.objects.create(task="t", outcome="dropped", occurrence=when, recorded_at=when)


@pytest.mark.django_db
def test_prune__the_latest_cutoff_is_the_latest_in_time_and_a_prune_of_nothing_is_not_one() -> None:
    _task_seen("t", days_ago=60)
    assert prune(older_than=timedelta(days=14)).occurrences == 0
    assert not Occurrence.objects.filter(outcome="pruned").exists()  # It deleted nothing.
    assert store_for().pruned_before("t") is None

    # A prune of one day, then the nightly one of fourteen: history before the first cutoff
    # may be gone, whatever the later one deleted.
    _old_record(2)
    shorter = prune(older_than=timedelta(days=1))
    _old_record(20)
    prune(older_than=timedelta(days=14))
    assert Occurrence.objects.filter(outcome="pruned").count() == 2
    assert store_for().pruned_before("t") == shorter.cutoff


@pytest.mark.django_db
def test_prune__one_that_fails_midway_is_on_record_from_before_its_first_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Recorded once done, a prune killed (or failing) after its first batches went left history
    # deleted with nothing to say so: a backfill then fired those occurrences again.
    _task_seen("t", days_ago=60)
    _old_record(20)
    store = store_for()

    def first_batch_then_dies(cutoff: Any, **options: Any) -> Any:
        Occurrence.objects.filter(recorded_at__lt=cutoff).exclude(outcome="pruned").delete()
        raise RuntimeError("killed midway")

    monkeypatch.setattr(store, "prune", first_batch_then_dies)
    with pytest.raises(RuntimeError):
        prune(older_than=timedelta(days=14), store=store)
    cutoff = store.pruned_before("t")
    assert cutoff is not None and timezone.now() - cutoff > timedelta(days=13)


@pytest.mark.django_db
def test_prune__a_nightly_prune_job_of_the_release_before_counts_by_its_row() -> None:
    # The release before this one recorded no prune: its job row says when and how far back.
    _task_seen("t", days_ago=60)
    finished = timezone.now() - timedelta(hours=3)
    for data in ({}, {"days": 3}):
        job = make_job("ultimat3_jobs.prune", data=data, status=JobStatus.SUCCEEDED)
        Job.objects.filter(pk=job.pk).update(finished_at=finished)
    assert store_for().pruned_before("t") == finished - timedelta(days=3)


@pytest.mark.django_db
def test_prune__tells_its_progress_after_each_batch() -> None:
    _old_and_new_rows()
    heard: list[tuple[str, int]] = []

    prune(older_than=timedelta(days=14), batch_size=2, progress=lambda *said: heard.append(said))

    assert heard == [
        ("finished jobs", 2),
        ("finished jobs", 3),
        ("occurrence records", 1),
        ("nodes", 1),
    ]


@pytest.mark.django_db
def test_prune_jobs_command__a_long_prune_prints_its_progress(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ultimat3_jobs.management.commands import prune_jobs

    _old_and_new_rows()
    monkeypatch.setattr(prune_jobs, "PROGRESS_EVERY", 0.0)  # as if every batch took that long

    call_command("prune_jobs", "--days", "14")

    err = capsys.readouterr().err
    assert "… 3 finished jobs deleted so far" in err
    assert "… 1 occurrence records deleted so far" in err


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_prune__leaves_a_failed_job_retried_while_its_batch_is_deleted() -> None:
    old = timezone.now() - timedelta(days=20)
    failed = [make_job(status=JobStatus.FAILED, finished_at=old, created_at=old) for _ in range(5)]
    retried = failed[2]
    holding, release = threading.Event(), threading.Event()

    def retry_in_the_admin() -> None:
        # "Retry failed", its transaction open while the prune reads the batch and deletes it.
        try:
            with transaction.atomic():
                assert store_for().retry_failed(Job.objects.filter(pk=retried.pk)) == 1
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    admin = threading.Thread(target=retry_in_the_admin)
    admin.start()
    assert holding.wait(30)
    pruned: list[Any] = []

    def prune_meanwhile() -> None:
        try:
            pruned.append(prune(older_than=timedelta(days=14)))
        finally:
            connection.close()

    pruning = threading.Thread(target=prune_meanwhile)
    pruning.start()
    with connection.cursor() as cursor:
        # The prune's DELETE waits on the retried row's lock.
        for _ in range(300):
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'DELETE%%'"
            )
            if cursor.fetchone()[0]:
                break
            time.sleep(0.01)
    release.set()
    admin.join(30)
    pruning.join(30)
    assert pruned[0].jobs == 4
    assert list(Job.objects.values_list("pk", "status")) == [(retried.pk, JobStatus.QUEUED)]


@pytest.mark.django_db
def test_prune__keeps_each_tasks_last_fired_record_however_old() -> None:
    # A task that fires less often than the retention period read as never fired once its
    # last fired record went (jobs_status's last fired occurrence).
    now = timezone.now()
    for name in ("monthly", "hourly", "gone"):
        Task.objects.create(name=name, cron="0 0 1 * *", tz="UTC", first_seen_at=now, synced_at=now)

    def record(task: str, days: int, outcome: str = "fired") -> Occurrence:
        when = now - timedelta(days=days)
        return Occurrence.objects.create(
            task=task, outcome=outcome, occurrence=when, recorded_at=when
        )

    record("monthly", 50)
    last_monthly = record("monthly", 20)
    record("monthly", 19, outcome="dropped")  # Not a firing: pruned.
    record("hourly", 20)
    fresh_hourly = record("hourly", 1)
    record("gone", 20)
    Task.objects.filter(name="gone").delete()  # No task row: nothing of it is kept.

    assert prune(older_than=timedelta(days=14), dry_run=True).occurrences == 4
    assert prune(older_than=timedelta(days=14), batch_size=2).occurrences == 4

    left = set(Occurrence.objects.exclude(outcome="pruned").values_list("pk", flat=True))
    assert left == {last_monthly.pk, fresh_hourly.pk}
    # Pruned again, the kept record stays: a prune never empties a task's history of firings.
    assert prune(older_than=timedelta(days=14)).occurrences == 0


@pytest.mark.django_db(transaction=True)
def test_prune__the_nightly_job_prunes_the_database_its_worker_runs_on() -> None:
    # The router sends the app to an alias "jobs" that does not exist here: the job, run by a
    # worker of "default" (its --database), pruned "jobs" and failed at each attempt.
    old = timezone.now() - timedelta(days=20)
    stale = make_job(status=JobStatus.SUCCEEDED, finished_at=old, created_at=old)
    nightly = make_job("ultimat3_jobs.prune", data={"days": 14}, max_attempts=1)

    with override_settings(DATABASE_ROUTERS=["tests.integration.test_routing.ToJobs"]):
        call_command("run_worker", "--burst", "--no-listen", "--database", "default")

    nightly.refresh_from_db()
    assert (nightly.status, nightly.last_error) == (JobStatus.SUCCEEDED, "")
    assert not Job.objects.filter(pk=stale.pk).exists()


@pytest.mark.django_db
def test_prune__dry_run_counts_and_deletes_nothing() -> None:
    _old_and_new_rows()
    result = prune(older_than=timedelta(days=14), dry_run=True)
    assert (result.jobs, result.occurrences, result.nodes) == (3, 1, 1)
    assert Job.objects.count() == 6
    assert Occurrence.objects.count() == 2


@pytest.mark.django_db
def test_prune__defaults_to_the_retention_setting(settings: Any) -> None:
    _old_and_new_rows()
    settings.ULTIMAT3_JOBS = {"RETENTION_DAYS": 30}
    assert prune().jobs == 0
    settings.ULTIMAT3_JOBS = {"RETENTION_DAYS": 7}
    assert prune().jobs == 3


@pytest.mark.django_db
def test_prune_jobs_command__reports_what_it_deleted(capsys: pytest.CaptureFixture[str]) -> None:
    _old_and_new_rows()
    call_command("prune_jobs", "--days", "14", "--dry-run")
    assert "Would delete 3 finished job(s), 1 occurrence record(s)" in capsys.readouterr().out
    call_command("prune_jobs", "--days", "14")
    assert "Deleted 3 finished job(s)" in capsys.readouterr().out
    assert Job.objects.count() == 3
    with pytest.raises(CommandError, match="must be 1 or more"):
        call_command("prune_jobs", "--days", "0")


def test_builtin_prune_task__is_declared_nightly_in_utc_and_enqueues_the_prune_job() -> None:
    nightly = registry.get_task("ultimat3_jobs.prune")
    prune_job = registry.get_job("ultimat3_jobs.prune")
    assert nightly is not None and prune_job is not None
    assert (nightly.cron, nightly.tz) == ("17 3 * * *", "UTC")
    assert nightly.entries(T0) == [(prune_job, {})]
    assert nightly.next_runs(1, after=T0) == [datetime(2026, 6, 2, 3, 17, tzinfo=UTC)]


@pytest.mark.django_db(transaction=True)
def test_builtin_prune_job__prunes_when_a_worker_runs_it() -> None:
    _old_and_new_rows()
    make_job("ultimat3_jobs.prune", data={"days": 14}, queue="maintenance")
    assert ran(burst_worker(queues=["maintenance"])) == ["succeeded"]
    assert Occurrence.objects.exclude(outcome="pruned").count() == 1
    assert not Job.objects.filter(status=JobStatus.FAILED).exists()


# -- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "must be 1 or more"),
        (["--max-jobs", "many"], "is not a whole number"),
        (["--queues", "default,"], "comma-separated list of queue names"),
        (["--poll-interval", "-1"], "must be more than 0 seconds"),
    ],
    ids=["concurrency_zero", "max_jobs_text", "queues_empty_name", "poll_negative"],
)
def test_run_worker_command__rejects_bad_flags(argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("run_worker", *argv)


@pytest.mark.django_db(transaction=True)
def test_run_worker_command__burst_runs_the_named_queues(quiet_logger: None) -> None:
    ping.enqueue({"label": "mine"}, queue="emails")
    ping.enqueue({"label": "theirs"}, queue="reports")
    call_command("run_worker", "--burst", "--queues", "emails", "--concurrency", "2")
    assert list(Ping.objects.values_list("label", flat=True)) == ["mine"]
    assert Job.objects.get(queue="reports").status == JobStatus.QUEUED


@pytest.mark.django_db(transaction=True)
def test_run__a_worker_whose_clock_runs_ahead_runs_nothing_before_its_time() -> None:
    # Its claims compared run_at with its own clock: 10 min ahead, it ran a job due in 3 min
    # (an occurrence a backfill enqueued ahead, a run_after, a retry's backoff) 3 min early.
    later = make_job(run_at=timezone.now() + timedelta(minutes=3), data={"label": "later"})
    due = make_job(data={"label": "due"})
    ahead = FrozenClock(timezone.now() + timedelta(minutes=10))
    worker = quick_worker(burst=True, clock=ahead)
    assert worker.run() == CLEAN_EXIT
    assert Job.objects.get(pk=due.pk).status == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=later.pk).status == JobStatus.QUEUED
    # Its skew is on its row, which the status warns about.
    skew = Node.objects.get(node_id=worker.node_id).clock_skew_ms
    assert skew is not None and 9 * 60_000 < skew < 11 * 60_000
