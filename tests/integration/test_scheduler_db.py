"""Rounds written to a real database: one transaction, constant statements, fenced."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.db import database_now
from ultimat3_jobs.leaders import LeaderElection, LeaseLeader, SoleLeader
from ultimat3_jobs.models import Job, Lease, Occurrence, Task
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.store import TaskState
from ultimat3_jobs.store import portable as portable_store
from ultimat3_jobs.store import postgres as postgres_store
from ultimat3_jobs.store.portable import DECLARATIONS_UPDATED

from .factories import make_tasks

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


def round_over(
    count: int, clock: FrozenClock, leader: LeaderElection | None = None, prefix: str = "n"
) -> tuple[Scheduler, DatabaseState]:
    tasks = make_tasks(count, prefix=prefix)
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state,
        leader=leader or SoleLeader(),
        clock=clock,
        tasks=tasks,
        drain_on_shutdown=False,
    )
    state.sync(tasks)
    scheduler.tick()  # arms every task
    return scheduler, state


@pytest.mark.django_db
def test_round__all_due_writes_jobs_records_and_watermarks_in_one_go() -> None:
    clock = FrozenClock(T0)
    scheduler, _ = round_over(3, clock)
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    fired = scheduler.tick()
    assert len(fired) == 3
    assert Job.objects.count() == 3
    assert set(Job.objects.values_list("enqueued_by", "task", "occurrence")) == {
        ("scheduler", f"n.{i:05d}", datetime(2026, 6, 1, 0, 1, tzinfo=UTC)) for i in range(3)
    }
    assert Occurrence.objects.filter(outcome="fired").count() == 3
    assert set(Task.objects.values_list("last_fired_at", flat=True)) == {clock()}


@pytest.mark.django_db
def test_round__is_written_by_the_store_the_state_is_given() -> None:
    # The ORM's store, on whichever database the suite runs: a test can hand the state one.
    from ultimat3_jobs.store import PortableStore

    calls: list[str] = []

    class Recording(PortableStore):
        def insert_round(self, rows: Any) -> Any:
            calls.append("insert_round")
            return super().insert_round(rows)

    clock = FrozenClock(T0)
    tasks = make_tasks(2, prefix="given")
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock, store=Recording("default"))
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    state.sync(tasks)
    scheduler.tick()  # Arms every task: a round that fires nothing.
    calls.clear()
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    assert len(scheduler.tick()) == 2
    assert calls == ["insert_round"]
    assert Job.objects.count() == 2
    assert Occurrence.objects.filter(outcome="fired").count() == 2


def _queries_for_a_full_round(count: int) -> int:
    clock = FrozenClock(T0)
    scheduler, _ = round_over(count, clock)
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    with CaptureQueriesContext(connection) as queries:
        fired = scheduler.tick()
    assert len(fired) == count
    return len(queries)


@pytest.mark.postgres
@pytest.mark.django_db
def test_round__queries_do_not_grow_with_the_number_of_tasks() -> None:
    small = _queries_for_a_full_round(100)
    Job.objects.all().delete()
    Task.objects.all().delete()
    large = _queries_for_a_full_round(1000)
    assert small == large
    assert small <= 16


@pytest.mark.django_db
def test_round__nothing_due_runs_no_task_query() -> None:
    clock = FrozenClock(T0)
    scheduler, _ = round_over(50, clock)
    clock.advance(5)
    with CaptureQueriesContext(connection) as queries:
        assert scheduler.tick() == []
    touching = [q["sql"] for q in queries if "ultimat3_jobs_task" in q["sql"]]
    assert touching == []


@pytest.mark.django_db
def test_round__a_watermark_moved_by_another_node_writes_nothing() -> None:
    clock = FrozenClock(T0)
    scheduler, state = round_over(1, clock)
    clock.set(datetime(2026, 6, 1, 0, 1, 1, tzinfo=UTC))
    # Another node dispatched the occurrence between our read and our write.
    original_load = state.load

    def load_then_race(names: object = None) -> object:
        loaded = original_load(names)  # type: ignore[arg-type]
        Task.objects.update(last_fired_at=clock())
        return loaded

    state.load = load_then_race  # type: ignore[assignment,method-assign]
    assert scheduler.tick() == []
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_round__the_same_occurrence_from_two_nodes_shares_its_key() -> None:
    clock = FrozenClock(T0)
    first, _ = round_over(1, clock)
    clock.set(datetime(2026, 6, 1, 0, 1, 1, tzinfo=UTC))
    [fired] = first.tick()
    # A second node that read the old watermark computes the same key; the insert is absorbed.
    from ultimat3_jobs.registry import registry
    from ultimat3_jobs.store import PortableStore
    from ultimat3_jobs.store.columns import build_job

    ping = registry.get_job("demo.ping")
    assert ping is not None
    duplicate = build_job(
        ping,
        {"label": "x"},
        key=fired.jobs[0].result.key,
        run_at=None,
        queue=None,
        enqueued_by="scheduler",
        now=clock(),
    )
    assert PortableStore("default").insert_many([duplicate]) == {
        fired.jobs[0].result.key: (fired.jobs[0].result.job_id, False)
    }
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_lease__only_the_owner_renews_and_an_expired_lease_is_taken() -> None:
    a = LeaseLeader(node_id="a", ttl=timedelta(seconds=30))
    b = LeaseLeader(node_id="b", ttl=timedelta(seconds=30))
    from ultimat3_jobs.models import Lease

    assert a.acquire()
    first_acquired = Lease.objects.get().acquired_at
    assert first_acquired is not None
    assert not b.acquire()
    assert a.acquire()  # renewal keeps the time it was taken
    assert Lease.objects.get().acquired_at == first_acquired

    Lease.objects.update(expires_at=datetime(2001, 1, 1, tzinfo=UTC))
    assert b.acquire()
    assert not a.acquire()
    assert not a.fence("default")
    assert b.fence("default")
    a.release()  # not the owner: changes nothing
    assert Lease.objects.get().owner == "b"
    b.release()
    assert a.acquire()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lease__taken_after_a_wait_on_its_row_lives_its_whole_ttl_from_then() -> None:
    # A leader stopped mid-round holds the lease row's lock past the TTL; the node waiting
    # to take the expired lease is granted it once the lock goes, and must then hold it.
    import psycopg

    from ultimat3_jobs.models import Lease

    ttl = timedelta(seconds=1)
    waiting = LeaseLeader(node_id="b", ttl=ttl)
    assert LeaseLeader(node_id="a", ttl=ttl).acquire()
    Lease.objects.update(expires_at=datetime(2001, 1, 1, tzinfo=UTC))
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as stopped:
        stopped.execute("SELECT 1 FROM ultimat3_jobs_lease FOR UPDATE")
        got: list[bool] = []

        def take() -> None:
            try:
                got.append(waiting.acquire())
            finally:
                connections.close_all()  # This thread's own connection.

        taking = threading.Thread(target=take)
        taking.start()
        time.sleep(1.5)  # past the TTL, the taker's statement waiting all along
        stopped.rollback()
        taking.join(10)

    assert got == [True]
    assert waiting.fence("default")  # not granted already expired


@pytest.mark.django_db
def test_lease__fencing_stops_a_node_whose_lease_expired_mid_round() -> None:
    clock = FrozenClock(T0)
    leader = LeaseLeader(node_id="a", ttl=timedelta(seconds=30))
    scheduler, state = round_over(1, clock, leader=leader)
    clock.set(datetime(2026, 6, 1, 0, 1, 1, tzinfo=UTC))
    original_load = state.load

    def load_then_expire(names: object = None) -> object:
        from ultimat3_jobs.models import Lease

        loaded = original_load(names)  # type: ignore[arg-type]
        Lease.objects.update(owner="b")  # another node took over while we were paused
        return loaded

    state.load = load_then_expire  # type: ignore[assignment,method-assign]
    assert scheduler.tick() == []
    assert Job.objects.count() == 0
    assert not scheduler.is_leader


@pytest.mark.django_db
def test_sync__records_declarations_marks_removed_and_spares_unchanged_functions() -> None:
    calls = []
    [handle] = make_tasks(1, prefix="sync")
    original = handle.func

    def counting(occurrence: datetime) -> object:
        calls.append(occurrence)
        return original(occurrence)

    handle.func = counting  # type: ignore[assignment]
    Task.objects.create(name="gone.task", cron="0 3 * * *", tz="UTC")
    state = DatabaseState(node_id="n", leader="sole")
    state.sync([handle])
    row = Task.objects.get(name="sync.00000")
    assert (row.cron, row.tz, row.jobs, row.declared) == ("* * * * *", "UTC", ["demo.ping"], True)
    assert not Task.objects.get(name="gone.task").declared
    state.sync([handle])  # a restart with the same declarations
    assert len(calls) == 1


def _backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


def _task_writes(state: DatabaseState, tasks: list[Any]) -> list[str]:
    """``state.sync(tasks)``, which refuses none of them; the statements writing task rows."""
    with CaptureQueriesContext(connection) as queries:
        assert state.sync(tasks).refused == {}
    return [q["sql"].split()[0] for q in queries if "ultimat3_jobs_task (" in q["sql"]]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sync__new_tasks_go_in_by_one_copy_their_rows_made_in_a_thread_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres_store, "SYNC_SLICE", 3)
    tasks = make_tasks(7, prefix="slice")
    original = tasks[5].func
    made_in: list[str] = []

    def reading(occurrence: datetime) -> object:
        made_in.append(threading.current_thread().name)
        Job.objects.count()  # The database, from the thread making the rows.
        return original(occurrence)

    tasks[5].func = reading  # type: ignore[assignment]
    backends = _backends()
    assert _task_writes(DatabaseState(node_id="n", leader="sole"), tasks) == ["COPY"]
    rows = Task.objects.filter(name__startswith="slice.")
    assert dict(rows.values_list("name", "jobs")) == {task.name: ["demo.ping"] for task in tasks}
    # Written with the transaction's now(), as the INSERT writes them.
    assert len({(row.first_seen_at, row.synced_at) for row in rows}) == 1
    assert made_in == ["ultimat3-rows-ahead"]
    # The connection the function opened in that thread was closed with it.
    assert _backends() == backends


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sync__a_name_another_node_wrote_since_the_read_is_left_alone_and_the_rest_go_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres_store, "SYNC_SLICE", 3)
    tasks = make_tasks(7, prefix="race")
    Task.objects.create(name=tasks[4].name, cron="0 3 * * *", tz="Europe/Paris")
    state = DatabaseState(node_id="n", leader="sole")
    # The table as read before the other node wrote its row: every task looks new.
    monkeypatch.setattr(state.store, "_every_declaration", lambda expected: [])
    # The COPY gave way to the INSERTs: 3 + 3 + 1.
    assert _task_writes(state, tasks) == ["COPY", "INSERT", "INSERT", "INSERT"]
    crons = dict(Task.objects.filter(name__startswith="race.").values_list("name", "cron"))
    assert crons == {task.name: "0 3 * * *" if task is tasks[4] else "* * * * *" for task in tasks}


@pytest.mark.django_db
def test_heartbeat__compares_clocks_every_round_and_warns_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from ultimat3_jobs.models import Node

    clock = FrozenClock(datetime.now(UTC) + timedelta(seconds=30))  # a node running 30 s fast
    state = DatabaseState(node_id="skewed", leader="sole", clock=clock)
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs"):
        for _ in range(3):
            state.heartbeat(is_leader=True, round_at=clock(), error="")
            clock.advance(1)
    warnings = [r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.clock-skew"]
    assert len(warnings) == 1
    assert 29_000 < warnings[0].fields["skew_ms"] < 31_500  # type: ignore[attr-defined]
    assert 29_000 < (Node.objects.get(node_id="skewed").clock_skew_ms or 0) < 31_500


def _statements_of_a_full_round(count: int) -> list[str]:
    clock = FrozenClock(T0)
    scheduler, _ = round_over(count, clock, prefix=f"s{count}")
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    with CaptureQueriesContext(connection) as queries:
        fired = scheduler.tick()
    assert len(fired) == count
    assert Job.objects.filter(task__startswith=f"s{count}.").count() == count
    # What each statement is (its first word), in order.
    return [q["sql"].split()[0].upper() for q in queries]


@pytest.mark.postgres
@pytest.mark.django_db
def test_round__the_same_statements_at_10_and_2000_tasks_copy_included() -> None:
    small = _statements_of_a_full_round(10)
    large = _statements_of_a_full_round(2000)
    assert large == small, small
    assert sum(s.startswith("COPY") for s in small) == 2  # the jobs and the records
    assert len(small) <= 12, small


@pytest.mark.postgres
@pytest.mark.django_db
def test_round__a_job_key_already_there_is_reported_and_the_rest_inserted() -> None:
    clock = FrozenClock(T0)
    scheduler, _ = round_over(3, clock)
    occurrence = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)
    clock.set(occurrence + timedelta(seconds=1))
    # A watermark moved back by hand: the occurrence's job of n.00001 exists already.
    from ultimat3_jobs.planner import occurrence_key
    from ultimat3_jobs.registry import registry

    ping = registry.get_job("demo.ping")
    assert ping is not None
    data = {"label": occurrence.isoformat()}
    key = occurrence_key("n.00001", occurrence, ping.occurrence_part(data))
    existing = Job.objects.create(name="demo.ping", key=key, input=data, run_at=T0, created_at=T0)
    fired = scheduler.tick()
    results = {d.task: d.jobs[0].result for d in fired}
    assert (results["n.00001"].created, results["n.00001"].job_id) == (False, existing.pk)
    assert [results[f"n.0000{i}"].created for i in (0, 2)] == [True, True]
    assert Job.objects.count() == 3
    assert Occurrence.objects.filter(outcome="fired").count() == 3
    assert set(Task.objects.values_list("last_fired_at", flat=True)) == {clock()}


def _synced(state: DatabaseState, handle: Any) -> TaskState:
    """``handle``'s state as the sync of it alone returns it."""
    states = state.sync([handle]).states
    assert states is not None
    return states[handle.name]


