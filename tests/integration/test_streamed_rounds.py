"""A big round on PostgreSQL, written while its task functions run in a thread of their own.

Every test runs with committed data (``transaction=True``): a round streams only outside the
caller's transaction. Each compares the streamed round with what the round written after
planning (the path of small rounds) writes, or checks a failure leaves what that one leaves.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from ultimat3_jobs import scheduler as scheduler_module
from ultimat3_jobs.clock import ONE_MS, FrozenClock
from ultimat3_jobs.handles import JobHandle, TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job, Occurrence, Task
from ultimat3_jobs.planner import occurrence_key
from ultimat3_jobs.scheduler import STREAM_FROM, Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.store import postgres as postgres_store
from ultimat3_jobs.store.columns import QUEUE

from .factories import demo_ping, make_tasks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
OCCURRENCE = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)
COUNT = STREAM_FROM + 20


def _armed(tasks: list[TaskHandle], clock: FrozenClock, **options: Any) -> Scheduler:
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(state=state, clock=clock, tasks=tasks, drain_on_shutdown=False, **options)
    scheduler.tick()  # arms every task
    clock.set(OCCURRENCE + timedelta(milliseconds=200))
    return scheduler


def _streams(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record, per round, whether it streamed."""
    seen: list[bool] = []
    original = scheduler._streams

    def streams(*args: Any) -> bool:
        seen.append(original(*args))
        return seen[-1]

    monkeypatch.setattr(scheduler, "_streams", streams)
    return seen


def _written() -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]], dict[str, datetime | None]]:
    jobs = {
        (*row[:2], str(row[2]), *row[3:])
        for row in Job.objects.values_list(
            "name", "key", "input", "status", "queue", "max_attempts", "run_at", "task",
            "occurrence", "catch_up", "enqueued_by",
        )
    }  # fmt: skip
    records = {
        (r.task, r.outcome, r.occurrence, r.count, r.catch_up, str(r.jobs), r.detail)
        for r in Occurrence.objects.all()
    }
    watermarks = dict(Task.objects.values_list("name", "last_fired_at"))
    return jobs, records, watermarks


def _reset() -> None:
    Job.objects.all().delete()
    Occurrence.objects.all().delete()
    Task.objects.all().delete()


def _round(
    tasks: list[TaskHandle], monkeypatch: pytest.MonkeyPatch, *, stream: bool, late: bool = False
) -> tuple[scheduler_module.Report, list[bool]]:
    """One all-due round over ``tasks``, streamed or not; ``late``: two minutes late, with a
    tenth of the tasks paused meanwhile, so it also records dropped and paused occurrences."""
    with monkeypatch.context() as patch:
        if not stream:
            patch.setattr(scheduler_module, "STREAM_FROM", 10**9)
        clock = FrozenClock(T0)
        scheduler = _armed(tasks, clock)
        if late:
            clock.advance(120)
            Task.objects.filter(name__in=[t.name for t in tasks[::10]]).update(paused=True)
        seen = _streams(scheduler, patch)
        return scheduler.tick(), seen


