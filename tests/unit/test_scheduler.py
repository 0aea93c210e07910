"""The round logic with a frozen clock and in-memory state: no database, no timer."""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ultimat3_jobs import Entry, job, logs, shutdown, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.cron import DstGap, DstRepeat
from ultimat3_jobs.handles import CatchUp, TaskHandle
from ultimat3_jobs.planner import occurrence_key
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.store import TaskState
from ultimat3_jobs.testing import MemoryState

pytestmark = pytest.mark.usefixtures("fresh_registry")

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)


@job(name="unit.record")
def record(label: str) -> None: ...


def hourly(name: str, catch_up: CatchUp = "skip", max_catch_up: int = 10) -> TaskHandle:
    def entries(occurrence: datetime) -> list[Entry]:
        return [(record, {"label": occurrence.isoformat()})]

    entries.__qualname__ = f"hourly_{name}"
    return task(
        cron="0 * * * *", tz="UTC", name=name, catch_up=catch_up, max_catch_up=max_catch_up
    )(entries)


def build(*tasks: TaskHandle, **options: Any) -> tuple[Scheduler, MemoryState, FrozenClock]:
    state = MemoryState()
    clock = FrozenClock(T0)
    scheduler = Scheduler(
        state=state, clock=clock, tasks=list(tasks), drain_on_shutdown=False, **options
    )
    state.sync(list(tasks))
    return scheduler, state, clock


def test_tick__first_sight_arms_and_fires_nothing() -> None:
    handle = hourly("t.arm")
    scheduler, state, _ = build(handle)
    assert scheduler.tick() == []
    assert state.tasks["t.arm"].watermark == datetime(2026, 6, 1, 1, tzinfo=UTC) - timedelta(
        milliseconds=1
    )
    assert state.jobs == {}


def test_tick__fires_an_occurrence_on_time_with_its_occurrence_key() -> None:
    handle = hourly("t.on-time")
    scheduler, _, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 0, 400_000, tzinfo=UTC))
    [fired] = scheduler.tick()
    assert fired.task == "t.on-time"
    assert fired.occurrence == datetime(2026, 6, 1, 1, tzinfo=UTC)
    assert not fired.catch_up
    [result] = fired.jobs
    assert result.result.created
    assert result.result.key.startswith("t.on-time:1780275600000:unit.record:")
    assert scheduler.tick() == []  # dealt with: never again


def test_tick__reports_what_fired_as_a_sequence_equal_to_its_list() -> None:
    scheduler, _, clock = build(hourly("t.report-a"), hourly("t.report-b"))
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    report = scheduler.tick()
    fired = list(report)
    assert [d.task for d in fired] == ["t.report-a", "t.report-b"]
    assert len(report) == 2
    assert report == fired and fired == report and report == tuple(fired)
    assert report[1] == fired[1] and report[-1] == fired[1]
    assert report[:1] == [fired[0]]
    assert report != fired[:1] and report != [fired[1], fired[0]]
    assert repr(report) == repr(fired)
    assert report[0].jobs[0].result.created


def test_tick__nothing_due_touches_no_task() -> None:
    handle = hourly("t.idle")
    scheduler, state, clock = build(handle)
    scheduler.tick()
    loads = []
    original = state.load

    def load(names: Sequence[str] | None = None) -> dict[str, TaskState]:
        loads.append(names)
        return original(names)

    state.load = load  # type: ignore[method-assign]
    clock.advance(600)
    assert scheduler.tick() == []
    assert loads == []
    assert state.commits == 1  # only the arming round wrote


def test_skip__fires_on_time_occurrences_and_drops_missed_ones() -> None:
    handle = hourly("t.skip")
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 5, 0, 20, tzinfo=UTC))  # down from 01:00 to 05:00
    fired = scheduler.tick()
    assert [d.occurrence.hour for d in fired] == [5]
    dropped = [r for r in state.records if r["outcome"] == "dropped"]
    assert [(r["span"].first.hour, r["span"].last.hour, r["span"].count) for r in dropped] == [
        (1, 4, 4)
    ]