@pytest.mark.django_db
def test_sync__a_changed_declaration_keeps_its_watermark_unless_its_schedule_moved() -> None:
    [handle] = make_tasks(1, prefix="changed")
    state = DatabaseState(node_id="n", leader="sole")
    state.sync([handle])
    Task.objects.filter(name="changed.00000").update(last_fired_at=T0)
    # Its catch-up policy and overlap: the instants it fires on are the same.
    [policy] = make_tasks(1, catch_up="run-all", overlap="skip", prefix="changed")
    assert _synced(state, policy).watermark == T0
    row = Task.objects.get(name="changed.00000")
    assert (row.catch_up, row.overlap, row.last_fired_at) == ("run-all", "skip", T0)
    # Its cron and zone: armed anew, from the next round, as a task seen for the first time.
    [moved] = make_tasks(1, cron="0 3 * * *", tz="Europe/Paris", prefix="changed")
    assert _synced(state, moved).watermark is None
    row = Task.objects.get(name="changed.00000")
    assert (row.cron, row.tz, row.declared, row.last_fired_at) == (
        "0 3 * * *",
        "Europe/Paris",
        True,
        None,
    )


@pytest.mark.django_db(transaction=True)
def test_sync__changed_declarations_go_in_by_statements_that_do_not_grow_with_them() -> None:
    # A deploy that changed every declaration: Django's bulk_update wrote one CASE branch per
    # row for each column, a statement PostgreSQL spent ten minutes on at 10,000 tasks.
    state = DatabaseState(node_id="n", leader="sole")
    state.sync(make_tasks(300, prefix="mass"))
    Task.objects.filter(name__startswith="mass.").update(last_fired_at=T0)
    kept = make_tasks(150, catch_up="run-all", prefix="mass")  # the same instants: kept
    moved = make_tasks(300, cron="0 3 * * *", prefix="mass")[150:]  # another cron: re-armed
    with CaptureQueriesContext(connection) as queries:
        assert state.sync([*kept, *moved]).refused == {}
    writes = [q["sql"] for q in queries if q["sql"].lstrip().startswith("UPDATE")]
    rows = {row.name: row for row in Task.objects.filter(name__startswith="mass.")}
    assert all(rows[t.name].catch_up == "run-all" for t in kept)
    assert all(rows[t.name].last_fired_at == T0 for t in kept)
    assert all(
        (rows[t.name].cron, rows[t.name].last_fired_at) == ("0 3 * * *", None) for t in moved
    )
    assert all(row.declared and row.jobs == ["demo.ping"] for row in rows.values())
    # One statement on PostgreSQL; elsewhere, one per values written, each of a bounded size.
    if connection.vendor == "postgresql":
        [write] = writes
        assert '"id" = ' not in write  # No branch per row: a join on the name.
    else:
        # One per set of rows taking the same values (the kept, the re-armed).
        rows_each = [sql.count("'mass.") for sql in writes]
        assert sorted(rows_each) == [150, 150] and max(rows_each) <= DECLARATIONS_UPDATED