def _fan_out(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
    ping = demo_ping()
    return [(ping, {"label": f"{occurrence.isoformat()} #{n}"}) for n in range(3)]


def _nothing(occurrence: datetime) -> list[Any]:
    return []


def _shaped(shape: str) -> list[TaskHandle]:
    tasks = make_tasks(COUNT)
    if shape == "fan-out":
        # More jobs than occurrences: more than the ids reserved for one job each.
        for task in tasks[:30]:
            task.func = _fan_out
        for task in tasks[30:40]:
            task.func = _nothing
    return tasks


@pytest.mark.parametrize("shape", ["one job each", "fan-out", "late, some paused"])
def test_streamed_round__writes_what_a_round_written_after_planning_writes(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = _shaped(shape)
    late = shape.startswith("late")
    fired, seen = _round(tasks, monkeypatch, stream=True, late=late)
    assert seen == [True]
    streamed = _written()
    ids = dict(Job.objects.values_list("key", "id"))
    assert {job.result.key: job.result.job_id for d in fired for job in d.jobs} == ids
    assert all(job.result.created for d in fired for job in d.jobs)
    _reset()
    again, seen = _round(tasks, monkeypatch, stream=False, late=late)
    assert seen == [False]
    assert _written() == streamed
    jobs, records, watermarks = streamed
    if shape == "late, some paused":
        outcomes = sorted(outcome for _, outcome, *_ in records)
        paused = len(tasks[::10])
        assert outcomes.count("paused") == paused
        assert outcomes.count("dropped") == outcomes.count("fired") == COUNT - paused
    else:
        assert len(jobs) == (COUNT if shape == "one job each" else COUNT + 30 * 2 - 10)
        assert set(watermarks.values()) == {OCCURRENCE + timedelta(milliseconds=200)}
    assert [(d.task, d.occurrence, d.catch_up) for d in again] == [
        (d.task, d.occurrence, d.catch_up) for d in fired
    ]


def _statements(count: int, prefix: str) -> list[str]:
    scheduler = _armed(make_tasks(count, prefix=prefix), FrozenClock(T0))
    with CaptureQueriesContext(connection) as queries:
        fired = scheduler.tick()
    assert len(fired) == count
    return [q["sql"].split()[0].upper() for q in queries]


def test_streamed_round__the_same_statements_at_two_sizes() -> None:
    small = _statements(COUNT, "a")
    large = _statements(10 * COUNT, "b")
    assert small == large
    assert sum(s.startswith("COPY") for s in small) == 2  # the jobs and the records
    # No savepoint around the jobs' COPY: a key that exists rolls the whole round back.
    assert not {"SAVEPOINT", "RELEASE"} & set(small), small
    assert len(small) <= 9, small


def _failing(occurrence: datetime) -> list[Any]:
    raise RuntimeError("broken")


def _backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


def test_streamed_round__a_failing_task_keeps_its_occurrence_and_the_others_fire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = make_tasks(COUNT)
    broken = tasks[7]
    working = broken.func
    broken.func = _failing
    clock = FrozenClock(T0)
    scheduler = _armed(tasks, clock)
    seen = _streams(scheduler, monkeypatch)
    fired = scheduler.tick()
    assert seen == [True]
    assert len(fired) == COUNT - 1
    assert broken.name not in {d.task for d in fired}
    assert not Job.objects.filter(task=broken.name).exists()
    assert not Occurrence.objects.filter(task=broken.name).exists()
    watermarks = dict(Task.objects.values_list("name", "last_fired_at"))
    assert watermarks.pop(broken.name) == OCCURRENCE - ONE_MS
    assert set(watermarks.values()) == {clock()}
    assert broken.name in scheduler.last_error
    # Mended, it fires that very occurrence next round, and only it.
    broken.func = working
    clock.advance(1)
    [again] = scheduler.tick()
    assert (again.task, again.occurrence) == (broken.name, OCCURRENCE)
    assert Job.objects.count() == COUNT


def test_streamed_round__a_failing_run_once_task_records_no_drop_until_it_fires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # run-once drops what follows the occurrence it fires: held, that occurrence comes again
    # next round with the same drops, which are recorded once, when it fires.
    tasks = make_tasks(COUNT, catch_up="run-once")
    broken = tasks[7]
    working = broken.func
    broken.func = _failing
    clock = FrozenClock(T0)
    scheduler = _armed(tasks, clock)
    clock.advance(120)  # 00:01, 00:02 and 00:03 due
    seen = _streams(scheduler, monkeypatch)

    fired = scheduler.tick()
    clock.advance(1)
    assert scheduler.tick() == []
    held_drops = Occurrence.objects.filter(task=broken.name).count()
    broken.func = working
    clock.advance(1)
    [again] = scheduler.tick()

    assert seen == [True, False, False]
    assert len(fired) == COUNT - 1
    assert held_drops == 0
    assert (again.task, again.occurrence) == (broken.name, OCCURRENCE)
    drops = Occurrence.objects.filter(outcome="dropped")
    assert drops.count() == COUNT
    [late] = drops.filter(task=broken.name)
    assert (late.occurrence, late.count) == (OCCURRENCE + timedelta(minutes=1), 2)


def test_streamed_round__a_key_already_there_is_reported_and_the_rest_written(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = make_tasks(COUNT)
    scheduler = _armed(tasks, FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    calls: list[datetime] = []
    last = tasks[-1]
    entries = last.func

    def counted(occurrence: datetime) -> Any:
        calls.append(occurrence)
        return entries(occurrence)

    last.func = counted
    ping = demo_ping()
    data = {"label": OCCURRENCE.isoformat()}
    key = occurrence_key(tasks[3].name, OCCURRENCE, ping.occurrence_part(data))
    existing = Job.objects.create(name="demo.ping", key=key, input=data, run_at=T0, created_at=T0)
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs.scheduler"):
        fired = scheduler.tick()
    assert seen == [True]
    results = {d.task: d.jobs[0].result for d in fired}
    assert (results[tasks[3].name].created, results[tasks[3].name].job_id) == (False, existing.pk)
    assert sum(result.created for result in results.values()) == COUNT - 1
    assert Job.objects.count() == COUNT
    # The streamed round let go of each input as its row was made, and wrote nothing: the
    # round was planned again, its task functions called again, and written once planned.
    assert calls == [OCCURRENCE, OCCURRENCE]
    events = [getattr(r, "event", "") for r in caplog.records]
    assert events.count("jobs.scheduler.replanned") == 1
    assert all(value == data for value in Job.objects.values_list("input", flat=True))
    record = Occurrence.objects.get(task=tasks[3].name)
    assert record.jobs == [{"job": "demo.ping", "key": key, "created": False}]
    assert Occurrence.objects.count() == COUNT


@pytest.mark.parametrize("stream", [True, False])
def test_round__a_watermark_moved_meanwhile_writes_nothing_and_names_its_task(
    stream: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if not stream:
        monkeypatch.setattr(scheduler_module, "STREAM_FROM", 10**9)
    tasks = make_tasks(COUNT)
    scheduler = _armed(tasks, FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    before = _written()
    load = scheduler.state.load

    def load_then_another_node_fires(names: Any = None) -> Any:
        states = load(names)
        Task.objects.filter(name=tasks[-1].name).update(last_fired_at=OCCURRENCE)
        return states

    monkeypatch.setattr(scheduler.state, "load", load_then_another_node_fires)
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs"):
        assert scheduler.tick() == []
    assert seen == [stream]
    [moved] = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.watermark-moved"
    ]
    assert moved.fields["task"] == tasks[-1].name  # type: ignore[attr-defined]
    jobs, records, watermarks = _written()
    assert (jobs, records) == (before[0], before[1]) == (set(), set())
    assert watermarks == {**before[2], tasks[-1].name: OCCURRENCE}
    assert not _planners()


def _planners() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ultimat3-rows-ahead"]


#: Where a refused value is put in each of a round's two COPYs: a job's queue, or its
#: occurrence record's node, each past its column's length.
POISONED = {
    "a job": (postgres_store, "scheduled_row", QUEUE),
    "a record": (postgres_store.history, "fired_copy_row", 8),  # ``COPY_OCCURRENCES``' node
}


@pytest.mark.parametrize("row", list(POISONED))
def test_streamed_round__a_row_the_database_refuses_writes_nothing_and_the_next_round_fires_all(
    row: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The jobs' COPY has no savepoint: a refused row, in either COPY, must still roll the whole
    # round back, watermarks included, and leave the connection usable for the next round.
    tasks = make_tasks(COUNT)
    scheduler = _armed(tasks, FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    poisoned = tasks[COUNT // 2].name
    module, name, at = POISONED[row]
    made = getattr(module, name)

    def poison(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        values = made(*args, **kwargs)
        if kwargs.get("task", args[0]) != poisoned:
            return values
        return (*values[:at], "x" * 1000, *values[at + 1 :])

    with monkeypatch.context() as patch:
        patch.setattr(module, name, poison)
        with pytest.raises(psycopg.errors.DataError):  # COPY's own, as psycopg raises it
            scheduler.tick()
    assert seen == [True]
    armed = OCCURRENCE - ONE_MS
    assert (Job.objects.count(), Occurrence.objects.count()) == (0, 0)
    assert set(Task.objects.values_list("last_fired_at", flat=True)) == {armed}
    fired = scheduler.tick()
    assert sorted(d.task for d in fired) == sorted(t.name for t in tasks)
    assert Job.objects.count() == Occurrence.objects.count() == COUNT


def test_streamed_round__lost_leadership_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class DeposedAfterArming(SoleLeader):
        fences = 0

        def fence(self, using: str) -> bool:
            self.fences += 1
            return self.fences == 1

    tasks = make_tasks(COUNT)
    scheduler = _armed(tasks, FrozenClock(T0), leader=DeposedAfterArming())
    seen = _streams(scheduler, monkeypatch)
    assert scheduler.tick() == []
    assert seen == [True]
    assert not Job.objects.exists()
    assert not scheduler.is_leader


def test_streamed_round__a_stop_keeps_the_tasks_not_reached_for_the_next_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = make_tasks(COUNT)
    clock = FrozenClock(T0)
    scheduler = _armed(tasks, clock)
    seen = _streams(scheduler, monkeypatch)
    stopping_task = tasks[9]
    entries = stopping_task.func

    def stop_then_entries(occurrence: datetime) -> Any:
        scheduler.life.status = "draining"  # What a SIGTERM does, between two task functions.
        return entries(occurrence)

    stopping_task.func = stop_then_entries
    fired = scheduler.tick()
    assert seen == [True]
    reached = {d.task for d in fired}
    assert reached == {t.name for t in tasks[:10]}
    watermarks = dict(Task.objects.values_list("name", "last_fired_at"))
    assert {watermarks[t.name] for t in tasks[10:]} == {OCCURRENCE - ONE_MS}
    assert Job.objects.count() == 10
    scheduler.life.status = "running"
    stopping_task.func = entries
    clock.advance(1)
    assert {d.task for d in scheduler.tick()} == {t.name for t in tasks[10:]}
    assert Job.objects.count() == COUNT
    assert Occurrence.objects.filter(outcome="fired").count() == COUNT


def test_streamed_round__task_functions_run_outside_the_round_on_a_connection_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ping = demo_ping()
    seen_by_function: list[tuple[bool, int]] = []

    def entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        # Its own connection, in autocommit: the round's transaction and its locks are apart.
        from django.db import connection as its_connection

        jobs = Job.objects.filter(occurrence=occurrence).count()
        seen_by_function.append((its_connection.in_atomic_block, jobs))
        return [(ping, {"label": occurrence.isoformat()})]

    tasks = make_tasks(COUNT)
    tasks[0].func = entries
    scheduler = _armed(tasks, FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    backends = _backends()
    fired = scheduler.tick()
    assert seen == [True]
    assert len(fired) == COUNT
    # Not inside the round, and not seeing its uncommitted jobs.
    assert seen_by_function[-1] == (False, 0)
    assert not _planners()
    # The function's connection was closed with its thread.
    assert _backends() == backends


def test_streamed_round__not_inside_a_callers_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import transaction

    scheduler = _armed(make_tasks(COUNT), FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    with transaction.atomic():
        fired = scheduler.tick()
    assert seen == [False]
    assert len(fired) == COUNT


def test_streamed_round__not_with_overlap_skip_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = make_tasks(COUNT) + make_tasks(1, prefix="skip", overlap="skip")
    scheduler = _armed(tasks, FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    assert len(scheduler.tick()) == COUNT + 1
    assert seen == [False]


def test_streamed_round__an_occurrence_a_backfill_enqueued_before_it_gets_nothing_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ultimat3_jobs import backfill, clock

    tasks = make_tasks(COUNT, prefix="sb")
    frozen = FrozenClock(T0)
    scheduler = _armed(tasks, frozen)
    streamed = _streams(scheduler, monkeypatch)
    # The first task's occurrence, backfilled by an older release whose payload was another.
    ping = demo_ping()
    older = TaskHandle(
        lambda occurrence: [(ping, {"label": "older release"})],
        name=tasks[0].name,
        schedule=tasks[0].schedule,
        zone=tasks[0].zone,
        catch_up="skip",
        max_catch_up=10,
    )
    with clock.use(frozen):
        done = backfill.run(older, OCCURRENCE, OCCURRENCE, user="ops", via="test")
    assert done.created == 1

    report = scheduler.tick()

    assert streamed == [True]
    assert len(report) == COUNT
    assert report[0].jobs == []
    assert all(len(d.jobs) == 1 and d.jobs[0].result.created for d in report[1:])
    labels = dict(Job.objects.filter(task=tasks[0].name).values_list("key", "input"))
    assert list(labels.values()) == [{"label": "older release"}]
    assert Job.objects.count() == COUNT
    assert set(Task.objects.values_list("last_fired_at", flat=True)) == {
        OCCURRENCE + timedelta(milliseconds=200)
    }


def _ticked_within(scheduler: Scheduler, seconds: float) -> scheduler_module.Report:
    """``scheduler.tick()``, failing the test rather than hanging it when the round does not end
    in ``seconds``: the statements still waiting in this database are then cancelled."""
    done: list[scheduler_module.Report] = []

    def tick() -> None:
        try:
            done.append(scheduler.tick())
        finally:
            connections.close_all()  # This thread's own.

    ticking = threading.Thread(target=tick, daemon=True)
    ticking.start()
    ticking.join(seconds)
    if ticking.is_alive():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ticking.join(10)
        pytest.fail(f"the round did not end in {seconds} s")
    assert done, "the round raised"
    return done[0]


def _round_lock_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        getattr(r, "fields", {})
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.scheduler.lock-wait-cancelled"
    ]


def test_streamed_round__a_task_function_waiting_on_the_rounds_own_lock_fails_not_hangs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = make_tasks(COUNT)
    touchy, working = tasks[7], tasks[7].func

    def touches_a_due_task(occurrence: datetime) -> list[Any]:
        # The round holds every due task's row until it commits.
        Task.objects.filter(name=tasks[0].name).update(paused_note="touched")
        return list(working(occurrence))

    touchy.func = touches_a_due_task
    clock = FrozenClock(T0)
    scheduler = _armed(tasks, clock)
    seen = _streams(scheduler, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs"):
        fired = _ticked_within(scheduler, 30)
    assert seen == [True]
    assert len(fired) == COUNT - 1
    assert touchy.name not in {d.task for d in fired}
    assert not Task.objects.filter(paused_note="touched").exists()  # Its UPDATE was cancelled.
    watermarks = dict(Task.objects.values_list("name", "last_fired_at"))
    assert watermarks.pop(touchy.name) == OCCURRENCE - ONE_MS
    assert set(watermarks.values()) == {clock()}
    [cancelled] = _round_lock_events(caplog)
    assert cancelled["task"] == touchy.name
    assert cancelled["code"] == "jobs.task.waits-on-round"
    assert "Task or Lease rows" in cancelled["fix"]
    [failed] = [
        getattr(r, "fields", {})
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.scheduler.task-failed"
    ]
    assert (failed["task"], failed["code"]) == (touchy.name, "jobs.task.waits-on-round")
    assert "canceling statement" in failed["cause"]
    # Mended, it fires that occurrence next round.
    touchy.func = working
    clock.advance(1)
    [again] = _ticked_within(scheduler, 30)
    assert (again.task, again.occurrence) == (touchy.name, OCCURRENCE)
    assert Job.objects.count() == COUNT


def test_streamed_round__a_task_function_waiting_on_another_sessions_lock_is_left_to_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ultimat3_jobs.db import AHEAD_WAIT_CHECK, dedicated_connection
    from ultimat3_jobs.models import Lease

    Lease.objects.create(name="elsewhere", expires_at=T0)
    tasks = make_tasks(COUNT)
    patient, working = tasks[7], tasks[7].func
    waited: list[float] = []

    def waits_for_a_lock_held_elsewhere(occurrence: datetime) -> list[Any]:
        start = time.monotonic()
        Lease.objects.filter(name="elsewhere").update(owner="patient")
        waited.append(time.monotonic() - start)
        return list(working(occurrence))

    patient.func = waits_for_a_lock_held_elsewhere
    scheduler = _armed(tasks, FrozenClock(T0))
    seen = _streams(scheduler, monkeypatch)
    holder = dedicated_connection("default", "test lock holder")
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM ultimat3_jobs_lease WHERE name = 'elsewhere' FOR UPDATE")
    # Held for several of the round's checks, then let go.
    release = threading.Timer(4 * AHEAD_WAIT_CHECK, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        with caplog.at_level(logging.WARNING, logger="ultimat3_jobs"):
            fired = _ticked_within(scheduler, 30)
    finally:
        release.join()
        holder.close()
    assert seen == [True]
    assert len(fired) == COUNT
    assert waited[-1] >= 3 * AHEAD_WAIT_CHECK  # The round's; the first, the sync's.
    assert Lease.objects.get(name="elsewhere").owner == "patient"
    assert _round_lock_events(caplog) == []
