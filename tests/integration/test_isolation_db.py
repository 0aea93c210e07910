"""One broken task never stops the others; bad input is refused with a code and writes nothing.

Rounds run on the real database (``DatabaseState``); the PostgreSQL-only ones are those where
SQLite would accept what PostgreSQL refuses.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from ultimat3_jobs import UltimateError, job, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.cron import parse
from ultimat3_jobs.errors import InvalidJobInputError, InvalidJobKeyError, InvalidRunAtError
from ultimat3_jobs.handles import JobHandle, TaskHandle
from ultimat3_jobs.inputs import INT_LIMIT, KEY_LIMIT, MAX_INPUT_BYTES, MAX_INPUT_DEPTH
from ultimat3_jobs.models import Job, Occurrence, Task
from ultimat3_jobs.registry import Registry
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.store import enqueue as store_enqueue
from ultimat3_jobs.zones import resolve_zone

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_registry")]

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
MINUTE = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)


def _scheduler(tasks: list[TaskHandle], clock: FrozenClock) -> Scheduler:
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    return Scheduler(state=state, clock=clock, tasks=tasks, drain_on_shutdown=False)


def _failures(caplog: pytest.LogCaptureFixture) -> dict[str, dict[str, Any]]:
    return {
        r.fields["task"]: r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.scheduler.task-failed"
    }


def _tick_at(scheduler: Scheduler, clock: FrozenClock, at: datetime) -> set[str]:
    clock.set(at)
    return {fired.task for fired in scheduler.tick()}


# -- item 1: whatever is task-specific in a round fails for that task alone --------------------


def test_round__a_task_whose_keys_or_input_fail_fails_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = {"on": True}

    @job(name="iso.fine", key="fine:{label}")
    def fine(label: str) -> None: ...

    def raising_key(data: dict[str, Any]) -> str:
        if broken["on"]:
            raise RuntimeError("the key service is down")
        return f"k:{data['n']}"

    @job(name="iso.callable_key", key=raising_key)
    def callable_key(n: int) -> None: ...

    @job(name="iso.missing_field", key="m:{day}")
    def missing_field(**options: Any) -> None: ...

    @job(name="iso.bad_spec", key="s:{n:03d}")
    def bad_spec(n: object) -> None: ...

    @job(name="iso.plain")
    def plain(text: str) -> None: ...

    entries: dict[str, list[tuple[JobHandle, dict[str, Any]]]] = {
        "iso.a_fine": [(fine, {"label": "x"})],
        "iso.b_key_raises": [(callable_key, {"n": 1})],
        "iso.c_field_missing": [(missing_field, {})],
        "iso.d_spec_does_not_fit": [(bad_spec, {"n": "text"})],
        "iso.e_nul_in_input": [(plain, {"text": "a\x00b"})],
        "iso.f_surrogate_in_input": [(plain, {"text": "\ud800"})],
        "iso.g_input_too_large": [(plain, {"text": "x" * (MAX_INPUT_BYTES + 1)})],
        "iso.h_fine_too": [(fine, {"label": "y"})],
    }

    def declare(name: str) -> TaskHandle:
        def produce(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
            return entries[name]

        return task(cron="* * * * *", tz="UTC", name=name)(produce)

    handles = [declare(name) for name in entries]
    clock = FrozenClock(T0)
    scheduler = _scheduler(handles, clock)
    scheduler.tick()  # arms every task

    with caplog.at_level(logging.ERROR, logger="ultimat3_jobs.scheduler"):
        fired = _tick_at(scheduler, clock, MINUTE + timedelta(milliseconds=200))

    assert fired == {"iso.a_fine", "iso.h_fine_too"}
    assert set(Job.objects.values_list("key", flat=True)) == {
        f"iso.a_fine:{int(MINUTE.timestamp() * 1000)}:fine:x",
        f"iso.h_fine_too:{int(MINUTE.timestamp() * 1000)}:fine:y",
    }
    failed = _failures(caplog)
    assert set(failed) == set(entries) - fired
    codes = {name: fields["code"] for name, fields in failed.items()}
    assert codes == {
        "iso.b_key_raises": "jobs.job.key-invalid",
        "iso.c_field_missing": "jobs.job.key-invalid",
        "iso.d_spec_does_not_fit": "jobs.job.key-invalid",
        "iso.e_nul_in_input": "jobs.job.input-invalid",
        "iso.f_surrogate_in_input": "jobs.job.input-invalid",
        "iso.g_input_too_large": "jobs.job.input-invalid",
    }
    assert all(fields["fix"] for fields in failed.values())
    assert "the key service is down" in failed["iso.b_key_raises"]["error"]
    # The failed occurrence is not passed: the watermark stops just before it.
    watermark = Task.objects.get(name="iso.b_key_raises").last_fired_at
    assert watermark == MINUTE - timedelta(milliseconds=1)

    # Fixed: the occurrence it failed is dispatched by the next round, nothing else is repeated.
    broken["on"] = False
    again = _tick_at(scheduler, clock, MINUTE + timedelta(milliseconds=400))
    assert "iso.b_key_raises" in again
    assert not again & {"iso.a_fine", "iso.h_fine_too"}
    assert Job.objects.filter(name="iso.callable_key", occurrence=MINUTE).count() == 1


def test_round__over_long_keys_are_hashed_to_fit_repeats_included() -> None:
    @job(name="iso.long", key="long:{n}")
    def long(n: str) -> None: ...

    part = "n" * (KEY_LIMIT - len("long:"))

    def produce(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        return [(long, {"n": part}), (long, {"n": part}), (long, {"n": part})]

    handle = task(cron="* * * * *", tz="UTC", name="t" * 200)(produce)
    clock = FrozenClock(T0)
    scheduler = _scheduler([handle], clock)
    scheduler.tick()
    assert _tick_at(scheduler, clock, MINUTE) == {handle.name}
    keys = list(Job.objects.values_list("key", flat=True))
    assert len(set(keys)) == 3
    assert max(len(key) for key in keys) <= KEY_LIMIT


def test_round__a_job_handle_built_without_job_is_held_to_the_columns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def work() -> None: ...

    oversized = JobHandle(work, name="j" * 300, key=None, max_attempts=None, queue="q" * 101)

    @job(name="iso.ok")
    def ok() -> None: ...

    def bad_entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        return [(oversized, {})]

    def good_entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        return [(ok, {})]

    handles = [
        task(cron="* * * * *", tz="UTC", name="iso.oversized")(bad_entries),
        task(cron="* * * * *", tz="UTC", name="iso.ok_task")(good_entries),
    ]
    clock = FrozenClock(T0)
    scheduler = _scheduler(handles, clock)
    scheduler.tick()
    with caplog.at_level(logging.ERROR, logger="ultimat3_jobs.scheduler"):
        assert _tick_at(scheduler, clock, MINUTE) == {"iso.ok_task"}
    assert _failures(caplog)["iso.oversized"]["code"] == "jobs.declaration-invalid"
    assert list(Job.objects.values_list("name", flat=True)) == ["iso.ok"]


# -- item 2: a declaration the database refuses is isolated too (PostgreSQL checks lengths) ------


def _raw_task(name: str, *, max_catch_up: int = 10) -> TaskHandle:
    """A task built without ``@task``, as a plugin or an older declaration might reach sync."""

    def produce(occurrence: datetime) -> list[Any]:
        return []

    return TaskHandle(
        produce,
        name=name,
        schedule=parse("* * * * *"),
        zone=resolve_zone("UTC", name),
        catch_up="skip",
        max_catch_up=max_catch_up,
    )


@pytest.mark.postgres
def test_sync__a_declaration_the_database_refuses_leaves_the_others_dispatching(
    caplog: pytest.LogCaptureFixture,
) -> None:
    too_long = _raw_task("x" * 300)
    too_big = _raw_task("iso.too_big", max_catch_up=INT_LIMIT + 1)
    good = [_raw_task(f"iso.good_{n}") for n in range(3)]
    clock = FrozenClock(T0)
    scheduler = _scheduler([too_long, *good, too_big], clock)

    with caplog.at_level(logging.ERROR, logger="ultimat3_jobs.scheduler"):
        scheduler.tick()
        fired = _tick_at(scheduler, clock, MINUTE)

    assert fired == {handle.name for handle in good}
    assert set(Task.objects.values_list("name", flat=True)) == fired
    failed = _failures(caplog)
    assert set(failed) == {too_long.name, too_big.name}
    assert {fields["code"] for fields in failed.values()} == {"jobs.task.sync-failed"}
    assert "200 characters" in failed[too_big.name]["fix"]


# -- item 3: 1,000 tasks from one factory, dispatched in one round --------------------------------


@pytest.mark.postgres
def test_round__a_thousand_tasks_from_one_factory_all_dispatch(fresh_registry: Registry) -> None:
    @job(name="iso.region_sync", key="region:{region}")
    def region_sync(region: str) -> None: ...

    def declare(region: str) -> TaskHandle:
        @task(cron="* * * * *", tz="UTC", name=f"regions.{region}")
        def sync(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
            return [(region_sync, {"region": region})]

        return sync

    handles = [declare(f"r{n:04d}") for n in range(1000)]
    assert {t.name for t in fresh_registry.tasks()} >= {h.name for h in handles}
    clock = FrozenClock(T0)
    scheduler = Scheduler(
        state=DatabaseState(node_id="node-a", leader="sole", clock=clock),
        clock=clock,
        drain_on_shutdown=False,
    )  # the registry's own tasks: the factory's thousand among them
    scheduler.tick()
    fired = _tick_at(scheduler, clock, MINUTE)
    assert fired >= {h.name for h in handles}
    assert Job.objects.filter(name="iso.region_sync").count() == 1000
    assert Occurrence.objects.filter(outcome="fired", task__startswith="regions.").count() == 1000


# -- item 5: enqueue refuses with a code and a fix, and writes nothing ---------------------------


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("call", "error", "needle"),
    [
        (lambda j: j.enqueue({"text": "x"}, key="k" * (KEY_LIMIT + 1)), InvalidJobKeyError, "over"),
        (lambda j: j.enqueue({"text": "x"}, key="a\x00b"), InvalidJobKeyError, "NUL"),
        (lambda j: j.enqueue({"text": "x"}, key="\udc80"), InvalidJobKeyError, "surrogate"),
        (lambda j: j.enqueue({"text": "x"}, key=5), InvalidJobKeyError, "not a str"),
        (lambda j: j.enqueue({"text": "x"}, key=""), InvalidJobKeyError, "is empty"),
        (lambda j: j.enqueue({"text": "a\x00b"}), InvalidJobInputError, "NUL"),
        (lambda j: j.enqueue({"text": "\ud800"}), InvalidJobInputError, "surrogate"),
        (lambda j: j.enqueue({"\ud800": 1}), InvalidJobInputError, "surrogate"),
        (lambda j: j.enqueue({"text": _deep(5000)}), InvalidJobInputError, "nests deeper"),
        (
            lambda j: j.enqueue({"text": _deep(MAX_INPUT_DEPTH + 1)}),
            InvalidJobInputError,
            "nests deeper",
        ),
        (lambda j: j.enqueue({"text": "x"}, run_at=5), InvalidRunAtError, "not a datetime"),
        (
            lambda j: j.enqueue({"text": "x"}, run_at=datetime(2026, 6, 1, 12, 0)),
            InvalidRunAtError,
            "no timezone",
        ),
        (
            # Year 0 in UTC: the database would keep it BC, and no worker could read it back.
            lambda j: j.enqueue(
                {"text": "x"}, run_at=datetime.min.replace(tzinfo=ZoneInfo("Europe/Paris"))
            ),
            InvalidRunAtError,
            "before year 1",
        ),
        (lambda j: j.enqueue({"text": "x"}, queue="q" * 101), UltimateError, "over 100"),
    ],
    ids=[
        "key_long",
        "key_nul",
        "key_surrogate",
        "key_int",
        "key_empty",
        "input_nul",
        "input_surrogate",
        "input_key_surrogate",
        "input_5000_deep",
        "input_too_deep",
        "run_at_int",
        "run_at_naive",
        "run_at_before_year_1_in_utc",
        "queue_long",
    ],
)
def test_enqueue__bad_input_is_refused_with_a_code_and_writes_nothing(
    call: Any, error: type[UltimateError], needle: str
) -> None:
    @job(name="iso.target")
    def target(text: Any) -> None: ...

    with pytest.raises(error) as caught:
        call(target)

    assert caught.value.code.startswith("jobs.")
    assert caught.value.fix
    assert needle in caught.value.message
    assert not Job.objects.exists()


def test_enqueue__a_declared_key_that_cannot_be_built_is_refused_and_writes_nothing() -> None:
    @job(name="iso.keyed", key=lambda data: str(1 / 0))
    def keyed(n: int) -> None: ...

    @job(name="iso.too_long_key", key="{n}")
    def too_long_key(n: str) -> None: ...

    with pytest.raises(InvalidJobKeyError) as raised:
        keyed.enqueue({"n": 1})
    with pytest.raises(InvalidJobKeyError) as long:
        too_long_key.enqueue({"n": "n" * (KEY_LIMIT + 1)})

    assert "ZeroDivisionError" in raised.value.message
    assert "over the 255" in long.value.message
    assert not Job.objects.exists()


def test_enqueue__the_store_itself_refuses_what_the_table_cannot_hold() -> None:
    @job(name="iso.direct")
    def direct() -> None: ...

    with pytest.raises(InvalidJobKeyError):
        store_enqueue(direct, {}, key="k" * (KEY_LIMIT + 1))
    with pytest.raises(InvalidRunAtError):
        store_enqueue(direct, {}, key="k", run_at="tomorrow")  # type: ignore[arg-type]
    assert not Job.objects.exists()


def test_enqueue__good_values_at_the_limits_are_written() -> None:
    @job(name="iso.limits")
    def limits(text: Any) -> None: ...

    result = limits.enqueue(
        {"text": _deep(MAX_INPUT_DEPTH - 2)},  # 100 levels in all
        key="k" * KEY_LIMIT,
        run_at=datetime(2026, 6, 1, 12, 0, tzinfo=UTC),
        queue="q" * 100,
    )
    assert result.created
    assert Job.objects.get().key == "k" * KEY_LIMIT


def test_round__a_task_whose_schedule_raises_fails_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handles = [_raw_task(f"iso.sched_{n}") for n in range(3)]
    clock = FrozenClock(T0)

    def resolver(handle: TaskHandle, after: datetime) -> datetime:
        if handle.name == "iso.sched_1" and after >= T0:
            raise OverflowError("the schedule ran off the calendar")
        return handle.next_runs(1, after)[0]

    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state, clock=clock, tasks=handles, resolver=resolver, drain_on_shutdown=False
    )
    with caplog.at_level(logging.ERROR, logger="ultimat3_jobs.scheduler"):
        scheduler.tick()
        fired = _tick_at(scheduler, clock, MINUTE)

    assert fired == {"iso.sched_0", "iso.sched_2"}
    failed = _failures(caplog)
    assert set(failed) == {"iso.sched_1"}
    assert "the schedule ran off the calendar" in failed["iso.sched_1"]["error"]
    assert failed["iso.sched_1"]["occurrence"] is None