@pytest.mark.django_db
def test_sync__a_task_declared_again_after_it_was_removed_fires_nothing_of_the_time_between() -> (
    None
):
    clock = FrozenClock(T0)
    tasks = make_tasks(1, cron="* * * * * *", catch_up="run-all", prefix="back")
    scheduler, state = round_over(0, clock)
    state.sync(tasks)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    scheduler.tick()  # armed
    clock.advance(1)
    assert len(scheduler.tick()) == 1
    state.sync([])  # a release without it
    assert not Task.objects.get(name="back.00000").declared
    clock.advance(15)
    state.sync(tasks)  # and one with it again
    back = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    assert back.tick() == []  # armed again: the fifteen seconds it was away are not run
    clock.advance(1)
    assert len(back.tick()) == 1
    assert Job.objects.filter(task="back.00000").count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("before", "after", "next_due"),
    [
        # Armed for the first of next month, then made to fire every ten seconds: it waited
        # for next month.
        ("0 0 1 * *", "*/10 * * * * *", datetime(2026, 6, 1, 22, 59, 40, tzinfo=UTC)),
        # Fired at :58, then moved to :59 a minute and a half later: the :59 just past came
        # due at once, an hour's run a minute after the last.
        ("58 * * * *", "59 * * * *", datetime(2026, 6, 1, 23, 59, tzinfo=UTC)),
    ],
    ids=["armed-for-next-month", "moved-past-its-last-firing"],
)
def test_round__a_cron_changed_between_releases_fires_by_the_new_one_from_the_change(
    before: str, after: str, next_due: datetime
) -> None:
    clock = FrozenClock(datetime(2026, 6, 1, 22, 57, 30, tzinfo=UTC))
    _, state = round_over(0, clock)

    def release(cron: str) -> Scheduler:
        tasks = make_tasks(1, cron=cron, catch_up="run-once", prefix="cron")
        state.sync(tasks)
        return Scheduler(
            state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
        )

    old = release(before)
    assert old.tick() == []  # armed
    clock.set(datetime(2026, 6, 1, 22, 58, tzinfo=UTC))
    old.tick()
    fired_before = Job.objects.count()
    clock.set(datetime(2026, 6, 1, 22, 59, 30, tzinfo=UTC))
    new = release(after)
    assert new.tick() == []  # armed anew
    clock.set(next_due - timedelta(milliseconds=1))
    assert new.tick() == []
    clock.set(next_due)
    assert len(new.tick()) == 1
    assert Job.objects.count() == fired_before + 1


