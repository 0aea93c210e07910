"""The job store against a real database: every transition is conditional on the row's owner."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction
from django.utils import timezone

from tests.integration.factories import demo_ping
from ultimat3_jobs import backends
from ultimat3_jobs.db import execute_bound
from ultimat3_jobs.errors import WorkerLostError
from ultimat3_jobs.models import Job, JobStatus, Node
from ultimat3_jobs.store import (
    ClaimedJob,
    Finish,
    PortableStore,
    PostgresStore,
    sql,
    started_task,
    store_for,
)
from ultimat3_jobs.store.columns import (
    CARRIED,
    NEW_JOB_NAMES,
    copy_row,
    job_fields,
    scheduled_row,
)

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def running(
    worker: str = "w1", *, attempts: int = 1, max_attempts: int = 3, started: bool = True
) -> Job:
    """A running row: started (its function ran), or claimed ahead (``started=False``)."""
    return Job.objects.create(
        name="demo.ping",
        key=f"demo.ping:{uuid.uuid4().hex}",
        input={"label": "x"},
        status=JobStatus.RUNNING,
        attempts=attempts,
        max_attempts=max_attempts,
        run_at=T0,
        created_at=T0,
        started_at=T0 if started else None,
        worker=worker,
    )


def claimed(job: Job) -> ClaimedJob:
    return ClaimedJob(
        job.pk, job.name, job.key, job.input, job.queue, job.attempts, job.max_attempts, job.run_at
    )


def written(worker: str, *finishes: Finish) -> set[int]:
    return store_for("default").finish(worker=worker, finishes=finishes)


def status_of(job: Job) -> tuple[str, str, str]:
    row = Job.objects.get(pk=job.pk)
    return row.status, row.worker, row.last_error


@pytest.mark.django_db
def test_succeed__writes_only_a_job_the_worker_still_holds() -> None:
    mine, theirs = running("w1"), running("w2")
    done = [Finish.succeeded(claimed(job), now=T0) for job in (mine, theirs)]
    assert written("w1", *done) == {mine.pk}
    assert status_of(mine) == (JobStatus.SUCCEEDED, "w1", "")
    assert status_of(theirs) == (JobStatus.RUNNING, "w2", "")


@pytest.mark.django_db
def test_retry__queues_the_job_again_with_its_error_and_no_owner() -> None:
    job = running("w1")
    later = T0 + timedelta(seconds=4)
    assert written("w1", Finish.retrying(claimed(job), run_at=later, error="boom")) == {job.pk}
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.worker, row.last_error, row.run_at) == (
        JobStatus.QUEUED,
        "",
        "boom",
        later,
    )
    # Queued now, so a second outcome for the same attempt is refused.
    assert written("w1", Finish.failed(claimed(job), now=T0, error="x")) == set()


@pytest.mark.django_db
def test_give_back__requeues_or_fails_by_attempts_left() -> None:
    spare, spent, other = running("w1"), running("w1", attempts=3), running("w2")
    store_for("default").give_back(job_ids=[spare.pk, spent.pk, other.pk], worker="w1", now=T0)
    assert status_of(spare)[0] == JobStatus.QUEUED
    assert status_of(spent)[0] == JobStatus.FAILED
    assert status_of(spent)[2] == (
        "worker w1 stopped before this attempt finished; no attempts left [jobs.job.worker-lost]"
        f"\nfix: {WorkerLostError.FIX}"
    )
    assert status_of(other) == (JobStatus.RUNNING, "w2", "")


@pytest.mark.django_db
def test_retry_failed_and_cancel_queued__move_only_rows_in_the_right_status() -> None:
    failed = running("w1")
    written("w1", Finish.failed(claimed(failed), now=T0, error="boom"))
    queued = Job.objects.create(
        name="demo.ping", key="q:1", input={}, run_at=T0, created_at=T0, status=JobStatus.QUEUED
    )
    busy = running("w3")
    every = Job.objects.filter(pk__in=[failed.pk, queued.pk, busy.pk])
    assert store_for("default").retry_failed(every, now=T0) == 1
    row = Job.objects.get(pk=failed.pk)
    assert (row.status, row.attempts, row.last_error) == (JobStatus.QUEUED, 0, "boom")
    # The retried one and the queued one.
    assert store_for("default").cancel_queued(every, now=T0) == 2
    assert status_of(busy)[0] == JobStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_insert_round__reports_created_and_existing_keys() -> None:
    ping = demo_ping()

    def row(key: str) -> dict[str, Any]:
        return job_fields(
            ping, {"label": key}, key=key, run_at=None, queue=None, enqueued_by="scheduler", now=T0
        )

    first = store_for().insert_round([row("a"), row("b")])
    again = store_for().insert_round([row("b"), row("c")])
    assert {key: created for key, (_, created) in first.items()} == {"a": True, "b": True}
    assert {key: created for key, (_, created) in again.items()} == {"b": False, "c": True}
    assert again["b"][0] == first["b"][0]
    assert Job.objects.filter(key__in=["a", "b", "c"]).count() == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_insert_round__copy_and_insert_write_the_same_columns_and_wake_the_relays() -> None:
    from ultimat3_jobs.db import dedicated_connection
    from ultimat3_jobs.listener import NOTIFY_CHANNEL, RELAY_PAYLOAD

    ping = demo_ping()
    extra = {"status": JobStatus.OUTBOX, "relay": "celery", "priority": 7, "backend": "other"}

    def row(key: str) -> dict[str, Any]:
        fields = job_fields(
            ping, {"label": key}, key=key, run_at=None, queue=None, enqueued_by="scheduler", now=T0
        )
        return {**fields, **extra}

    listener = dedicated_connection("default", "test-insert-round")
    try:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        store_for().insert_round([row("copied")])  # No key taken yet: one COPY.
        store_for().insert_round([row("copied"), row("inserted")])  # A taken key: INSERT.
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    finally:
        listener.close()
    assert payloads == [RELAY_PAYLOAD, RELAY_PAYLOAD]
    columns = ("status", "relay", "priority", "backend", "error_class", "traceback", "engine_id")
    stored = {
        key: values
        for key, *values in Job.objects.filter(key__in=["copied", "inserted"]).values_list(
            "key", *columns
        )
    }
    expected = ["outbox", "celery", 7, "other", "", "", ""]
    assert stored == {"copied": expected, "inserted": expected}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_insert_round__wakes_each_queue_and_the_relays_once_in_one_statement() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ultimat3_jobs.db import dedicated_connection
    from ultimat3_jobs.listener import NOTIFY_CHANNEL, RELAY_PAYLOAD

    ping = demo_ping()

    def row(key: str, queue: str, relay: str = "") -> dict[str, Any]:
        fields = job_fields(
            ping, {"label": key}, key=key, run_at=None, queue=queue, enqueued_by="scheduler", now=T0
        )
        return {**fields, "relay": relay}

    rows = [
        row("w:1", "reports"),
        row("w:2", "mail"),
        row("w:3", "mail"),
        row("w:4", "x", "celery"),
    ]
    listener = dedicated_connection("default", "test-insert-round-wakes")
    try:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        with CaptureQueriesContext(connection) as queries:
            store_for().insert_round(rows)
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=3)]
    finally:
        listener.close()
    assert payloads == sorted(["mail", "reports", RELAY_PAYLOAD])
    assert sum("pg_notify" in q["sql"] for q in queries) == 1


@pytest.mark.parametrize("kind", ["job", "job with its own queue and attempts", "outbox"])
def test_scheduled_row__is_the_copy_row_of_the_job_fields_of_the_same_entry(
    kind: str, settings: Any
) -> None:
    from ultimat3_jobs.conf import get_settings
    from ultimat3_jobs.handles import JobHandle

    def noop(label: str) -> None:
        return None

    handle = demo_ping()
    if kind != "job":
        handle = JobHandle(noop, name="t.own", key=None, max_attempts=7, queue="reports")
    if kind == "outbox":
        handle.relay, handle.priority, handle.backend = "celery", 3, "other"
    fields: dict[str, Any] = {
        "key": "t:1:k", "task": "t", "occurrence": T0, "catch_up": True, "now": T0,
        "config": get_settings(), "trace_context": TRACEPARENT,
    }  # fmt: skip
    data = {"label": "x", "n": 1}
    made = scheduled_row(handle, data, **fields)
    row = job_fields(handle, data, run_at=None, queue=None, enqueued_by="scheduler", **fields)
    expected = copy_row(row)
    assert made == expected
    assert made[3] == ("outbox" if kind == "outbox" else "queued")


# -- one store per database -----------------------------------------------------------------------


@pytest.mark.django_db
def test_store_for__one_store_per_alias_chosen_by_its_engine() -> None:
    from django.db import connection

    store = store_for("default")
    assert store is store_for("default") is store_for()
    assert store.using == "default"
    expected = PostgresStore if connection.vendor == "postgresql" else PortableStore
    assert type(store) is expected
    assert store.notifies == (connection.vendor == "postgresql")


# -- the new job row's columns --------------------------------------------------------------------


def test_new_job_columns__are_every_column_of_the_table_but_those_left_to_their_defaults() -> None:
    left_out = {"args", "return_value", "error_class", "traceback", "relayed_at", "engine_id"}
    left_out |= {"done_at", "started_at", "finished_at", "target_unknown_since"}
    columns = {field.column for field in Job._meta.concrete_fields} - {"id"}
    assert set(NEW_JOB_NAMES) == columns - left_out
    assert len(NEW_JOB_NAMES) == len(set(NEW_JOB_NAMES))


def test_copy_row__puts_each_column_where_new_job_columns_says() -> None:
    instant = {name: T0 + timedelta(minutes=n) for n, name in enumerate(("run", "created", "occ"))}
    row = {
        "name": "t.name", "key": "t:key", "input": {"label": "x"}, "status": "outbox",
        "queue": "q", "max_attempts": 7, "run_at": instant["run"],
        "created_at": instant["created"], "task": "t", "occurrence": instant["occ"],
        "catch_up": True, "enqueued_by": "by", "priority": 5, "backend": "b", "relay": "celery",
        "trace_context": TRACEPARENT,
    }  # fmt: skip
    assert set(row) == {column.name for column in CARRIED}

    made = dict(zip(NEW_JOB_NAMES, copy_row(row), strict=True))
    assert made == {
        **row,
        "input": b'\x01{"label":"x"}',  # jsonb's binary form: its version, then the text
        "attempts": 0,
        "last_error": "",
        "worker": "",
    }


#: Values a binary COPY must carry as the text forms do: every character JSON and the COPY's
#: text format escape, an integer past 64 bits (``json``'s, not orjson's), an instant in a
#: zone other than UTC, with microseconds.
AWKWARD_INPUT = {"text": 'tab\tline\nback\\slash "quoted" é ✓', "big": 2**70, "nested": [None]}
AWKWARD_AT = datetime(2026, 3, 29, 1, 59, 59, 999_999, tzinfo=ZoneInfo("Europe/Paris"))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_insert_round__the_copy_writes_what_the_insert_writes_whatever_the_values() -> None:
    ping = demo_ping()

    def row(key: str) -> dict[str, Any]:
        return job_fields(
            ping, AWKWARD_INPUT, key=key, run_at=AWKWARD_AT, queue=None, enqueued_by="by\tme",
            now=AWKWARD_AT, task="tâche\n1", occurrence=AWKWARD_AT, catch_up=True,
        )  # fmt: skip

    store_for().insert_round([row("copied")])  # No key taken yet: one COPY.
    store_for().insert_round([row("copied"), row("inserted")])  # A taken key: INSERT.
    columns = [name for name in NEW_JOB_NAMES if name != "key"]
    rows = Job.objects.filter(key__in=["copied", "inserted"]).values_list("key", *columns)
    stored = {key: values for key, *values in rows}
    assert stored["copied"] == stored["inserted"]
    written = dict(zip(columns, stored["copied"], strict=True))
    assert written["input"] == AWKWARD_INPUT
    assert written["run_at"] == written["created_at"] == written["occurrence"] == AWKWARD_AT
    assert (written["task"], written["enqueued_by"]) == ("tâche\n1", "by\tme")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_write_records__the_copy_writes_what_the_orm_writes_whatever_the_values() -> None:
    from ultimat3_jobs.catchup import Span
    from ultimat3_jobs.models import Occurrence
    from ultimat3_jobs.planner import PlannedJob, PlannedOccurrence
    from ultimat3_jobs.store.values import Copied

    @dataclasses.dataclass
    class Decided:
        task: str
        outcome: str
        span: Span
        detail: str

    fired = [
        PlannedOccurrence("t\tfired", AWKWARD_AT, True, (PlannedJob(demo_ping(), "{}", 'k\\"1'),))
    ]
    decided = [Decided("t.dropped", "dropped", Span(T0, AWKWARD_AT, 2**31 - 1), "é\nwhy")]
    enqueued = Copied()
    enqueued.ids['k\\"1'] = 1
    fields = [field.name for field in Occurrence._meta.concrete_fields if field.name != "id"]
    written = []
    for store in (store_for(), PortableStore("default")):
        store.write_records(fired, decided, enqueued, at=AWKWARD_AT, node="n\\1")
        written.append(sorted(Occurrence.objects.values_list(*fields), key=str))
        Occurrence.objects.all().delete()
    assert isinstance(store_for(), PostgresStore)
    assert written[0] == written[1]
    by_task = {row[0]: dict(zip(fields, row, strict=True)) for row in written[0]}
    assert by_task["t\tfired"]["jobs"] == [{"job": "demo.ping", "key": 'k\\"1', "created": True}]
    assert by_task["t\tfired"]["recorded_at"] == AWKWARD_AT
    assert by_task["t.dropped"]["last_occurrence"] == AWKWARD_AT


def _planned(keys: list[str]) -> list[Any]:
    from ultimat3_jobs.planner import PlannedJob, PlannedOccurrence

    ping = demo_ping()
    return [
        PlannedOccurrence(
            "t.streamed",
            T0 + timedelta(minutes=n),
            n == 0,
            (PlannedJob(ping, json.dumps({"label": key}), key),),
            trace_context=f"{TRACEPARENT[:-2]}{n:02d}",
        )
        for n, key in enumerate(keys)
    ]


@pytest.mark.django_db(transaction=True)
def test_insert_streamed__writes_the_rows_insert_round_writes() -> None:
    from django.db import transaction

    store = store_for()
    with transaction.atomic():
        enqueued = store.insert_streamed(iter(_planned(["s:1", "s:2"])), 2, now=T0)
    assert enqueued is not None
    assert {key: created for key, (_, created) in enqueued.items()} == {"s:1": True, "s:2": True}
    columns = [name for name in NEW_JOB_NAMES if name != "key"]
    streamed = {
        key: values
        for key, *values in Job.objects.filter(key__in=["s:1", "s:2"]).values_list("key", *columns)
    }
    kept = sorted(Job.objects.values_list("trace_context", flat=True))
    assert kept == [f"{TRACEPARENT[:-2]}00", f"{TRACEPARENT[:-2]}01"]
    Job.objects.all().delete()
    rows = [
        job_fields(
            p.job, json.loads(p.data), key=p.key, run_at=None, queue=None,
            enqueued_by="scheduler", now=T0, task=f.task, occurrence=f.occurrence,
            catch_up=f.catch_up, trace_context=f.trace_context,
        )
        for f in _planned(["s:1", "s:2"])
        for p in f.jobs
    ]  # fmt: skip
    store.insert_round(rows)
    inserted = {
        key: values
        for key, *values in Job.objects.filter(key__in=["s:1", "s:2"]).values_list("key", *columns)
    }
    assert streamed == inserted


@pytest.mark.django_db
def test_delete_finished__leaves_queued_running_and_outbox_jobs() -> None:
    done = running("w1")
    written("w1", Finish.succeeded(claimed(done), now=T0))
    busy = running("w2")
    waiting = Job.objects.create(
        name="demo.ping", key="o:1", input={}, run_at=T0, created_at=T0, status=JobStatus.OUTBOX
    )
    every = Job.objects.filter(pk__in=[done.pk, busy.pk, waiting.pk])
    assert store_for().delete_finished(every) == 1
    assert set(Job.objects.values_list("pk", flat=True)) == {busy.pk, waiting.pk}


# -- what a backfill reads and locks, and what a round reads of it ---------------------------


def _stores() -> list[Any]:
    """The portable store, and this database's own (the same one on SQLite)."""
    return [PortableStore("default"), store_for("default")]