def test_skip__late_beyond_grace_fires_nothing() -> None:
    handle = hourly("t.skip-late")
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 1, 1, tzinfo=UTC))  # 61 s late, grace is 60 s
    assert scheduler.tick() == []
    assert state.tasks["t.skip-late"].watermark == datetime(2026, 6, 1, 1, 1, 1, tzinfo=UTC)


def test_run_once__long_outage_fires_one_and_drops_the_rest_in_the_same_round() -> None:
    handle = hourly("t.once", catch_up="run-once")
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 2, 0, 30, tzinfo=UTC))  # 24 occurrences missed
    [fired] = scheduler.tick()
    assert fired.occurrence == datetime(2026, 6, 1, 1, tzinfo=UTC)  # the earliest
    assert fired.catch_up
    assert state.tasks["t.once"].watermark == clock()
    clock.advance(1)
    assert scheduler.tick() == []  # never one per round
    [dropped] = [r for r in state.records if r["outcome"] == "dropped"]
    assert dropped["span"].count == 23
    assert len(state.jobs) == 1


def test_run_once__while_its_occurrence_is_held_the_drop_after_it_is_not_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = [True, True]

    def flaky(occurrence: datetime) -> list[Entry]:
        if failing and failing.pop():
            raise RuntimeError("not yet")
        return [(record, {"label": occurrence.isoformat()})]

    handle = task(cron="0 * * * *", tz="UTC", name="t.once-flaky", catch_up="run-once")(flaky)
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 4, 0, 10, tzinfo=UTC))  # 01:00 .. 04:00 due
    with caplog.at_level(logging.INFO, logger="ultimat3_jobs"):
        assert scheduler.tick() == []
        clock.advance(1)
        assert scheduler.tick() == []
        assert [r for r in state.records if r["outcome"] == "dropped"] == []
        clock.advance(1)
        [fired] = scheduler.tick()
        clock.advance(1)
        assert scheduler.tick() == []

    assert fired.occurrence == datetime(2026, 6, 1, 1, tzinfo=UTC)
    [dropped] = [r for r in state.records if r["outcome"] == "dropped"]
    assert (dropped["span"].first.hour, dropped["span"].count) == (2, 3)
    logged = [r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.dropped"]
    assert len(logged) == 1


def test_run_all__fires_the_most_recent_max_catch_up_in_order() -> None:
    handle = hourly("t.all", catch_up="run-all", max_catch_up=10)
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 2, 0, 0, 5, tzinfo=UTC))  # 01:00 .. 00:00 next day = 24 due
    fired = scheduler.tick()
    assert [d.occurrence for d in fired] == [
        datetime(2026, 6, 1, 15, tzinfo=UTC) + timedelta(hours=i) for i in range(10)
    ]
    assert all(d.catch_up for d in fired[:-1]) and not fired[-1].catch_up  # the last is on time
    [dropped] = [r for r in state.records if r["outcome"] == "dropped"]
    assert (dropped["span"].first.hour, dropped["span"].last.hour, dropped["span"].count) == (
        1,
        14,
        14,
    )
    clock.advance(1)
    assert scheduler.tick() == []


def test_run_all__per_second_task_after_a_day_fires_only_the_latest() -> None:
    def entries(occurrence: datetime) -> list[Entry]:
        return [(record, {"label": occurrence.isoformat()})]

    handle = task(cron="* * * * * *", tz="UTC", name="t.sec", catch_up="run-all", max_catch_up=3)(
        entries
    )
    scheduler, _, clock = build(handle)
    scheduler.tick()
    clock.advance(timedelta(days=1))
    fired = scheduler.tick()
    assert [d.occurrence for d in fired] == [
        clock().replace(microsecond=0) - timedelta(seconds=s) for s in (2, 1, 0)
    ]