@pytest.mark.django_db
def test_sync__that_added_no_row_returns_every_row_state_as_it_read_them() -> None:
    tasks = make_tasks(3, prefix="read")
    state = DatabaseState(node_id="n", leader="sole")
    assert state.sync(tasks).states is None  # A first start added every row.
    Task.objects.filter(name="read.00001").update(last_fired_at=T0, paused=True)
    Task.objects.create(name="gone.task", cron="0 3 * * *", tz="UTC", last_fired_at=T0)
    synced = state.sync(tasks)
    assert synced.refused == {}
    assert synced.states == state.load()
    assert synced.states["read.00001"] == TaskState(T0, paused=True)
    assert synced.states["read.00000"] == TaskState(None)
    # A declaration rewritten keeps its row's state; a new task's row was not there to read.
    [changed] = make_tasks(1, cron="0 3 * * *", prefix="read")
    rewritten = state.sync([changed, *tasks[1:]])
    assert Task.objects.get(name="read.00000").cron == "0 3 * * *"
    assert rewritten.states == state.load()
    assert rewritten.states["read.00001"] == TaskState(T0, paused=True)
    assert state.sync([*tasks, *make_tasks(1, prefix="added")]).states is None


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("read", "disabled", "server_side"),
    [(2, False, True), (2, True, False), (100, False, False)],
    ids=["server-side", "server-side-disabled", "fewer-than-a-slice"],
)
def test_sync__reads_the_rows_a_slice_at_a_time_keeping_each_state_under_its_handles_name(
    monkeypatch: pytest.MonkeyPatch, read: int, disabled: bool, server_side: bool
) -> None:
    monkeypatch.setattr(postgres_store, "DECLARATIONS_READ", read)
    if disabled:
        monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    tasks = make_tasks(6, prefix="slice")
    state = DatabaseState(node_id="n", leader="sole")
    state.sync(tasks)
    Task.objects.filter(name="slice.00002").update(last_fired_at=T0, paused=True)
    Task.objects.create(name="gone.task", cron="0 3 * * *", tz="UTC", last_fired_at=T0)
    [changed] = make_tasks(1, cron="0 3 * * *", prefix="slice")
    declared = [changed, *tasks[1:]]
    compare = portable_store.declared
    cursors_open: list[int] = []

    def comparing(handle: Any) -> tuple[Any, ...]:
        # While the sync compares a row, its read is still open on the server (or, with
        # server-side cursors disabled or few tasks, was read whole by then).
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_cursors WHERE statement LIKE '%%declared%%'")
            cursors_open.append(cursor.fetchone()[0])
        return compare(handle)

    monkeypatch.setattr(portable_store, "declared", comparing)
    synced = state.sync(declared)
    # Every row compared as read (the changed declaration is rewritten once it is done).
    assert cursors_open == [1 if server_side else 0] * len(declared)
    assert synced.states == state.load()
    assert synced.states["slice.00002"] == TaskState(T0, paused=True)
    assert Task.objects.get(name="slice.00000").cron == "0 3 * * *"
    assert not Task.objects.get(name="gone.task").declared
    # Each state is kept under the handle's own name, not a copy read from its row.
    keys = {name: name for name in synced.states}
    assert all(keys[handle.name] is handle.name for handle in declared)