@pytest.mark.django_db
@pytest.mark.parametrize("which", [0, 1], ids=["portable", "native"])
def test_fired_occurrences__a_job_a_fired_or_manual_record_or_a_backfill_key_names_it(
    which: int,
) -> None:
    from ultimat3_jobs.inputs import occurrence_prefix
    from ultimat3_jobs.models import Occurrence

    store = _stores()[which]
    hours = [T0 + timedelta(hours=n) for n in range(6)]
    Job.objects.create(
        name="demo.ping", key="k0", run_at=T0, created_at=T0, task="t", occurrence=hours[0]
    )
    for outcome, hour in (("fired", hours[1]), ("manual", hours[2]), ("dropped", hours[3])):
        Occurrence.objects.create(
            task="t", outcome=outcome, occurrence=hour, last_occurrence=hour, recorded_at=T0
        )
    # A backfill's record spans 3..5 and names 4 by its key: 3 and 5 did not fire by it.
    Occurrence.objects.create(
        task="t",
        outcome="backfill",
        occurrence=hours[3],
        last_occurrence=hours[5],
        count=3,
        jobs=[{"job": "demo.ping", "key": occurrence_prefix("t", hours[4]) + "p", "created": True}],
        recorded_at=T0,
    )
    # Another task's of the same instants count for it alone.
    Job.objects.create(
        name="demo.ping", key="k5", run_at=T0, created_at=T0, task="u", occurrence=hours[5]
    )

    found = store.fired_occurrences({"t": hours, "u": hours[4:]})

    assert found == {"t": {hours[0], hours[1], hours[2], hours[4]}, "u": {hours[5]}}
    assert store.fired_occurrences({"t": []}) == {}