def test_tick__a_failing_task_does_not_stop_the_others_and_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = {"n": 0}

    def flaky(occurrence: datetime) -> list[Entry]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database of digests is down")
        return [(record, {"label": "flaky"})]

    failing = task(cron="0 * * * *", tz="UTC", name="t.flaky")(flaky)
    healthy = hourly("t.healthy")
    scheduler, _, clock = build(failing, healthy)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    with caplog.at_level(logging.ERROR, logger="ultimat3_jobs"):
        first = scheduler.tick()
    assert [d.task for d in first] == ["t.healthy"]
    [failure] = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.scheduler.task-failed"
    ]
    assert failure.fields["code"] == "jobs.task.entries-failed"  # type: ignore[attr-defined]
    assert failure.fields["fix"]  # type: ignore[attr-defined]
    clock.advance(1)
    second = scheduler.tick()
    assert [(d.task, d.occurrence.hour) for d in second] == [("t.flaky", 1)]


def test_tick__concurrent_calls_join_one_round() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(occurrence: datetime) -> list[Entry]:
        entered.set()
        release.wait(5)
        return [(record, {"label": "slow"})]

    handle = task(cron="0 * * * *", tz="UTC", name="t.slow")(slow)
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    results: list[object] = []
    first = threading.Thread(target=lambda: results.append(scheduler.tick()))
    first.start()
    assert entered.wait(5)
    second = threading.Thread(target=lambda: results.append(scheduler.tick()))
    second.start()
    time.sleep(0.05)
    release.set()
    first.join(5)
    second.join(5)
    assert len(results) == 2 and results[0] is results[1]
    assert state.commits == 2  # arming + ONE dispatch round


def test_stop__between_tasks_stops_now_and_leaves_the_rest_for_later() -> None:
    scheduler_ref: list[Scheduler] = []

    def stopper(occurrence: datetime) -> list[Entry]:
        stopping = threading.Thread(target=scheduler_ref[0].stop, args=("test",))
        stopping.start()
        deadline = time.monotonic() + 5
        while scheduler_ref[0].status != "draining" and time.monotonic() < deadline:
            time.sleep(0.001)
        return [(record, {"label": "a"})]

    first = task(cron="0 * * * *", tz="UTC", name="t.a-first")(stopper)
    second = hourly("t.b-second")
    scheduler, state, clock = build(first, second)
    scheduler_ref.append(scheduler)
    scheduler.tick()
    armed = state.tasks["t.b-second"].watermark
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    fired = scheduler.tick()
    assert [d.task for d in fired] == ["t.a-first"]
    assert state.tasks["t.b-second"].watermark == armed
    assert scheduler.wait(5) and scheduler.status == "stopped"
    assert scheduler.tick() == []  # a stopped scheduler dispatches nothing


def test_start_stop__restartable_with_one_shutdown_hook() -> None:
    handle = hourly("t.restart")
    state = MemoryState()
    scheduler = Scheduler(
        state=state, clock=FrozenClock(T0), tasks=[handle], tick_interval=timedelta(seconds=0.01)
    )
    for _ in range(2):
        scheduler.start()
        assert scheduler.status == "running"
        assert shutdown.registered() == ["jobs.scheduler"]
        scheduler.start()  # only from a standstill: no second hook
        assert shutdown.registered() == ["jobs.scheduler"]
        # Let a round run before stopping: a stop landing first would rightly skip it.
        deadline = time.monotonic() + 5
        while state.commits == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        scheduler.stop("test")
        assert scheduler.status == "stopped"
        assert shutdown.registered() == []
    assert state.tasks["t.restart"].watermark is not None


def run_loop_until(handle: TaskHandle, done: Callable[[MemoryState], bool]) -> MemoryState:
    """The real loop, on real time, with a gap (60 s) far longer than any wait here: only
    waking for an occurrence makes it dispatch before the gap ends."""
    state = MemoryState()
    scheduler = Scheduler(
        state=state, tasks=[handle], tick_interval=timedelta(seconds=60), drain_on_shutdown=False
    )
    scheduler.start()
    try:
        deadline = time.monotonic() + 30
        while not done(state) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.stop("test")
    return state