def _reads_of_every_row(queries: CaptureQueriesContext) -> list[str]:
    """The statements reading task rows' declarations or pauses (the sync's, the states')."""
    selected = [q["sql"].replace('"', "").partition("FROM ultimat3_jobs_task") for q in queries]
    return [s for s, table, _ in selected if table and ("declared" in s or "paused" in s)]


@pytest.mark.django_db
def test_start__a_restart_plans_from_the_rows_its_sync_read_reading_them_once() -> None:
    clock = FrozenClock(T0)
    tasks = make_tasks(20, prefix="restart")
    DatabaseState(node_id="before", leader="sole").sync(tasks)
    Task.objects.filter(name__startswith="restart.").update(last_fired_at=T0)
    Task.objects.filter(name="restart.00003").update(paused=True)
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    with CaptureQueriesContext(connection) as queries:
        fired = scheduler.tick()
    assert sorted(f.task for f in fired) == [t.name for t in tasks if t.name != "restart.00003"]
    assert Occurrence.objects.filter(task="restart.00003", outcome="paused").count() == 1
    # The sync's read, and no second one of the watermarks.
    [read] = _reads_of_every_row(queries)
    assert "declared" in read and "last_fired_at" in read


def _nested_loops(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Node Type") == "Nested Loop" else []
    for child in plan.get("Plans", []):
        found += _nested_loops(child)
    return found


def _relations(plan: dict[str, Any]) -> set[str]:
    found = {plan["Relation Name"]} if "Relation Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= _relations(child)
    return found


def _swap_plan(rows: list[tuple[Any, ...]], *, analyze: bool = False) -> dict[str, Any]:
    import json

    from ultimat3_jobs.db import dumps
    from ultimat3_jobs.store import sql

    explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) "
    with connection.cursor() as cursor:
        cursor.execute(explain + sql.SWAP_WATERMARKS, [dumps(rows)])
        [(explained,)] = cursor.fetchall()
    found: dict[str, Any] = (json.loads(explained) if isinstance(explained, str) else explained)[0]
    return found