@pytest.mark.django_db
@pytest.mark.parametrize("which", [0, 1], ids=["portable", "native"])
def test_swap_watermarks__names_the_tasks_backfilled_past_the_watermark_expected(
    which: int,
) -> None:
    from ultimat3_jobs.models import Task

    store = _stores()[which]
    ahead = T0 + timedelta(hours=3)
    for name, backfilled_to in (("a", ahead), ("b", T0 - timedelta(hours=1)), ("c", None)):
        Task.objects.create(
            name=name, cron="0 * * * *", tz="UTC", last_fired_at=T0, backfilled_to=backfilled_to
        )
    Task.objects.create(name="d", cron="0 * * * *", tz="UTC", backfilled_to=ahead)  # arming
    later = T0 + timedelta(hours=1)

    swapped = store.swap_watermarks(
        {"a": (T0, later), "b": (T0, later), "c": (T0, later), "d": (None, later)}
    )

    assert (swapped.moved, dict(swapped.backfilled)) == (None, {"a": ahead})
    assert store.swap_watermarks({"a": (T0, later)}).moved == "a"


@pytest.mark.django_db
@pytest.mark.parametrize("which", [0, 1], ids=["portable", "native"])
def test_lock_task__writes_the_row_of_a_task_not_mirrored_yet_and_marks_only_forward(
    which: int, fresh_registry: Any
) -> None:
    from django.db import transaction

    from ultimat3_jobs import task
    from ultimat3_jobs.models import Task

    store = _stores()[which]
    handle = task(cron="0 * * * *", tz="UTC", name="store.unmirrored")(lambda occurrence: [])
    with transaction.atomic():
        locked = store.lock_task(handle)
        store.mark_backfilled(handle.name, T0)
        store.mark_backfilled(handle.name, T0 - timedelta(hours=1))
    assert (locked.watermark, locked.paused, locked.backfilled_to) == (None, False, None)
    row = Task.objects.get(name="store.unmirrored")
    assert (row.cron, row.tz, row.declared, row.backfilled_to) == ("0 * * * *", "UTC", True, T0)
    with transaction.atomic():
        assert store.lock_task(handle).backfilled_to == T0
    assert Task.objects.count() == 1