def test_loop__wakes_for_an_occurrence_due_before_the_gap_ends() -> None:
    def stamp(occurrence: datetime) -> list[Entry]:
        return [(record, {"label": occurrence.isoformat()})]

    handle = task(cron="* * * * * *", tz="UTC", name="t.every-second")(stamp)
    state = run_loop_until(handle, lambda state: bool(state.jobs))
    assert len(state.jobs) >= 1


def test_loop__a_failing_task_waits_out_the_gap_before_its_retry() -> None:
    calls: list[float] = []

    def broken(occurrence: datetime) -> list[Entry]:
        calls.append(time.monotonic())
        raise RuntimeError("always down")

    handle = task(cron="* * * * * *", tz="UTC", name="t.broken")(broken)
    # Half a second past the first call: a loop retrying at once would have called it again.
    run_loop_until(handle, lambda _: bool(calls) and time.monotonic() - calls[0] > 0.5)
    assert len(calls) == 1


def test_loop__rests_at_least_as_long_as_a_slow_round_took() -> None:
    starts: list[float] = []

    def slow(occurrence: datetime) -> list[Entry]:
        starts.append(time.monotonic())
        time.sleep(0.8)  # A round slower than the next occurrence is away.
        return [(record, {"label": occurrence.isoformat()})]

    # run-once: one call a round, however late the round runs.
    handle = task(cron="* * * * * *", tz="UTC", name="t.slow-round", catch_up="run-once")(slow)
    run_loop_until(handle, lambda _: len(starts) >= 3)
    assert len(starts) >= 3
    # 0.8 s of round, then at least 0.8 s of rest: never straight into the next occurrence.
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 1.5 for gap in gaps), gaps