@pytest.mark.postgres
@pytest.mark.django_db
def test_compare_and_set__looks_each_task_up_by_its_name_whatever_the_estimates() -> None:
    """A join of the input with itself or with all of the task rows is quadratic: at 100,000
    tasks, hours. Every nested loop of the plan must look a task up through an index, or
    spread one pair's names (each pair once)."""
    clock = FrozenClock(T0)
    round_over(300, clock)
    names = list(Task.objects.values_list("name", flat=True))
    # Every task with the pair of another, and all of them with one pair.
    for rows in (
        [([name], None, T0.isoformat()) for name in names],
        [(names, None, T0.isoformat())],
    ):
        plan = _swap_plan(rows)["Plan"]
        # A hash join is linear too; a nested loop must look each task up by its name.
        for loop in _nested_loops(plan):
            outer, inner = loop["Plans"]
            if inner["Node Type"] == "Function Scan":
                assert inner["Function Name"] == "jsonb_array_elements_text", loop
                assert not _relations(outer), loop  # the pairs, not the task rows
                continue
            assert inner["Node Type"] in ("Index Scan", "Index Only Scan"), loop
            assert inner["Index Name"] == "u3j_task_name", loop


@pytest.mark.postgres
@pytest.mark.django_db
def test_compare_and_set__a_join_spilling_to_disk_writes_each_name_once() -> None:
    """With the names of one pair carried along every row they were spread into, a hash join
    too big for ``work_mem`` wrote the whole list out again per row: at 100,000 tasks of one
    schedule, 80 GB of temporary files and five minutes for one round."""
    clock = FrozenClock(T0)
    round_over(3000, clock)
    names = list(Task.objects.values_list("name", flat=True))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '64kB'")  # spilt at any size
        cursor.execute("SET LOCAL enable_nestloop = off")
        cursor.execute("SET LOCAL enable_mergejoin = off")
    explained = _swap_plan([(names, None, T0.isoformat())], analyze=True)
    written = explained["Plan"].get("Temp Written Blocks", 0)
    # 3,000 names of about 15 bytes, 8 kB a block: a few blocks per copy of the list.
    assert 0 < written < 100, written


