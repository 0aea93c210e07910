"""The worker's batched paths: finishes written together, jobs claimed ahead and given back."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, DataError, connection, transaction
from django.db.backends.signals import connection_created
from django.test.utils import CaptureQueriesContext

from testproject.demo.models import Ping
from ultimat3_jobs import clock
from ultimat3_jobs.db import UNPREPARED, execute_bound
from ultimat3_jobs.logs import failure_fields
from ultimat3_jobs.models import Job, JobStatus
from ultimat3_jobs.store import ClaimedJob, Finish, PortableStore, postgres, sql, store_for
from ultimat3_jobs.worker import CLEAN_EXIT, Worker

from .test_worker import QUICK, make_job, wait_until


def _claim(worker: str, limit: int = 10, queues: Iterable[str] | None = None) -> list[ClaimedJob]:
    chosen = None if queues is None else frozenset(queues)
    return store_for("default").claim(worker=worker, limit=limit, now=clock.now(), queues=chosen)


# -- finishing ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_finish__writes_each_outcome_of_a_batch_and_skips_rows_no_longer_ours() -> None:
    made = [make_job() for _ in range(4)]
    done, retried, taken, cancelled = _claim("w1")
    Job.objects.filter(pk=taken.id).update(worker="w2")  # Recovered and claimed by another.
    Job.objects.filter(pk=cancelled.id).update(status=JobStatus.CANCELLED)
    now = clock.now()
    later = now + timedelta(minutes=5)
    written = store_for("default").finish(
        worker="w1",
        finishes=[
            Finish.succeeded(done, now=now),
            Finish.retrying(retried, run_at=later, error="boom"),
            Finish.succeeded(taken, now=now),
            Finish.failed(cancelled, now=now, error="late"),
        ],
    )
    assert written == {done.id, retried.id}
    rows = {row.pk: row for row in Job.objects.filter(pk__in=[j.pk for j in made])}
    assert (rows[done.id].status, rows[done.id].finished_at, rows[done.id].worker) == (
        JobStatus.SUCCEEDED,
        now,
        "w1",
    )
    assert (rows[retried.id].status, rows[retried.id].run_at, rows[retried.id].worker) == (
        JobStatus.QUEUED,
        later,
        "",
    )
    assert rows[retried.id].last_error == "boom"
    assert (rows[taken.id].status, rows[taken.id].worker) == (JobStatus.RUNNING, "w2")
    assert rows[cancelled.id].status == JobStatus.CANCELLED


@pytest.mark.django_db
def test_finish__a_stale_attempt_never_lands_on_a_later_one() -> None:
    make_job()
    (first,) = _claim("w1")
    store_for("default").give_back(job_ids=[first.id], worker="w1", now=clock.now())
    (second,) = _claim("w1")  # The same job, claimed again by the same worker.
    assert (second.id, second.attempts) == (first.id, 2)
    stale = Finish.succeeded(first, now=clock.now())
    assert store_for("default").finish(worker="w1", finishes=[stale]) == set()
    row = Job.objects.get(pk=first.id)
    assert (row.status, row.attempts) == (JobStatus.RUNNING, 2)


@pytest.mark.postgres
@pytest.mark.django_db
def test_finish_and_claim__is_one_statement_whatever_the_batch() -> None:
    for _ in range(6):
        make_job()
    ran = _claim("w1", limit=3)
    now = clock.now()
    with CaptureQueriesContext(connection) as queries:
        written, claimed = store_for("default").finish_and_claim(
            worker="w1",
            finishes=[Finish.succeeded(job, now=now) for job in ran],
            limit=10,
            now=now,
        )
    # One statement on the job table; around it only its transaction and the planner settings.
    on_jobs = [q["sql"] for q in queries.captured_queries if "ultimat3_jobs_job" in q["sql"]]
    assert len(on_jobs) == 1
    others = [q["sql"] for q in queries.captured_queries if q["sql"] not in on_jobs]
    settings = [sql for sql in others if "set_config" in sql]  # CLAIM_PLANNER, then PLANNER_AGAIN
    assert all(sql.startswith(("SAVEPOINT", "RELEASE")) for sql in others if sql not in settings)
    assert len(settings) == 2, others
    assert written == {job.id for job in ran}
    assert len(claimed) == 3
    assert not {job.id for job in claimed} & written
    statuses = Job.objects.values_list("status", flat=True)
    assert sorted(statuses) == [JobStatus.RUNNING] * 3 + [JobStatus.SUCCEEDED] * 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_claim__plans_without_sorting_and_leaves_the_session_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Statistics taken while nothing was queued made the planner sort every due row behind a
    # burst (measured: 30,000 rows read per claim of 100). The claim plans with sorting off.
    # JIT off too: a claim of given queues sorts its few rows, which sorting off prices so
    # high that the plan would be JIT-compiled at every claim.
    for _ in range(3):
        make_job()
    settings = "SELECT current_setting('enable_sort'), current_setting('jit')"
    before = execute_bound("default", settings, ())
    seen: list[Any] = []

    def show(using: str, statement: str, params: Any) -> Any:
        if "FOR UPDATE SKIP LOCKED" in statement:
            seen.extend(execute_bound(using, settings, ()))
        return execute_bound(using, statement, params)

    with monkeypatch.context() as patched:
        patched.setattr(postgres, "execute_bound", show)
        claimed = _claim("w1")
        assert len(_claim("w1", queues=["default", "other"])) == 0
    assert len(claimed) == 3
    assert seen == [("off", "off")] * 2
    assert before[0][0] == "on"
    # Transaction-local: safe behind PgBouncer.
    assert execute_bound("default", settings, ()) == before
    # Inside a caller's transaction too: the rest of it plans as before.
    with transaction.atomic():
        assert len(_claim("w2")) == 0
        assert execute_bound("default", settings, ()) == before


@contextlib.contextmanager
def _prepared_at_first_use() -> Iterator[None]:
    """The default database's connections with Django's ``prepare_threshold`` option at 0,
    then as they were, this process preparing there again."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    connection.close()
    options["prepare_threshold"] = 0
    try:
        yield
    finally:
        connection.close()
        del options["prepare_threshold"]
        UNPREPARED.discard("default")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_claim_mark_and_finish__prepared_when_the_databases_prepare_threshold_says_so() -> None:
    """Django's ``prepare_threshold`` option (its default: never) decides for the worker's
    claim and finish too, so PostgreSQL can keep their plans (the start mark is kept whatever
    it says, by name: below); Django's own queries stay as they are (bound on the client,
    never prepared)."""
    for _ in range(3):
        make_job()
    store, now = store_for("default"), clock.now()
    with _prepared_at_first_use():
        claimed = store.claim(worker="w1", limit=3, now=now, start=0)
        assert len(claimed) == 3
        assert store.mark_started(jobs=claimed, worker="w1", now=now) == {j.id for j in claimed}
        finishes = [Finish.succeeded(job, now=now) for job in claimed]
        written, _ = store.finish_and_claim(worker="w1", finishes=finishes, limit=0)
        assert written == {job.id for job in claimed}
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row[0] for row in cursor.fetchall()]
    assert len(prepared) == 4, prepared  # The claim with its planner setting, mark, finish.
    assert any("FOR UPDATE SKIP LOCKED" in one for one in prepared)
    assert any("SET started_at" in one for one in prepared)
    assert any("SET status = f.status" in one for one in prepared)
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_finish__a_prepared_statement_the_server_lost_fails_once_then_none_is_prepared() -> None:
    """Behind a transaction-pooling PgBouncer older than 1.21, a transaction may reach a
    backend that holds none of the statements this connection prepared. The statement fails
    with a code and a fix that say so, and the process prepares nothing more there, on this
    connection or any it opens next: psycopg would otherwise name the lost statement again at
    every run, and the worker never finish a job."""
    for _ in range(3):
        make_job()
    store, now = store_for("default"), clock.now()
    with _prepared_at_first_use():
        first, second = store.claim(worker="w1", limit=2, now=now, start=0)
        store.mark_started(jobs=[first, second], worker="w1", now=now)
        store.finish_and_claim(worker="w1", finishes=[Finish.succeeded(first, now=now)], limit=0)
        with connection.cursor() as cursor:
            # What the pooler does: the next backend holds none of them. In a DO block, so
            # psycopg does not see a DEALLOCATE (it forgets its own on seeing one).
            cursor.execute("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")
        finish = [Finish.succeeded(second, now=now)]
        with pytest.raises(DatabaseError) as lost:
            store.finish_and_claim(worker="w1", finishes=finish, limit=0)
        fields = failure_fields(lost.value)
        assert fields["code"] == "jobs.prepared-statement-lost"
        assert "prepare_threshold" in fields["fix"]
        written, _ = store.finish_and_claim(worker="w1", finishes=finish, limit=0)
        connection.close()  # The next connection, as a loop that reconnects opens.
        [third] = store.claim(worker="w1", limit=1, now=clock.now())
        store.finish_and_claim(worker="w1", finishes=[Finish.succeeded(third, now=now)], limit=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            [(prepared,)] = cursor.fetchall()
    assert written == {second.id}
    assert prepared == 0
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 3


def _named_statements() -> list[tuple[str, str, int]]:
    """This session's statements prepared by name: name, text, and how often each was run."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, statement, generic_plans + custom_plans FROM pg_prepared_statements"
        )
        return cursor.fetchall()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_mark_started__prepared_by_name_once_a_session_whatever_prepare_threshold_says() -> None:
    """A thread waits on its start mark before each claimed-ahead job runs: the mark is
    planned once a session, under a name its text decides, with Django's default
    ``prepare_threshold`` (never) too; the claim and the finish stay as that option says.
    In a caller's transaction, where a missing statement would spoil it, nothing is
    prepared."""
    for _ in range(5):
        make_job()
    store, now = store_for("default"), clock.now()
    connection.close()
    claimed = store.claim(worker="w1", limit=5, now=now, start=0)
    first = store.mark_started(jobs=claimed[:2], worker="w1", now=now)
    second = store.mark_started(jobs=claimed[2:4], worker="w1", now=now)
    [(name, statement, runs)] = _named_statements()
    with transaction.atomic():
        assert store.mark_started(jobs=claimed[4:], worker="w1", now=now) == {claimed[4].id}
        assert len(_named_statements()) == 1
    assert (first, second) == ({j.id for j in claimed[:2]}, {j.id for j in claimed[2:4]})
    assert name == sql.MARK_STARTED_NAMED.name and name.startswith("ultimat3_jobs_")
    assert "SET started_at" in statement
    assert runs == 2
    assert Job.objects.filter(started_at=now).count() == 5


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_mark_started__a_session_that_lost_its_named_statement_prepares_it_again() -> None:
    """A pooler may hand the client a backend that never saw the statement (or one reset
    with ``DISCARD ALL``): the ``EXECUTE`` fails before running anything, and the mark is
    prepared there and run; no error reaches the worker."""
    for _ in range(2):
        make_job()
    store, now = store_for("default"), clock.now()
    first, second = store.claim(worker="w1", limit=2, now=now, start=0)
    assert store.mark_started(jobs=[first], worker="w1", now=now) == {first.id}
    with connection.cursor() as cursor:
        # Unseen by the client, as a pooler's switch of backend would be.
        cursor.execute("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")
    assert _named_statements() == []
    assert store.mark_started(jobs=[second], worker="w1", now=now) == {second.id}
    assert [name for name, _, _ in _named_statements()] == [sql.MARK_STARTED_NAMED.name]
    assert "default" not in UNPREPARED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_mark_started__a_value_the_database_refuses__marks_none_of_its_batch_and_stays_named() -> (
    None
):
    """A mark whose values PostgreSQL refuses (an attempt past ``integer``) fails as the
    database's error, marking none of the jobs sent with it (one statement); the session keeps
    its named statement, so the next mark runs prepared, and nothing is marked unprepared."""
    for _ in range(3):
        make_job()
    store, now = store_for("default"), clock.now()
    first, second, third = store.claim(worker="w1", limit=3, now=now, start=0)
    assert store.mark_started(jobs=[first], worker="w1", now=now) == {first.id}
    poison = dataclasses.replace(third, attempts=2**31)
    with pytest.raises(DataError):
        store.mark_started(jobs=[second, poison], worker="w1", now=now)
    assert not Job.objects.filter(pk__in=[second.id, third.id], started_at__isnull=False).exists()
    assert store.mark_started(jobs=[second, third], worker="w1", now=now) == {second.id, third.id}
    [(name, _, runs)] = _named_statements()
    assert (name, runs) == (sql.MARK_STARTED_NAMED.name, 2)
    assert "default" not in UNPREPARED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_mark_started__a_pooler_that_moves_the_client_at_each_statement__marks_unprepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pooler in statement mode (or a transaction-pooling one with several backends) may run
    the ``PREPARE`` on one backend and the ``EXECUTE`` on another, every time: after the
    second miss in a row the mark runs unprepared, and the process prepares nothing more on
    that database. Here the session forgets its statements before each ``EXECUTE``."""
    for _ in range(2):
        make_job()
    store, now = store_for("default"), clock.now()
    first, second = store.claim(worker="w1", limit=2, now=now, start=0)
    sent: list[str] = []
    execute = psycopg.ClientCursor.execute

    def moved(cursor: psycopg.ClientCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if sql.MARK_STARTED_NAMED.name in str(query):
            sent.append(str(query).split()[0])
            if sent[-1] == "EXECUTE":
                execute(cursor, "DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")
        return execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", moved)
    connection.close()
    try:
        assert store.mark_started(jobs=[first], worker="w1", now=now) == {first.id}
        assert "default" in UNPREPARED
        assert store.mark_started(jobs=[second], worker="w1", now=now) == {second.id}
    finally:
        UNPREPARED.discard("default")
    assert sent == ["DO", "EXECUTE", "DO", "EXECUTE"]  # Prepared, run, twice; then plain.
    assert Job.objects.filter(started_at=now).count() == 2


@pytest.mark.django_db
def test_claim__returns_plain_records_with_the_input_decoded() -> None:
    made = make_job(data={"label": "x", "n": [1, 2]})
    (claimed,) = _claim("w1")
    assert isinstance(claimed, ClaimedJob)
    assert (claimed.id, claimed.input, claimed.attempts, claimed.key) == (
        made.pk,
        {"label": "x", "n": [1, 2]},
        1,
        made.key,
    )


# -- releasing what never started -----------------------------------------------------------------


@pytest.mark.django_db
def test_release__puts_unstarted_jobs_back_with_the_attempt_uncounted() -> None:
    make_job(attempts=1)
    other = make_job()
    mine, theirs = _claim("w1")
    Job.objects.filter(pk=theirs.id).update(worker="w2")
    assert store_for("default").release(jobs=[mine, theirs], worker="w1") == 1
    row = Job.objects.get(pk=mine.id)
    assert (row.status, row.attempts, row.worker, row.started_at) == (JobStatus.QUEUED, 1, "", None)
    assert Job.objects.get(pk=other.pk).worker == "w2"


def _slow_then_quick(quick: int, started: Path | None = None) -> tuple[Job, list[Job]]:
    """A slow job (``started``: the file it makes once it runs), then ``quick`` due after it."""
    now = clock.now()
    slow = make_job(
        "demo.slow_ping",
        data={"label": "slow", "seconds": 0.6, "started": str(started or "")},
        run_at=now - timedelta(seconds=10),
    )
    waiting = [
        make_job(data={"label": f"quick-{n}"}, run_at=now - timedelta(seconds=5))
        for n in range(quick)
    ]
    return slow, waiting


def _worker(**options: Any) -> Worker:
    return Worker(**{**QUICK, "listen": False, "concurrency": 1, "prefetch": 5, **options})


@pytest.mark.django_db(transaction=True)
def test_stop__jobs_claimed_ahead_go_back_unrun_when_the_drain_begins(tmp_path: Path) -> None:
    started = tmp_path / "started"
    slow, waiting = _slow_then_quick(3, started)
    # A poll interval longer than the test: only the drain can give the waiting jobs back.
    worker = _worker(poll_interval=timedelta(seconds=30), drain_grace=timedelta(seconds=10))
    worker.start()
    wait_until(lambda: len(worker.in_flight()) == 4, what="the slow job and three claimed ahead")
    # Its thread took it: a drain that began sooner would give it back unrun as well.
    wait_until(started.exists, what="the slow job to run")
    worker.stop("test")
    assert worker.exit_code == CLEAN_EXIT
    assert Job.objects.get(pk=slow.pk).status == JobStatus.SUCCEEDED
    rows = Job.objects.filter(pk__in=[job.pk for job in waiting])
    assert set(rows.values_list("status", "attempts", "worker")) == {(JobStatus.QUEUED, 0, "")}
    assert list(Ping.objects.values_list("label", flat=True)) == ["slow"]
    assert worker.outcomes["succeeded"] == 1


@pytest.mark.django_db(transaction=True)
def test_run__jobs_waiting_behind_a_long_job_go_back_then_run_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, waiting = _slow_then_quick(3)
    worker = _worker()  # Polls every 0.05 s: the waiting jobs go back long before 0.6 s.
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs.worker"):
        worker.start()
        try:
            wait_until(
                lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4,
                what="every job to run",
            )
        finally:
            worker.stop()
    released = [r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.released"]
    assert [sorted(getattr(r, "fields", {})["jobs"]) for r in released][:1] == [
        [job.pk for job in waiting]
    ]
    labels = sorted(Ping.objects.values_list("label", flat=True))
    assert labels == ["quick-0", "quick-1", "quick-2", "slow"]
    # Given back unrun, their attempt was uncounted: one attempt each, the one that ran.
    rows = Job.objects.filter(pk__in=[job.pk for job in waiting])
    assert set(rows.values_list("attempts", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_run__a_burst_returns_with_every_outcome_written() -> None:
    made = [make_job(data={"label": f"b-{n}"}) for n in range(40)]
    failing = make_job("demo.always_fail", data={"label": "f"}, max_attempts=1)
    worker = _worker(burst=True, concurrency=3, prefetch=10)
    assert worker.run() == CLEAN_EXIT
    rows = Job.objects.filter(pk__in=[job.pk for job in made])
    assert set(rows.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}
    assert Job.objects.get(pk=failing.pk).status == JobStatus.FAILED
    assert (worker.outcomes["succeeded"], worker.outcomes["failed"]) == (40, 1)
    assert Ping.objects.count() == 40


@pytest.mark.django_db(transaction=True)
def test_worker__claims_and_records_through_the_store_it_is_given() -> None:
    # The ORM's store, on whichever database the suite runs: a test can hand the worker one.
    calls: list[str] = []

    class Recording(PortableStore):
        def finish_and_claim(self, **kwargs: Any) -> tuple[set[int], list[ClaimedJob]]:
            calls.append("finish_and_claim")
            return super().finish_and_claim(**kwargs)

    made = make_job()
    worker = _worker(burst=True, listen=False, store=Recording("default"))
    assert worker.run() == CLEAN_EXIT
    assert Job.objects.get(pk=made.pk).status == JobStatus.SUCCEEDED
    assert calls and set(calls) == {"finish_and_claim"}


def test_worker__refuses_a_negative_prefetch() -> None:
    with pytest.raises(ValueError, match="prefetch must be at least 0"):
        Worker(prefetch=-1, drain_on_shutdown=False)


@pytest.mark.django_db
def test_release_unheld__frees_jobs_a_lost_claim_answer_left_with_the_worker() -> None:
    for _ in range(3):
        make_job()
    held, lost_one, lost_two = _claim("w1")  # As if the answer for the last two never came.
    theirs = make_job(status=JobStatus.RUNNING, worker="w2", attempts=1)
    released = store_for("default").release_unheld(worker="w1", held=[held.id])
    assert released == 2
    rows = Job.objects.filter(pk__in=[lost_one.id, lost_two.id])
    assert set(rows.values_list("status", "attempts", "worker")) == {(JobStatus.QUEUED, 0, "")}
    assert Job.objects.get(pk=held.id).status == JobStatus.RUNNING
    assert Job.objects.get(pk=theirs.pk).worker == "w2"


@pytest.mark.django_db(transaction=True)
def test_run__the_dispatcher_keeps_its_connection_while_jobs_are_in_flight(
    settings: Any,
) -> None:
    # Django's default CONN_MAX_AGE=0: a rest between two loop turns of a busy worker is no
    # quiet spell, so the connection must outlive it (reconnecting costs more than a claim).
    assert settings.DATABASES["default"].get("CONN_MAX_AGE", 0) == 0
    for n in range(300):
        make_job(data={"label": f"c-{n}"})
    dispatcher = threading.get_ident()
    opened: list[int] = []

    def count(sender: object, **kwargs: object) -> None:
        if threading.get_ident() == dispatcher:
            opened.append(1)

    connection_created.connect(count)
    try:
        worker = _worker(burst=True, concurrency=2, prefetch=20)
        assert worker.run() == CLEAN_EXIT
    finally:
        connection_created.disconnect(count)
    assert worker.outcomes["succeeded"] == 300
    assert len(opened) <= 2  # A quiet spell may come where the threads ran dry.