# -- claimed is not started -------------------------------------------------------------------


def _queued(n: int) -> list[Job]:
    return [
        Job.objects.create(
            name="demo.ping",
            key=f"demo.ping:{uuid.uuid4().hex}",
            input={"label": str(i)},
            run_at=T0 - timedelta(seconds=n - i),
            created_at=T0,
        )
        for i in range(n)
    ]


def _started_at(job_id: int) -> datetime | None:
    return Job.objects.get(pk=job_id).started_at


@pytest.mark.django_db
def test_claim__marks_started_only_the_first_rows_it_hands_to_idle_threads() -> None:
    _queued(3)
    first, second, third = store_for("default").claim(worker="w1", limit=3, now=T0, start=1)
    assert [job.started_at is not None for job in (first, second, third)] == [True, False, False]
    assert [_started_at(job.id) for job in (first, second, third)] == [T0, None, None]
    # The attempt is counted at claim time all the same; the start is what keeps it.
    assert {job.attempts for job in (first, second, third)} == {1}


@pytest.mark.django_db
def test_claim__without_start_marks_every_row_started() -> None:
    _queued(2)
    claimed_jobs = store_for("default").claim(worker="w1", limit=2, now=T0)
    assert [job.started_at is not None for job in claimed_jobs] == [True, True]