@pytest.mark.django_db
def test_round__a_node_taking_the_leadership_back_mirrors_its_declarations_again() -> None:
    # Two releases side by side: the other node's sync marked this node's task removed.
    clock = FrozenClock(T0)
    tasks = make_tasks(1, prefix="skew")

    def node(name: str, declared: list[Any]) -> Scheduler:
        return Scheduler(
            state=DatabaseState(node_id=name, leader="lease", clock=clock),
            leader=LeaseLeader(node_id=name, ttl=timedelta(seconds=10)),
            clock=clock,
            tasks=declared,
            drain_on_shutdown=False,
        )

    ours, theirs = node("ours", tasks), node("theirs", [])

    def expire() -> None:
        Lease.objects.update(expires_at=T0 - timedelta(days=1))

    ours.tick()
    assert Task.objects.get(name="skew.00000").declared
    expire()
    theirs.tick()
    assert not Task.objects.get(name="skew.00000").declared
    ours.tick()  # the other leads: this one concedes
    assert not ours.is_leader
    expire()
    ours.tick()
    assert ours.is_leader
    assert Task.objects.get(name="skew.00000").declared


@pytest.mark.django_db
@pytest.mark.parametrize("count", [1, 120], ids=["written-after", "streamed"])
def test_round__a_drain_between_one_task_s_occurrences_keeps_the_rest_for_the_next_round(
    count: int,
) -> None:
    # A run-all catch-up of a task whose function takes seconds an occurrence: the drain does
    # not wait for all of them.
    clock = FrozenClock(T0)
    scheduler: Scheduler
    calls: list[datetime] = []
    tasks = make_tasks(count, cron="* * * * *", catch_up="run-all", prefix="drained")
    slow = tasks[-1]
    entries = slow.func

    def draining_after_two(occurrence: datetime) -> object:
        calls.append(occurrence)
        if len(calls) == 2:
            scheduler.life.drain("SIGTERM")
        return entries(occurrence)

    slow.func = draining_after_two  # type: ignore[assignment]
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    state.sync(tasks)
    scheduler.life.begin()
    scheduler.tick()  # armed at 00:01:00 - 1 ms
    calls.clear()
    clock.set(T0 + timedelta(minutes=5))  # 00:01 to 00:05 due: five occurrences each
    scheduler.tick()
    fired = Job.objects.filter(task=slow.name).order_by("occurrence")
    assert (
        [job.occurrence for job in fired]
        == calls
        == [
            datetime(2026, 6, 1, 0, 1, tzinfo=UTC),
            datetime(2026, 6, 1, 0, 2, tzinfo=UTC),
        ]
    )
    # The next round, on whichever node, starts at the third.
    assert Task.objects.get(name=slow.name).last_fired_at == datetime(
        2026, 6, 1, 0, 2, 59, 999_000, tzinfo=UTC
    )