def test_stop__concurrent_stops_join_one_teardown() -> None:
    releases = []

    class CountingLeader:
        name = "counting"
        renew_every: timedelta | None = None

        def acquire(self) -> bool:
            return True

        def fence(self, using: str) -> bool:
            return True

        def release(self) -> None:
            time.sleep(0.05)
            releases.append(1)

    scheduler = Scheduler(
        state=MemoryState(),
        leader=CountingLeader(),
        clock=FrozenClock(T0),
        tasks=[hourly("t.stops")],
        drain_on_shutdown=False,
    )
    scheduler.tick()
    threads = [threading.Thread(target=scheduler.stop, args=(f"s{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert releases == [1]
    assert scheduler.status == "stopped"


class ScriptedLeader:
    name = "scripted"

    def __init__(self, answers: list[bool], fence: bool = True) -> None:
        self.answers = answers
        self.fence_answer = fence
        self.released = 0

    def acquire(self) -> bool:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def fence(self, using: str) -> bool:
        return self.fence_answer

    def release(self) -> None:
        self.released += 1


def test_leadership__lost_is_logged_and_stops_dispatching(caplog: pytest.LogCaptureFixture) -> None:
    leader = ScriptedLeader([True, False])
    handle = hourly("t.lost")
    scheduler, state, clock = build(handle, leader=leader)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs"):
        assert scheduler.tick() == []
    assert "jobs.scheduler.leadership-lost" in [getattr(r, "event", "") for r in caplog.records]
    assert not scheduler.is_leader
    assert state.jobs == {}
    scheduler.stop()
    assert leader.released == 0  # a lease we no longer hold is not ours to hand back


def test_leadership__failed_election_concedes() -> None:
    leader = ScriptedLeader([True, ConnectionError("db gone")])  # type: ignore[list-item]
    scheduler, _, _ = build(hourly("t.concede"), leader=leader)
    scheduler.tick()
    assert scheduler.is_leader
    with pytest.raises(ConnectionError):
        scheduler.tick()
    assert not scheduler.is_leader


def test_leadership__fencing_failure_inside_the_transaction_writes_nothing() -> None:
    leader = ScriptedLeader([True, True], fence=True)
    handle = hourly("t.fenced")
    scheduler, state, clock = build(handle, leader=leader)
    scheduler.tick()
    leader.fence_answer = False
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    assert scheduler.tick() == []
    assert state.jobs == {}
    assert not scheduler.is_leader


def test_pause__occurrences_are_recorded_as_paused_not_fired() -> None:
    handle = hourly("t.paused")
    scheduler, state, clock = build(handle)
    scheduler.tick()
    state.pause("t.paused")
    clock.set(datetime(2026, 6, 1, 3, 0, 1, tzinfo=UTC))
    assert scheduler.tick() == []
    [paused] = [r for r in state.records if r["outcome"] == "paused"]
    assert paused["span"].count == 3
    state.pause("t.paused", False)
    clock.set(datetime(2026, 6, 1, 4, 0, 1, tzinfo=UTC))
    assert [d.occurrence.hour for d in scheduler.tick()] == [4]


def test_occurrence_key__entries_of_one_occurrence_never_share_a_key() -> None:
    def twice(occurrence: datetime) -> list[Entry]:
        return [(record, {"label": "same"}), (record, {"label": "same"}), (record, {"label": "x"})]

    handle = task(cron="0 * * * *", tz="UTC", name="t.twice")(twice)
    scheduler, _, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    [fired] = scheduler.tick()
    keys = [j.result.key for j in fired.jobs]
    assert len(set(keys)) == 3
    assert keys[1] == keys[0] + "#2"
    # The same occurrence computed elsewhere gives the same keys.
    again = occurrence_key("t.twice", fired.occurrence, record.occurrence_part({"label": "x"}))
    assert again == keys[2]


@job(name="unit.report", key="report:{account}")
def report(account: str, part: int) -> None: ...


def test_occurrence_key__a_declared_key_like_a_repeats_is_never_given_twice() -> None:
    # "acme#2" is declared; the second "acme" must not be given it too (nor drop a job).
    def parts(occurrence: datetime) -> list[Entry]:
        return [
            (report, {"account": "acme#2", "part": 1}),
            (report, {"account": "acme", "part": 1}),
            (report, {"account": "acme", "part": 2}),
            (report, {"account": "acme", "part": 3}),
        ]

    handle = task(cron="0 * * * *", tz="UTC", name="t.parts")(parts)
    scheduler, state, clock = build(handle)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    [fired] = scheduler.tick()

    keys = [j.result.key.rsplit(":", 1)[1] for j in fired.jobs]
    assert keys == ["acme#2", "acme", "acme#3", "acme#4"]
    assert all(j.result.created for j in fired.jobs)
    assert len(state.jobs) == 4


def test_tick__a_task_never_synced_gets_its_row_and_is_armed() -> None:
    handle = hourly("t.unsynced")
    state = MemoryState()
    scheduler = Scheduler(
        state=state, clock=FrozenClock(T0), tasks=[handle], drain_on_shutdown=False
    )
    assert scheduler.tick() == []
    assert state.tasks["t.unsynced"].watermark == datetime(2026, 6, 1, 1, tzinfo=UTC) - timedelta(
        milliseconds=1
    )


def _armed_lines(scheduler: Scheduler) -> list[dict[str, Any]]:
    """One round through ``logs.configure("json")``; its ``jobs.scheduler.armed`` lines."""
    root = logging.getLogger("ultimat3_jobs")
    saved = (root.handlers[:], root.level, root.propagate)
    buffer = io.StringIO()
    try:
        logs.configure("json")
        [handler] = root.handlers
        handler.setStream(buffer)  # type: ignore[attr-defined]
        scheduler.tick()
    finally:
        root.handlers[:], root.level, root.propagate = saved
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    return [line for line in lines if line["event"] == "jobs.scheduler.armed"]


@pytest.mark.parametrize("count", [3, 150], ids=["made_at_write", "made_while_committing"])
def test_tick__logs_each_task_armed_in_order_once_committed(count: int) -> None:
    handles = [hourly(f"t.armed-{i:03d}") for i in range(count)]
    scheduler, _, _ = build(*handles)
    armed = _armed_lines(scheduler)
    assert [(line["task"], line["next"]) for line in armed] == [
        (handle.name, "2026-06-01T01:00:00+00:00") for handle in handles
    ]


@pytest.mark.parametrize("count", [3, 150], ids=["made_at_write", "made_while_committing"])
def test_tick__a_round_that_wrote_nothing_logs_no_task_armed(count: int) -> None:
    handles = [hourly(f"t.unarmed-{i:03d}") for i in range(count)]
    scheduler, state, _ = build(*handles, leader=ScriptedLeader([True], fence=False))
    assert _armed_lines(scheduler) == []
    assert all(state.tasks[handle.name].watermark is None for handle in handles)


def test_leadership__a_long_round_renews_between_tasks_and_stops_when_lost() -> None:
    class LeaseLike(ScriptedLeader):
        renew_every = timedelta(milliseconds=20)

    def slow(occurrence: datetime) -> list[Entry]:
        time.sleep(0.05)
        return [(record, {"label": "slow"})]

    def also_slow(occurrence: datetime) -> list[Entry]:
        return slow(occurrence)

    first = task(cron="0 * * * *", tz="UTC", name="t.long-a")(slow)
    second = task(cron="0 * * * *", tz="UTC", name="t.long-b")(also_slow)
    leader = LeaseLike([True, True, False])  # arm round, dispatch round, renewal mid-round
    scheduler, state, clock = build(first, second, leader=leader)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    assert scheduler.tick() == []  # lost between the two tasks: the round writes nothing
    assert leader.answers == []
    assert state.jobs == {}
    assert not scheduler.is_leader


class RenewingLeader(ScriptedLeader):
    renew_every = timedelta(milliseconds=20)


def slow_record(occurrence: datetime) -> list[Entry]:
    time.sleep(0.05)
    return [(record, {"label": occurrence.isoformat()})]


def test_leadership__a_long_catch_up_renews_between_the_occurrences_of_one_task() -> None:
    handle = task(
        cron="0 * * * *", tz="UTC", name="t.long-catch-up", catch_up="run-all", max_catch_up=10
    )(slow_record)
    # Arm round, dispatch round, renewal after its first occurrence: lost to another node.
    leader = RenewingLeader([True, True, False])
    scheduler, state, clock = build(handle, leader=leader)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 3, 0, 1, tzinfo=UTC))  # 01:00, 02:00 and 03:00 due
    assert scheduler.tick() == []
    assert leader.answers == []
    assert state.jobs == {}
    assert not scheduler.is_leader


def test_leadership__a_renewal_that_raises_between_occurrences_fails_the_round_not_the_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handle = task(
        cron="0 * * * *", tz="UTC", name="t.renewal-raises", catch_up="run-all", max_catch_up=10
    )(slow_record)
    leader = RenewingLeader([True, True, ConnectionError("database gone")])  # type: ignore[list-item]
    scheduler, state, clock = build(handle, leader=leader)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 3, 0, 1, tzinfo=UTC))
    with caplog.at_level(logging.WARNING), pytest.raises(ConnectionError, match="database gone"):
        scheduler.tick()
    assert state.jobs == {}
    assert not [r for r in caplog.records if "entries" in getattr(r, "event", "")]