def _in_caller(in_caller: bool) -> contextlib.AbstractContextManager[Any]:
    """A caller's transaction around a start mark, or none (on PostgreSQL: the statement
    prepared by name, ``db.execute_named``)."""
    return transaction.atomic() if in_caller else contextlib.nullcontext()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_caller", [False, True], ids=["own", "in-caller"])
def test_mark_started__marks_only_the_workers_same_attempt(in_caller: bool) -> None:
    _queued(2)
    store = store_for("default")
    mine, taken = store.claim(worker="w1", limit=2, now=T0, start=0)
    Job.objects.filter(pk=taken.id).update(worker="w2")  # Recovered and claimed by another.
    later = T0 + timedelta(seconds=3)
    with _in_caller(in_caller):
        assert store.mark_started(jobs=[mine, taken], worker="w1", now=later) == {mine.id}
    assert (_started_at(mine.id), _started_at(taken.id)) == (later, None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_caller", [False, True], ids=["own", "in-caller"])
def test_mark_started__matches_each_job_to_its_own_attempt(in_caller: bool) -> None:
    _queued(3)
    store = store_for("default")
    first, second, third = store.claim(worker="w1", limit=3, now=T0, start=0)
    # Recovered and claimed again by this same worker: a later attempt, not the one we hold.
    Job.objects.filter(pk=second.id).update(attempts=2)
    Job.objects.filter(pk=third.id).update(attempts=4)
    third = dataclasses.replace(third, attempts=4)
    later = T0 + timedelta(seconds=3)
    # Any order: each id meets the attempt given beside it.
    with _in_caller(in_caller):
        marked = store.mark_started(jobs=[third, second, first], worker="w1", now=later)
    assert marked == {first.id, third.id}
    started = [_started_at(job.id) for job in (first, second, third)]
    assert started == [later, None, later]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("statement", "lazy"), [("MARK_STARTED", "off"), ("MARK_STARTED_IN_CALLER", "on")]
)
def test_mark_started__commits_lazily_only_its_own_transaction(statement: str, lazy: str) -> None:
    """Its own transaction commits without waiting for the disk; a caller's keeps its setting."""
    _queued(1)
    [job] = store_for("default").claim(worker="w1", limit=1, now=T0, start=0)
    params = {"now": T0, "ids": [job.id], "attempts": [job.attempts], "worker": "w1"}
    with transaction.atomic():
        assert execute_bound("default", getattr(sql, statement), params) == [(job.id,)]
        assert execute_bound("default", "SHOW synchronous_commit", ()) == [(lazy,)]
    assert execute_bound("default", "SHOW synchronous_commit", ()) == [("on",)]