@pytest.mark.django_db
def test_lease__a_round_whose_task_function_outlives_the_lease_is_renewed_and_written() -> None:
    # Unrenewed, the fence found the lease expired, in that round and in every one after it.
    from .factories import demo_ping, task_of

    ping = demo_ping()

    def slow(occurrence: datetime) -> list[Any]:
        time.sleep(0.5)
        return [(ping, {"label": "slow"})]

    handle = task_of(slow, "n.slow-function")
    clock = FrozenClock(T0)
    state = DatabaseState(node_id="node-a", leader="lease", clock=clock)
    leader = LeaseLeader(node_id="node-a", ttl=timedelta(seconds=0.3))
    scheduler = Scheduler(
        state=state, leader=leader, clock=clock, tasks=[handle], drain_on_shutdown=False
    )
    state.sync([handle])
    scheduler.tick()  # arms it
    clock.set(datetime(2026, 6, 1, 0, 1, 0, 200_000, tzinfo=UTC))
    assert len(scheduler.tick()) == 1
    assert Job.objects.filter(task="n.slow-function").count() == 1
    assert Lease.objects.get().owner == "node-a"


@pytest.mark.django_db
def test_round__a_leader_clock_a_day_ahead_plans_from_the_databases_plus_the_grace() -> None:
    # A clock stepped a day forward (a VM restored, an NTP step) dropped a day of occurrences
    # as missed and carried every watermark a day ahead: no node fired anything for a day.
    real = database_now()
    clock = FrozenClock(real)
    scheduler, _ = round_over(3, clock, prefix="ahead")  # armed on the right clock
    clock.set(real + timedelta(days=1))

    scheduler.tick()

    assert not Occurrence.objects.filter(task__startswith="ahead.", outcome="dropped").exists()
    # At most the minutes up to the grace past the database's now fired, none a day early.
    latest = database_now() + scheduler.misfire_grace + timedelta(seconds=1)
    fired = Job.objects.filter(task__startswith="ahead.")
    assert all(job.occurrence is not None and job.occurrence <= latest for job in fired)
    marks = Task.objects.filter(name__startswith="ahead.").values_list("last_fired_at", flat=True)
    assert all(mark is not None and mark <= latest for mark in marks)