def test_leadership__a_slow_last_task_is_renewed_before_its_round_is_written() -> None:
    handle = task(cron="0 * * * *", tz="UTC", name="t.slow-last")(slow_record)
    leader = RenewingLeader([True, True, True])  # the third: renewed after the function
    scheduler, state, clock = build(handle, leader=leader)
    scheduler.tick()
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    assert [f.occurrence for f in scheduler.tick()] == [datetime(2026, 6, 1, 1, tzinfo=UTC)]
    assert leader.answers == []
    assert len(state.jobs) == 1


def test_resolver__an_injected_schedule_drives_arming_and_firing() -> None:
    handle = hourly("t.resolved")

    def every_five_minutes(_: TaskHandle, at: datetime) -> datetime:
        step = timedelta(minutes=5)
        return T0.replace(second=0) + (int((at - T0.replace(second=0)) / step) + 1) * step

    scheduler, state, clock = build(handle, resolver=every_five_minutes)
    scheduler.tick()  # arms it just before the resolver's next instant, not the cron's 01:00
    assert state.tasks["t.resolved"].watermark == datetime(
        2026, 6, 1, 0, 5, tzinfo=UTC
    ) - timedelta(milliseconds=1)
    clock.set(datetime(2026, 6, 1, 0, 5, 1, tzinfo=UTC))  # the cron says hourly; the resolver wins
    assert [d.occurrence for d in scheduler.tick()] == [datetime(2026, 6, 1, 0, 5, tzinfo=UTC)]