@pytest.mark.django_db
def test_claim__a_django_tasks_row_made_from_its_claim_is_the_row_its_run_would_read() -> None:
    made = Job.objects.create(
        name="testproject.demo.background.add",
        key=f"task:{uuid.uuid4().hex}",
        input={"b": 2},
        args=[1, [3, "x"]],
        backend="default",
        priority=7,
        run_at=T0 - timedelta(seconds=1),
        created_at=T0 - timedelta(minutes=5, microseconds=123),
    )
    [job] = store_for("default").claim(worker="w1", limit=1, now=T0, start=0)
    assert (job.args, job.created_at) == (made.args, made.created_at)
    assert store_for("default").mark_started(jobs=[job], worker="w1", now=T0) == {job.id}
    row, read = started_task(job, worker="w1", started_at=T0), Job.objects.get(pk=made.pk)
    columns = [field.name for field in dataclasses.fields(row)]
    assert {c: getattr(row, c) for c in columns} == {c: getattr(read, c) for c in columns}
    # And the result its run starts with is the one the backend reads for it.
    task = backends.load_task(made.name)
    made_from_claim, read_back = (backends.result_of(r, task, "default") for r in (row, read))
    assert dataclasses.asdict(made_from_claim) == dataclasses.asdict(read_back)


@pytest.mark.django_db
def test_claim__a_jobs_claim_carries_no_task_columns() -> None:
    _queued(1)
    [job] = store_for("default").claim(worker="w1", limit=1, now=T0)
    assert (job.args, job.created_at) == (None, None)


