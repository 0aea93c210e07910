"""Backfill on a real database: the scheduler's keys, one payload per occurrence, the limit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ultimat3_jobs import backfill, clock, job, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.errors import (
    BackfillRangeError,
    BackfillTooLargeError,
    TaskEntriesError,
    UnknownTaskError,
)
from ultimat3_jobs.handles import Entry, TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job, Occurrence
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
    with pytest.raises(TaskEntriesError):
        backfill.run(handle, at("2026-06-01T00:00Z"), at("2026-06-03T23:00Z"), user="o", via="t")
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