def test_cached_next_occurrence__answers_as_next_occurrence_across_cache_resets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ultimat3_jobs import scheduler as module
    from ultimat3_jobs.cron import next_occurrence, parse
    from ultimat3_jobs.zones import resolve_zone

    monkeypatch.setattr(module, "RESOLVE_CACHE_SIZE", 4)
    resolve = module._cached_next_occurrence()
    tasks = [
        TaskHandle(
            lambda at: [],
            name=name,
            schedule=parse(cron),
            zone=resolve_zone(tz, name),
            catch_up="skip",
            max_catch_up=10,
        )
        for name, cron, tz in [("t.a", "*/5 * * * *", "Europe/Paris"), ("t.b", "0 3 * * *", "UTC")]
    ]
    start = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)  # the night Paris springs forward
    for step in range(12):
        at = start + timedelta(minutes=7 * step)
        for handle in tasks:
            expected = next_occurrence(handle.schedule, handle.zone, at)
            assert resolve(handle, at) == expected
            assert resolve(handle, at) == expected  # answered again, from the cache


def gap_tasks() -> list[TaskHandle]:
    """Two tasks alike but for ``dst_gap``, at 02:30 New York: a slot in the spring gap."""

    def declare(name: str, gap: DstGap) -> TaskHandle:
        def entries(occurrence: datetime) -> list[Entry]:
            return [(record, {"label": occurrence.isoformat()})]

        entries.__qualname__ = f"gap_{gap}"
        return task(cron="30 2 * * *", tz="America/New_York", name=name, dst_gap=gap)(entries)

    return [declare("t.gap-end", "end-of-gap"), declare("t.gap-skip", "skip")]


def test_tick__tasks_differing_only_in_dst_gap_arm_and_fire_apart() -> None:
    # The default resolver caches answers per schedule and zone: the DST options are in its key.
    handles = gap_tasks()
    scheduler, state, clock = build(*handles)
    clock.set(datetime(2026, 3, 8, 0, 0, tzinfo=UTC))
    scheduler.tick()
    assert {name: s.watermark for name, s in state.tasks.items()} == {
        "t.gap-end": datetime(2026, 3, 8, 7, 0, tzinfo=UTC) - timedelta(milliseconds=1),
        "t.gap-skip": datetime(2026, 3, 9, 6, 30, tzinfo=UTC) - timedelta(milliseconds=1),
    }
    clock.set(datetime(2026, 3, 8, 7, 0, 1, tzinfo=UTC))
    fired = scheduler.tick()
    assert [(d.task, d.occurrence) for d in fired] == [
        ("t.gap-end", datetime(2026, 3, 8, 7, 0, tzinfo=UTC))
    ]