def _node(node_id: str, *, stale: bool) -> None:
    seen = timezone.now() - timedelta(minutes=5 if stale else 0)
    Node.objects.create(
        node_id=node_id, role="worker", host="h", pid=1, started_at=seen, last_seen_at=seen
    )


@pytest.mark.django_db
def test_recover__claimed_ahead_rows_go_back_uncounted_started_ones_keep_their_attempt() -> None:
    _node("dead", stale=True)
    started = running("dead", attempts=1)
    ahead = running("dead", attempts=1, max_attempts=1, started=False)
    killer = running("dead", attempts=2, max_attempts=2)
    found = store_for("default").recover(stale_after=timedelta(seconds=60), now=T0)
    assert (found.requeued, found.failed, found.released) == (1, 1, 1)
    assert sorted(found.jobs) == sorted([started.pk, ahead.pk, killer.pk])
    rows = {row.pk: row for row in Job.objects.all()}
    assert (rows[started.pk].status, rows[started.pk].attempts) == (JobStatus.QUEUED, 1)
    assert (rows[ahead.pk].status, rows[ahead.pk].attempts) == (JobStatus.QUEUED, 0)
    assert (rows[ahead.pk].worker, rows[ahead.pk].started_at) == ("", None)
    assert rows[ahead.pk].last_error == ""  # It never ran: nothing to say about its attempt.
    assert rows[killer.pk].status == JobStatus.FAILED
    assert rows[started.pk].last_error == (
        "worker dead stopped heartbeating during this attempt [jobs.job.worker-lost]\n"
        f"fix: {WorkerLostError.FIX}"
    )
    assert rows[killer.pk].last_error == (
        "worker dead stopped heartbeating during this attempt; no attempts left: its worker "
        "died during each of them (this job killed it, or in the thread pool a job running "
        f"beside it) [jobs.job.worker-lost]\nfix: {WorkerLostError.FIX}"
    )


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["recovered", "given_back"])
def test_a_django_task_its_worker_never_finished_fails_with_a_task_error_saying_why(
    how: str,
) -> None:
    from django_tasks import TaskResultStatus

    from testproject.demo import background

    _node("dead", stale=True)
    result = background.add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(
        status=JobStatus.RUNNING, attempts=1, started_at=T0, worker="dead"
    )
    if how == "recovered":
        store_for("default").recover(stale_after=timedelta(seconds=60), now=T0)
    else:
        store_for("default").give_back(job_ids=[int(result.id)], worker="dead", now=T0)

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "ultimat3_jobs.errors.WorkerLostError"
    assert error.exception_class.__name__ == "WorkerLostError"  # importable
    assert "worker dead" in error.traceback
    # One attempt: it "kept" nothing up.
    assert f"; no attempts left [jobs.job.worker-lost]\nfix: {WorkerLostError.FIX}" in (
        error.traceback
    )


