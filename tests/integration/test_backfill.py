"""Backfill on a real database: the scheduler's keys, one payload per occurrence, the limit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command

from ultimat3_jobs import backfill, clock, job, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.errors import (
    BackfillHistoryPrunedError,
    BackfillPausedError,
    BackfillRangeError,
    BackfillTooLargeError,
    TaskBackendError,
    TaskEntriesError,
    UnknownTaskError,
)
from ultimat3_jobs.handles import Entry, TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job, Occurrence, Task
from ultimat3_jobs.planner import RoundPlan, plan_task
from ultimat3_jobs.retention import prune
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_registry")]

NOW = datetime(2026, 6, 10, 12, 0, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def frozen() -> Iterator[FrozenClock]:
    frozen_clock = FrozenClock(NOW)
    with clock.use(frozen_clock):
        yield frozen_clock


@job(name="bf.report", key="report:{day}")
def report(day: str) -> None: ...


@job(name="bf.note")
def note(at: str) -> None: ...


def daily(name: str = "bf.daily", cron: str = "0 3 * * *", tz: str = "Europe/Paris") -> TaskHandle:
    def entries(occurrence: datetime) -> list[Entry]:
        # The occurrence's own day, never today's: each payload is for its own time.
        return [(report, {"day": occurrence.date().isoformat()})]

    entries.__qualname__ = f"daily_{name}"
    return task(cron=cron, tz=tz, name=name)(entries)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def scheduler_for(handle: TaskHandle, frozen: FrozenClock) -> Scheduler:
    state = DatabaseState(node_id="node-a", leader="sole", clock=frozen)
    return Scheduler(
        state=state, leader=SoleLeader(), clock=frozen, tasks=[handle], drain_on_shutdown=False
    )


def test_run__enqueues_each_occurrence_with_its_own_payload_and_records_it() -> None:
    handle = daily()
    done = backfill.run(
        handle, at("2026-06-01T00:00+02:00"), at("2026-06-03T03:00+02:00"), user="ops", via="test"
    )
    jobs = list(Job.objects.order_by("occurrence"))
    assert [(j.occurrence, j.input, j.task, j.enqueued_by) for j in jobs] == [
        (at(f"2026-06-0{d}T01:00Z"), {"day": f"2026-06-0{d}"}, "bf.daily", "backfill:ops")
        for d in (1, 2, 3)
    ]
    assert (done.created, done.existing) == (3, 0)
    record = Occurrence.objects.get()
    assert done.record == record
    assert (record.outcome, record.user, record.count) == ("backfill", "ops", 3)
    assert (record.occurrence, record.last_occurrence) == (
        at("2026-06-01T01:00Z"),
        at("2026-06-03T01:00Z"),
    )
    assert record.detail == (
        "backfill 2026-06-01T00:00:00+02:00 to 2026-06-03T03:00:00+02:00 via test: "
        "3 job(s) created, 0 already present"
    )
    assert [j["key"] for j in record.jobs] == [j.key for j in jobs]


def test_run__both_ends_are_included() -> None:
    handle = daily(cron="0 * * * *", tz="UTC")
    planned = backfill.plan(handle, at("2026-06-01T01:00Z"), at("2026-06-01T03:00Z"))
    assert [o.occurrence for o in planned.occurrences] == [
        at("2026-06-01T01:00Z"),
        at("2026-06-01T02:00Z"),
        at("2026-06-01T03:00Z"),
    ]


def test_run__uses_the_key_a_scheduled_run_of_that_occurrence_used(frozen: FrozenClock) -> None:
    handle = daily(cron="0 * * * *", tz="UTC", name="bf.hourly")
    scheduler = scheduler_for(handle, frozen)
    scheduler.tick()  # arms at 13:00
    frozen.set(at("2026-06-10T13:00:00.300Z"))
    [fired] = scheduler.tick()
    scheduled_key = fired.jobs[0].result.key

    done = backfill.run(
        handle, at("2026-06-10T11:00Z"), at("2026-06-10T14:00Z"), user="ops", via="test"
    )

    assert (done.created, done.existing) == (3, 1)
    assert done.enqueued[scheduled_key] == (fired.jobs[0].result.job_id, False)
    assert Job.objects.count() == 4
    assert Job.objects.filter(occurrence=at("2026-06-10T13:00Z")).count() == 1
    # And the other way round: the scheduler reaching a backfilled occurrence adds nothing.
    frozen.set(at("2026-06-10T14:00:00.300Z"))
    [later] = scheduler.tick()
    assert not later.jobs[0].result.created
    assert Job.objects.count() == 4
    record = Occurrence.objects.get(outcome="backfill")
    assert record.detail.endswith("3 job(s) created, 1 already present")


def test_run__twice_over_one_range_creates_nothing_the_second_time() -> None:
    handle = daily()
    start, end = at("2026-06-01T00:00Z"), at("2026-06-05T00:00Z")
    first = backfill.run(handle, start, end, user="ops", via="test")
    second = backfill.run(handle, start, end, user="ops", via="test")
    assert (first.created, second.created, second.existing) == (4, 0, 4)
    assert Job.objects.count() == 4
    assert Occurrence.objects.filter(outcome="backfill").count() == 2


@pytest.mark.parametrize(
    ("cron", "tz", "start", "end", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07",
            "2026-03-09T23:00",
            ["2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"],
            id="spring_gap_fires_at_the_end_of_the_gap",
        ),
        pytest.param(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31",
            "2026-11-02T23:00",
            ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"],
            id="autumn_repeated_hour_fires_once",
        ),
        pytest.param(
            "0 * * * *",
            "America/New_York",
            "2026-11-01T00:30",
            "2026-11-01T02:30",
            ["2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-01T07:00Z"],
            id="real_time_hourly_fires_in_both_passes",
        ),
    ],
)
def test_plan__follows_the_dst_rule(
    cron: str, tz: str, start: str, end: str, expected: list[str]
) -> None:
    handle = daily(cron=cron, tz=tz, name="bf.dst")
    first = backfill.parse_instant(start, handle.zone)
    last = backfill.parse_instant(end, handle.zone)
    planned = backfill.plan(handle, first, last)
    assert [o.occurrence for o in planned.occurrences] == [at(e) for e in expected]


def test_plan__writes_nothing_and_says_what_is_present() -> None:
    handle = daily()
    backfill.run(handle, at("2026-06-02T00:00Z"), at("2026-06-02T23:00Z"), user="o", via="t")
    before = (Job.objects.count(), Occurrence.objects.count())
    planned = backfill.plan(handle, at("2026-06-01T00:00Z"), at("2026-06-03T23:00Z"))
    assert (Job.objects.count(), Occurrence.objects.count()) == before
    assert len(planned.occurrences) == 3
    assert planned.new == 2
    assert list(planned.present.values()) == list(Job.objects.values_list("pk", flat=True))


def test_occurrences_in__refuses_more_than_the_limit_with_a_fix() -> None:
    handle = daily(cron="* * * * *", tz="UTC", name="bf.minutely")
    start = at("2026-06-01T00:00Z")
    assert len(backfill.occurrences_in(handle, start, start + timedelta(minutes=9), 10)) == 10
    with pytest.raises(BackfillTooLargeError) as caught:
        backfill.occurrences_in(handle, start, start + timedelta(minutes=10), 10)
    assert caught.value.code == "jobs.backfill.too-many"
    assert "more than 10 occurrences" in caught.value.message
    assert "2026-06-01T00:09:00+00:00" in caught.value.fix
    assert "--limit" in caught.value.fix


def test_occurrences_in__a_year_of_seconds_is_refused_without_walking_it() -> None:
    handle = daily(cron="* * * * * *", tz="UTC", name="bf.per-second")
    with pytest.raises(BackfillTooLargeError):
        backfill.occurrences_in(handle, at("2025-01-01T00:00Z"), at("2026-01-01T00:00Z"))


def test_occurrences_in__start_after_end_is_a_range_error() -> None:
    handle = daily()
    with pytest.raises(BackfillRangeError) as caught:
        backfill.occurrences_in(handle, at("2026-06-02T00:00Z"), at("2026-06-01T00:00Z"))
    assert caught.value.code == "jobs.backfill.range-invalid"
    assert caught.value.fix


def test_parse_instant__reads_a_naive_time_in_the_task_zone() -> None:
    zone = daily().zone
    assert backfill.parse_instant("2026-06-01T03:00", zone) == at("2026-06-01T01:00Z")
    assert backfill.parse_instant("2026-06-01T03:00Z", zone) == at("2026-06-01T03:00Z")
    with pytest.raises(BackfillRangeError) as caught:
        backfill.parse_instant("last tuesday", zone, "--start")
    assert "--start 'last tuesday'" in caught.value.message


def test_find_task__unknown_name_suggests_the_close_ones() -> None:
    daily()
    with pytest.raises(UnknownTaskError) as caught:
        backfill.find_task("bf.dialy")
    assert caught.value.code == "jobs.task.unknown"
    assert "bf.daily" in caught.value.fix


def test_run__a_failing_function_writes_nothing() -> None:
    def entries(occurrence: datetime) -> list[Entry]:
        if occurrence.day == 2:
            raise RuntimeError("no data for the 2nd")
        return [(note, {"at": occurrence.isoformat()})]

    handle = task(cron="0 3 * * *", tz="UTC", name="bf.flaky")(entries)
    with pytest.raises(TaskEntriesError) as raised:
        backfill.run(handle, at("2026-06-01T00:00Z"), at("2026-06-03T23:00Z"), user="o", via="t")
    assert raised.value.fix.endswith("then run the backfill again")  # no round retries it
    assert not Job.objects.exists()
    assert not Occurrence.objects.exists()


def test_run__an_empty_range_writes_nothing() -> None:
    handle = daily()
    done = backfill.run(handle, at("2026-06-01T04:00Z"), at("2026-06-01T05:00Z"), user="o", via="t")
    assert done.record is None
    assert not Occurrence.objects.exists()


# -- the command --------------------------------------------------------------------------


def command(*argv: str) -> str:
    out = StringIO()
    call_command("backfill_task", *argv, stdout=out)
    return out.getvalue()


def test_command__dry_run_lists_and_writes_nothing() -> None:
    daily()
    out = command("bf.daily", "--start", "2026-06-01", "--end", "2026-06-02T23:00", "--dry-run")
    assert "2026-06-01 03:00:00 CEST  (2026-06-01 01:00:00 UTC)" in out
    assert "bf.daily:1780275600000:report:2026-06-01  new" in out
    assert "Would enqueue 2 occurrence(s) of bf.daily: 2 new job(s), 0 already present" in out
    assert not Job.objects.exists()
    assert not Occurrence.objects.exists()


def test_command__enqueues_and_says_what_was_already_there() -> None:
    daily()
    command("bf.daily", "--start", "2026-06-02", "--end", "2026-06-02T23:00")
    out = command("bf.daily", "--start", "2026-06-01", "--end", "2026-06-02T23:00")
    present = Job.objects.get(occurrence=at("2026-06-02T01:00Z"))
    assert f"report:2026-06-02  already present #{present.pk}" in out
    assert "report:2026-06-01  created" in out
    assert "Backfilled 2 occurrence(s) of bf.daily: 1 job(s) created, 1 already present." in out
    record = Occurrence.objects.filter(outcome="backfill").latest("id")
    assert "via manage.py backfill_task" in record.detail
    assert record.user


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("0001-01-01T00:00Z", "0001-01-03T00:00Z"),
        ("0001-12-31T23:59+14:00", "0002-01-03T00:00Z"),
        ("9999-12-30T00:00Z", "9999-12-31T23:59Z"),
        ("9899-12-31T00:00Z", "9900-01-01T00:00Z"),
    ],
    ids=["year_1", "year_1_by_its_offset", "end_of_year_9999", "first_instant_of_9900"],
)
def test_occurrences_in__a_range_outside_the_years_2_to_9899_is_refused(
    start: str, end: str
) -> None:
    with pytest.raises(BackfillRangeError, match="outside the years 2 to 9899") as raised:
        backfill.occurrences_in(daily(), at(start), at(end))
    assert raised.value.code == "jobs.backfill.range-invalid"
    assert raised.value.fix == "give --start and --end between 0002-01-01 and 9899-12-31"


def test_occurrences_in__the_first_and_last_years_allowed_walk_without_overflow() -> None:
    # A leap day comes at most eight years apart: the walk past the end looks that far ahead.
    leap = daily(name="bf.leap", cron="0 0 29 2 *", tz="Pacific/Kiritimati")
    early = backfill.occurrences_in(leap, at("0002-01-01T00:00Z"), at("0010-01-01T00:00Z"))
    late = backfill.occurrences_in(leap, at("9890-01-01T00:00Z"), at("9899-12-31T23:59Z"))
    assert [o.year for o in early] == [4, 8]
    assert [o.astimezone(UTC).isoformat() for o in late] == [
        "9892-02-28T10:00:00+00:00",
        "9896-02-28T10:00:00+00:00",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bf.nope", "--start", "2026-06-01", "--end", "2026-06-02"], 'no task "bf.nope"'),
        (["bf.daily", "--start", "2026-06-03", "--end", "2026-06-02"], "after its end"),
        (["bf.daily", "--start", "soon", "--end", "2026-06-02"], "not an ISO 8601"),
        (["bf.daily", "--start", "2026-01-01", "--end", "2026-12-31", "--limit", "30"], "more"),
        (["bf.daily", "--start", "0001-01-01", "--end", "0001-01-03"], "years 2 to 9899"),
        (["bf.daily", "--start", "9999-12-30", "--end", "9999-12-31T23:59"], "years 2 to 9899"),
    ],
    ids=["unknown_task", "start_after_end", "bad_iso", "over_the_limit", "year_1", "year_9999"],
)
def test_command__user_errors_are_a_command_error_with_the_fix(
    argv: list[str], message: str
) -> None:
    daily()
    with pytest.raises(CommandError) as caught:
        command(*argv)
    assert message in str(caught.value)
    assert "\nfix: " in str(caught.value)
    assert not Job.objects.exists()


# -- what already fired, what is still ahead, paused tasks, the round's checks ---------------

#: The payload the ``bf.versioned`` tasks give now: a deploy that changes it changes every key.
RELEASE = {"n": 1}


@job(name="bf.build")
def build(day: str, release: int) -> None: ...


def versioned(name: str = "bf.versioned", cron: str = "0 3 * * *") -> TaskHandle:
    """A task whose payload names the release that made it: the occurrence key hashes it."""

    def entries(occurrence: datetime) -> list[Entry]:
        return [(build, {"day": occurrence.isoformat(), "release": RELEASE["n"]})]

    entries.__qualname__ = f"versioned_{name}"
    return task(cron=cron, tz="UTC", name=name)(entries)


@pytest.fixture
def release() -> Iterator[dict[str, int]]:
    RELEASE["n"] = 1
    yield RELEASE
    RELEASE["n"] = 1


def releases(name: str) -> list[tuple[datetime | None, int]]:
    jobs = Job.objects.filter(task=name).order_by("occurrence", "id")
    return [(j.occurrence, j.input["release"]) for j in jobs]


def test_run__an_occurrence_that_fired_is_not_fired_again_after_its_payload_changed(
    release: dict[str, int],
) -> None:
    handle = versioned()
    start, end = at("2026-06-01T00:00Z"), at("2026-06-03T23:00Z")
    first = backfill.run(handle, start, end, user="ops", via="test")
    release["n"] = 2  # A deploy changed what the task returns: every key is a new one.

    second = backfill.run(handle, start, end, user="ops", via="test")

    assert (first.created, second.created, second.existing) == (3, 0, 0)
    days = [at(f"2026-06-0{d}T03:00Z") for d in (1, 2, 3)]
    assert [o.occurrence for o in second.plan.already_fired] == days
    assert (second.plan.due, second.plan.left_out) == ([], 3)
    assert releases("bf.versioned") == [(day, 1) for day in days]
    record = Occurrence.objects.filter(outcome="backfill").latest("id")
    assert (record.count, record.jobs) == (3, [])
    assert record.detail == (
        "backfill 2026-06-01T00:00:00+00:00 to 2026-06-03T23:00:00+00:00 via test "
        "(3 occurrence(s) already fired, not fired again): 0 job(s) created, 0 already present"
    )


def test_run__again_fires_the_occurrences_that_fired_with_their_payload_now(
    release: dict[str, int],
) -> None:
    handle = versioned()
    start, end = at("2026-06-01T00:00Z"), at("2026-06-02T23:00Z")
    backfill.run(handle, start, end, user="ops", via="test")
    release["n"] = 2

    again = backfill.run(handle, start, end, user="ops", via="test", again=True)

    assert (again.created, again.existing, len(again.plan.already_fired)) == (2, 0, 2)
    days = [at("2026-06-01T03:00Z"), at("2026-06-02T03:00Z")]
    assert releases("bf.versioned") == [(days[0], 1), (days[0], 2), (days[1], 1), (days[1], 2)]
    # The same payload a third time: the keys exist, so nothing is enqueued twice.
    third = backfill.run(handle, start, end, user="ops", via="test", again=True)
    assert (third.created, third.existing) == (0, 2)
    assert Job.objects.count() == 4
    assert third.record is not None
    assert "(2 occurrence(s) already fired, fired again)" in third.record.detail


def test_run__an_occurrence_the_scheduler_fired_before_a_deploy_is_left_out(
    frozen: FrozenClock, release: dict[str, int]
) -> None:
    handle = versioned(name="bf.hourly-versioned", cron="0 * * * *")
    scheduler = scheduler_for(handle, frozen)
    scheduler.tick()  # arms at 13:00
    frozen.set(at("2026-06-10T13:00:00.300Z"))
    [fired] = scheduler.tick()
    assert [r.result.created for r in fired.jobs] == [True]
    release["n"] = 2

    done = backfill.run(
        handle, at("2026-06-10T11:00Z"), at("2026-06-10T13:00Z"), user="ops", via="test"
    )

    assert [o.occurrence for o in done.plan.already_fired] == [at("2026-06-10T13:00Z")]
    assert (done.created, done.existing, done.plan.left_out) == (2, 0, 1)
    assert releases("bf.hourly-versioned") == [
        (at("2026-06-10T11:00Z"), 2),
        (at("2026-06-10T12:00Z"), 2),
        (at("2026-06-10T13:00Z"), 1),
    ]


@pytest.mark.parametrize("outcome", ["fired", "manual", "backfill"])
def test_run__a_record_of_the_occurrence_counts_as_fired_without_its_job(
    outcome: str, release: dict[str, int]
) -> None:
    handle = versioned()
    day = at("2026-06-02T03:00Z")
    # Its job pruned or deleted since; the record stays. A backfill's record spans a range, so
    # only the key it enqueued names the occurrence; its other instants did not fire.
    key = f"bf.versioned:{int(day.timestamp() * 1000)}:bf.build:0123456789abcdef"
    Occurrence.objects.create(
        task="bf.versioned",
        outcome=outcome,
        occurrence=day - timedelta(days=1) if outcome == "backfill" else day,
        last_occurrence=day + timedelta(days=1) if outcome == "backfill" else day,
        count=3 if outcome == "backfill" else 1,
        jobs=[{"job": "bf.build", "key": key, "created": True}] if outcome == "backfill" else [],
        recorded_at=NOW,
    )

    done = backfill.run(
        handle, at("2026-06-01T00:00Z"), at("2026-06-03T23:00Z"), user="ops", via="test"
    )

    assert [o.occurrence for o in done.plan.already_fired] == [day]
    assert [j.occurrence for j in Job.objects.order_by("occurrence")] == [
        at("2026-06-01T03:00Z"),
        at("2026-06-03T03:00Z"),
    ]


def test_run__an_occurrence_ahead_is_due_at_its_own_time_and_its_round_adds_nothing(
    frozen: FrozenClock, release: dict[str, int]
) -> None:
    handle = versioned(name="bf.ahead", cron="0 * * * *")
    # Before any scheduler ran: the backfill writes the task's row to lock and mark it.
    done = backfill.run(
        handle, at("2026-06-10T11:00Z"), at("2026-06-10T14:00Z"), user="ops", via="test"
    )
    jobs = list(Job.objects.filter(task="bf.ahead").order_by("occurrence"))
    assert [(j.occurrence, j.run_at) for j in jobs] == [
        (at("2026-06-10T11:00Z"), NOW),
        (at("2026-06-10T12:00Z"), NOW),
        (at("2026-06-10T13:00Z"), at("2026-06-10T13:00Z")),
        (at("2026-06-10T14:00Z"), at("2026-06-10T14:00Z")),
    ]
    assert [o.occurrence for o in done.plan.due if done.plan.ahead(o)] == [
        at("2026-06-10T13:00Z"),
        at("2026-06-10T14:00Z"),
    ]
    row = Task.objects.get(name="bf.ahead")
    assert (row.last_fired_at, row.backfilled_to) == (None, at("2026-06-10T14:00Z"))

    scheduler = scheduler_for(handle, frozen)
    scheduler.tick()  # arms at 13:00
    release["n"] = 2  # deployed meanwhile: the round's keys are not the backfill's
    frozen.set(at("2026-06-10T13:00:00.300Z"))
    [at_13] = scheduler.tick()
    frozen.set(at("2026-06-10T14:00:00.300Z"))
    [at_14] = scheduler.tick()
    frozen.set(at("2026-06-10T15:00:00.300Z"))
    [at_15] = scheduler.tick()

    # The backfilled occurrences fire nothing new; the first one past them fires as usual.
    assert (at_13.jobs, at_14.jobs) == ([], [])
    assert [r.result.created for r in at_15.jobs] == [True]
    assert releases("bf.ahead") == [
        *[(at(f"2026-06-10T{h}:00Z"), 1) for h in (11, 12, 13, 14)],
        (at("2026-06-10T15:00Z"), 2),
    ]
    # The watermark moved over them as over any occurrence, each with its fired record.
    assert Task.objects.get(name="bf.ahead").last_fired_at == at("2026-06-10T15:00:00.300Z")
    fired = Occurrence.objects.filter(task="bf.ahead", outcome="fired").order_by("occurrence")
    assert [(r.occurrence.hour, len(r.jobs)) for r in fired if r.occurrence] == [
        (13, 0),
        (14, 0),
        (15, 1),
    ]


def test_run__an_occurrence_ahead_with_the_same_payload_is_reported_by_its_round(
    frozen: FrozenClock, release: dict[str, int]
) -> None:
    handle = versioned(name="bf.ahead-same", cron="0 * * * *")
    scheduler = scheduler_for(handle, frozen)
    scheduler.tick()  # arms at 13:00
    done = backfill.run(
        handle, at("2026-06-10T13:00Z"), at("2026-06-10T13:00Z"), user="ops", via="test"
    )
    [(job_id, created)] = done.enqueued.values()
    frozen.set(at("2026-06-10T13:00:00.300Z"))
    [fired] = scheduler.tick()
    assert created
    assert [(r.result.job_id, r.result.created) for r in fired.jobs] == [(job_id, False)]
    assert Job.objects.filter(task="bf.ahead-same").count() == 1


def test_plan__says_which_occurrences_fired_and_which_are_ahead(
    release: dict[str, int],
) -> None:
    handle = versioned(name="bf.plan", cron="0 * * * *")
    backfill.run(handle, at("2026-06-10T10:00Z"), at("2026-06-10T10:00Z"), user="o", via="t")
    release["n"] = 2
    planned = backfill.plan(handle, at("2026-06-10T10:00Z"), at("2026-06-10T13:00Z"))
    assert [o.occurrence.hour for o in planned.already_fired] == [10]
    assert [o.occurrence.hour for o in planned.due] == [11, 12, 13]
    assert [o.occurrence.hour for o in planned.due if planned.ahead(o)] == [13]
    assert (planned.new, planned.already_present, planned.left_out) == (3, 0, 1)
    assert Job.objects.count() == 1


def paused(handle: TaskHandle) -> None:
    DatabaseState(node_id="t", leader="sole").sync([handle])
    Task.objects.filter(name=handle.name).update(paused=True, paused_by="ops")


def test_run__a_paused_task_is_refused_with_a_code_and_a_fix_unless_included() -> None:
    handle = daily()
    paused(handle)
    start, end = at("2026-06-01T00:00Z"), at("2026-06-02T23:00Z")
    with pytest.raises(BackfillPausedError) as previewed:
        backfill.plan(handle, start, end)
    with pytest.raises(BackfillPausedError) as refused:
        backfill.run(handle, start, end, user="ops", via="test")
    for error in (previewed.value, refused.value):
        assert error.code == "jobs.backfill.task-paused"
        assert 'task "bf.daily" is paused' in error.message
        assert "--include-paused" in error.fix
    assert not Job.objects.exists()

    done = backfill.run(handle, start, end, user="ops", via="test", include_paused=True)

    assert done.created == 2
    assert Task.objects.get(name="bf.daily").paused  # it stays paused


def test_run__a_django_task_on_a_jobs_backend_of_another_database_is_refused_as_the_round_does(
    frozen: FrozenClock,
) -> None:
    pytest.importorskip("django_tasks")
    from django.test import override_settings

    from testproject.demo import background

    handle = task(cron="0 * * * *", tz="UTC", name="bf.django-task")(
        lambda occurrence: [(background.add, {"a": 1, "b": 2})]
    )
    elsewhere = {
        "default": {
            "BACKEND": "ultimat3_jobs.backends.JobsBackend",
            "OPTIONS": {"DATABASE": "replica"},
        }
    }
    with override_settings(TASKS=elsewhere):
        # The round: the occurrence is held, failing with this error.
        plan = RoundPlan(now=at("2026-06-10T13:00:01Z"), database="default")
        step = plan_task(
            handle,
            watermark=at("2026-06-10T12:00Z"),
            paused=False,
            now=plan.now,
            misfire_grace=timedelta(minutes=1),
            next_after=handle.next_after,
            plan=plan,
        )
        assert step.failed is None
        _, round_error = plan.held[handle.name]
        with pytest.raises(TaskBackendError) as refused:
            backfill.run(
                handle, at("2026-06-10T12:00Z"), at("2026-06-10T13:00Z"), user="o", via="t"
            )
        with pytest.raises(TaskBackendError):
            backfill.plan(handle, at("2026-06-10T12:00Z"), at("2026-06-10T13:00Z"))
    assert isinstance(round_error, TaskBackendError)
    assert refused.value.code == round_error.code == "jobs.task.backend-unsupported"
    assert refused.value.message == round_error.message
    assert 'database "replica" is not the scheduler\'s ("default")' in refused.value.message
    assert not Job.objects.exists()
    assert not Occurrence.objects.exists()


def test_command__says_what_already_fired_and_again_fires_it(release: dict[str, int]) -> None:
    versioned()
    argv = ("bf.versioned", "--start", "2026-06-01", "--end", "2026-06-02T23:00")
    command(*argv)
    release["n"] = 2

    dry = command(*argv, "--dry-run")
    out = command(*argv)

    for text in (dry, out):
        assert "2026-06-01 03:00:00 UTC  (2026-06-01 03:00:00 UTC)  already fired" in text
        assert "left out: the occurrence already fired" in text
        assert (
            "2 occurrence(s) already fired: not fired again, 2 job(s) of their payload now left "
            "out (--again fires them again)." in text
        )
    assert "Would enqueue 2 occurrence(s) of bf.versioned: 0 new job(s), 0 already present." in dry
    assert "Backfilled 2 occurrence(s) of bf.versioned: 0 job(s) created, 0 already present." in out
    assert Job.objects.count() == 2

    again = command(*argv, "--again")

    assert "already fired, fired again" in again
    assert (
        "Backfilled 2 occurrence(s) of bf.versioned: 2 job(s) created, 0 already present." in again
    )
    assert "2 occurrence(s) already fired: fired again (--again)." in again
    assert Job.objects.count() == 4


def test_command__an_occurrence_ahead_is_said_to_be_due_at_its_own_time() -> None:
    daily(cron="0 * * * *", tz="UTC", name="bf.soon")
    out = command("bf.soon", "--start", "2026-06-10T12:00Z", "--end", "2026-06-10T13:00Z")
    assert "2026-06-10 13:00:00 UTC  (2026-06-10 13:00:00 UTC)  ahead: due at its own time" in out
    assert "1 occurrence(s) still ahead: due at their own time." in out
    assert Job.objects.get(occurrence=at("2026-06-10T13:00Z")).run_at == at("2026-06-10T13:00Z")


def test_command__a_paused_task_is_a_command_error_with_the_fix_and_include_paused_runs_it() -> (
    None
):
    paused(daily())
    argv = ("bf.daily", "--start", "2026-06-01", "--end", "2026-06-02T23:00")
    with pytest.raises(CommandError) as refused:
        command(*argv)
    assert "[jobs.backfill.task-paused]" in str(refused.value)
    assert "\nfix: resume the task" in str(refused.value)
    assert not Job.objects.exists()
    out = command(*argv, "--include-paused")
    assert "Backfilled 2 occurrence(s) of bf.daily: 2 job(s) created" in out


def test_command__help_says_an_occurrence_ahead_runs_at_its_own_time() -> None:
    from ultimat3_jobs.management.commands.backfill_task import Command

    assert "still ahead is enqueued to run at its own time" in Command.help


def test_parse_instant__a_wall_time_the_clock_skipped_is_the_gaps_end() -> None:
    # 02:30 on New York's spring-forward night never was: read with the offset before the
    # change, --start was 03:30 EDT, past the slot that fires at the gap's end (03:00 EDT).
    zone = ZoneInfo("America/New_York")
    assert backfill.parse_instant("2026-03-08T02:30", zone).astimezone(UTC) == at(
        "2026-03-08T07:00Z"
    )
    # A repeated one is its first pass, as before.
    assert backfill.parse_instant("2026-11-01T01:30", zone).astimezone(UTC) == at(
        "2026-11-01T05:30Z"
    )
    handle = daily("bf.gap", cron="30 2 * * *", tz="America/New_York")
    start = backfill.parse_instant("2026-03-08T02:30", handle.zone)
    end = backfill.parse_instant("2026-03-08T05:00", handle.zone)
    assert backfill.occurrences_in(handle, start, end) == [at("2026-03-08T07:00Z")]
    # The gap's end written as the wall time it is: 03:00 less a microsecond, in the zone's own
    # arithmetic, was 02:59:59 of the gap, read an hour later.
    start = backfill.parse_instant("2026-03-08T03:00", handle.zone)
    assert backfill.occurrences_in(handle, start, end) == [at("2026-03-08T07:00Z")]


# -- after a prune ------------------------------------------------------------------------------


def _fired_and_pruned(frozen: FrozenClock, handle: TaskHandle | None = None) -> TaskHandle:
    """``bf.daily`` backfilled over 1-5 May, its jobs done then, and pruned at ``NOW`` (the
    retention period, 14 days, long past): no trace is left that those occurrences fired."""
    handle = handle or daily()
    frozen.set(at("2026-05-05T12:00Z"))
    backfill.run(handle, at("2026-05-01T00:00Z"), at("2026-05-05T23:00Z"), user="o", via="t")
    Job.objects.update(status="succeeded", finished_at=frozen())
    # First seen then, on this clock (the column takes the wall clock's now).
    Task.objects.filter(name=handle.name).update(first_seen_at=frozen())
    frozen.set(NOW)
    pruned = prune(older_than=timedelta(days=14))
    assert (pruned.jobs, Job.objects.count()) == (5, 0)
    return handle


def test_run__occurrences_before_a_prunes_cutoff_without_a_trace_are_refused_unless_again(
    frozen: FrozenClock,
) -> None:
    # Pruned, their jobs and records no longer said they fired: the backfill fired each again.
    handle = _fired_and_pruned(frozen)
    start, end = at("2026-05-01T00:00Z"), at("2026-05-05T23:00Z")
    with pytest.raises(BackfillHistoryPrunedError) as planned:
        backfill.plan(handle, start, end)
    with pytest.raises(BackfillHistoryPrunedError) as ran:
        backfill.run(handle, start, end, user="o", via="t")
    for caught in (planned, ran):
        assert caught.value.code == "jobs.backfill.history-pruned"
        assert "5 occurrence(s)" in str(caught.value)
        assert "--again" in caught.value.fix
    assert not Job.objects.exists()

    done = backfill.run(
        handle, at("2026-05-01T00:00Z"), at("2026-05-05T23:00Z"), again=True, user="o", via="t"
    )
    assert done.created == 5


def test_run__occurrences_after_a_prunes_cutoff_or_never_pruned_are_not_refused(
    frozen: FrozenClock,
) -> None:
    handle = daily()
    # Never pruned: an old range is read as it stands.
    assert backfill.plan(handle, at("2026-04-01T00:00Z"), at("2026-04-02T23:00Z")).new == 2
    _fired_and_pruned(frozen, handle)
    # After the cutoff (27 May), what did not fire is known not to have fired.
    done = backfill.run(handle, at("2026-06-01T00:00Z"), at("2026-06-02T23:00Z"), user="o", via="t")
    assert done.created == 2
    # A task first seen after the cutoff had nothing that old to prune: its May is its own.
    newer = daily("bf.newer")
    done = backfill.run(newer, at("2026-05-01T00:00Z"), at("2026-05-02T23:00Z"), user="o", via="t")
    assert done.created == 2


def test_command__a_range_before_a_prune_is_a_command_error_with_the_fix(
    frozen: FrozenClock,
) -> None:
    _fired_and_pruned(frozen)
    with pytest.raises(CommandError) as caught:
        command("bf.daily", "--start", "2026-05-01", "--end", "2026-05-05")
    assert "jobs.backfill.history-pruned" in str(caught.value)
    assert "\nfix: pass --again" in str(caught.value)