def test_tick__tasks_differing_only_in_dst_repeat_share_no_catch_up_decision() -> None:
    # Due in the same round with the same schedule, zone, policy and watermark: only the DST
    # option tells their catch-up decisions apart. 01:30 New York repeats on 2026-11-01.
    def declare(name: str, repeat: DstRepeat) -> TaskHandle:
        def entries(occurrence: datetime) -> list[Entry]:
            return [(record, {"label": occurrence.isoformat()})]

        entries.__qualname__ = f"repeat_{repeat}"
        return task(
            cron="30 1 * * *",
            tz="America/New_York",
            name=name,
            catch_up="run-all",
            dst_repeat=repeat,
        )(entries)

    handles = [declare("t.rep-both", "both"), declare("t.rep-first", "first")]
    scheduler, state, clock = build(*handles)
    for handle in handles:
        state.tasks[handle.name] = TaskState(datetime(2026, 11, 1, 5, 0, tzinfo=UTC))
    clock.set(datetime(2026, 11, 1, 6, 30, 1, tzinfo=UTC))
    fired = scheduler.tick()
    assert sorted((d.task, d.occurrence) for d in fired) == [
        ("t.rep-both", datetime(2026, 11, 1, 5, 30, tzinfo=UTC)),
        ("t.rep-both", datetime(2026, 11, 1, 6, 30, tzinfo=UTC)),
        ("t.rep-first", datetime(2026, 11, 1, 5, 30, tzinfo=UTC)),
    ]


def test_tick__a_rebuild_and_a_round_of_many_tasks_pause_the_collector_and_restore_it() -> None:
    import gc

    from ultimat3_jobs import scheduler as module
    from ultimat3_jobs.cron import parse
    from ultimat3_jobs.zones import resolve_zone

    seen: list[bool] = []

    def entries(occurrence: datetime) -> list[tuple[object, dict[str, str]]]:
        seen.append(gc.isenabled())
        return [(record, {"label": occurrence.isoformat()})]

    def handles(count: int) -> list[TaskHandle]:
        return [
            TaskHandle(
                entries,
                name=f"t.gc{count}-{i:04d}",
                schedule=parse("0 * * * *"),
                zone=resolve_zone("UTC", "t"),
                catch_up="skip",
                max_catch_up=10,
            )
            for i in range(count)
        ]

    for count, paused in ((module.GC_PAUSE_FROM - 1, False), (module.GC_PAUSE_FROM, True)):
        seen.clear()
        scheduler, state, clock = build(*handles(count))
        loaded: list[bool] = []

        def recorded(
            names: Sequence[str] | None = None,
            load: Callable[..., dict[str, TaskState]] = state.load,
            loaded: list[bool] = loaded,
        ) -> dict[str, TaskState]:
            loaded.append(gc.isenabled())  # in the rebuild: every task's watermark
            return load(names)

        state.load = recorded  # type: ignore[method-assign]
        scheduler.tick()  # rebuilds, and arms
        assert loaded == [not paused]
        clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
        assert len(scheduler.tick()) == count
        assert set(seen) == {not paused}
        assert gc.isenabled()


def test_tick__tasks_due_at_one_instant_share_one_heap_entry_and_fire_in_declared_order() -> None:
    names = [f"t.shared-{i}" for i in (3, 1, 2)]
    handles = [hourly(name) for name in names]
    scheduler, _, clock = build(*handles)
    scheduler.tick()  # arms all three at 01:00
    assert scheduler._heap == [datetime(2026, 6, 1, 1, tzinfo=UTC)]
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    assert [d.task for d in scheduler.tick()] == names
    assert scheduler._heap == [datetime(2026, 6, 1, 2, tzinfo=UTC)]


def test_tick__a_task_moved_to_another_instant_is_not_due_at_its_old_one() -> None:
    early, moved = hourly("t.early"), hourly("t.moved")
    scheduler, _, clock = build(early, moved)
    scheduler.tick()
    later = datetime(2026, 6, 1, 1, 30, tzinfo=UTC)
    scheduler._set_due("t.moved", later)  # as a round that reschedules it does
    clock.set(datetime(2026, 6, 1, 1, 0, 1, tzinfo=UTC))
    assert [d.task for d in scheduler.tick()] == ["t.early"]
    assert scheduler._due is not None and scheduler._due["t.moved"] == later