@pytest.mark.django_db
def test_recover__a_hand_made_running_row_without_attempts_goes_back_at_zero() -> None:
    row = running("gone", attempts=0, started=False)
    found = store_for("default").recover(stale_after=timedelta(seconds=60), now=T0)
    assert found.released == 1
    assert Job.objects.get(pk=row.pk).attempts == 0


@pytest.mark.django_db
def test_give_back__a_row_no_thread_started_goes_back_uncounted() -> None:
    ahead = running("w1", attempts=1, max_attempts=1, started=False)
    store_for("default").give_back(job_ids=[ahead.pk], worker="w1", now=T0)
    row = Job.objects.get(pk=ahead.pk)
    assert (row.status, row.attempts, row.started_at) == (JobStatus.QUEUED, 0, None)


@pytest.mark.django_db
def test_release_unheld__rows_that_ran_keep_their_attempt_the_others_do_not() -> None:
    held = running("w1")
    ran_spare = running("w1", attempts=1, max_attempts=3)
    ran_spent = running("w1", attempts=1, max_attempts=1)
    unrun = running("w1", attempts=1, max_attempts=1)
    theirs = running("w2")
    released = store_for("default").release_unheld(
        worker="w1", held=[held.pk], ran=[ran_spare.pk, ran_spent.pk]
    )
    assert released == 3
    rows = {row.pk: row for row in Job.objects.all()}
    assert (rows[ran_spare.pk].status, rows[ran_spare.pk].attempts) == (JobStatus.QUEUED, 1)
    assert "could not record how this attempt ended" in rows[ran_spare.pk].last_error
    assert (rows[ran_spent.pk].status, rows[ran_spent.pk].attempts) == (JobStatus.FAILED, 1)
    assert rows[ran_spent.pk].last_error == (
        "worker w1 could not record how this attempt ended; no attempts left "
        "[jobs.job.worker-lost]\nfix: the database refused or lost the worker's writes: its log "
        "names the error (its code and fix)"
    )
    assert (rows[unrun.pk].status, rows[unrun.pk].attempts) == (JobStatus.QUEUED, 0)
    assert rows[held.pk].status == rows[theirs.pk].status == JobStatus.RUNNING
