"""The overlap policy decided inside a real round's transaction: one statement for all tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.handles import TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job, JobStatus, Occurrence, Task
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState

from .factories import make_tasks

T0 = datetime(2026, 6, 1, 0, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
FIRST = datetime(2026, 6, 1, 0, 1, tzinfo=UTC)


def armed(tasks: list[TaskHandle], clock: FrozenClock) -> Scheduler:
    state = DatabaseState(node_id="node-a", leader="sole", clock=clock)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), clock=clock, tasks=tasks, drain_on_shutdown=False
    )
    scheduler.tick()  # syncs and arms every task
    return scheduler


def at_minute(clock: FrozenClock, n: int) -> None:
    clock.set(FIRST + (n - 1) * MINUTE + timedelta(milliseconds=200))


@pytest.mark.django_db
def test_round__skip_waits_while_an_earlier_job_is_queued_or_running() -> None:
    clock = FrozenClock(T0)
    [exclusive] = make_tasks(1, prefix="skip", overlap="skip")
    [shared] = make_tasks(1, prefix="allow")
    scheduler = armed([exclusive, shared], clock)
    assert Task.objects.get(name=exclusive.name).overlap == "skip"
    at_minute(clock, 1)
    assert {d.task for d in scheduler.tick()} == {exclusive.name, shared.name}
    first = Job.objects.get(task=exclusive.name)

    at_minute(clock, 2)
    assert [d.task for d in scheduler.tick()] == [shared.name]
    Job.objects.filter(pk=first.pk).update(status=JobStatus.RUNNING)
    at_minute(clock, 3)
    assert [d.task for d in scheduler.tick()] == [shared.name]

    skipped = Occurrence.objects.filter(task=exclusive.name, outcome="overlap").order_by("id")
    assert [(r.occurrence, r.count) for r in skipped] == [
        (FIRST + MINUTE, 1),
        (FIRST + 2 * MINUTE, 1),
    ]
    assert {r.detail for r in skipped} == {"overlap=skip: 2026-06-01T00:01:00Z not done yet"}
    # The watermark moved on: a skipped occurrence is decided, never fired later.
    assert Task.objects.get(name=exclusive.name).last_fired_at == clock()

    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED)
    at_minute(clock, 4)
    assert {d.task for d in scheduler.tick()} == {exclusive.name, shared.name}
    assert list(
        Job.objects.filter(task=exclusive.name)
        .order_by("occurrence")
        .values_list("occurrence", flat=True)
    ) == [FIRST, FIRST + 3 * MINUTE]
    assert Job.objects.filter(task=shared.name).count() == 4


@pytest.mark.django_db
def test_round__a_manual_run_of_the_task_is_no_overlap() -> None:
    clock = FrozenClock(T0)
    [exclusive] = make_tasks(1, prefix="skip", overlap="skip")
    scheduler = armed([exclusive], clock)
    ping = exclusive.entries(T0)[0][0]
    ping.enqueue({"label": "by hand"}, task=exclusive.name)  # no occurrence: not a run of one
    at_minute(clock, 1)
    assert [d.occurrence for d in scheduler.tick()] == [FIRST]


def _statements(count: int, overlap: str) -> int:
    """Statements of a round whose ``count`` tasks all have an earlier job still queued."""
    Job.objects.all().delete()
    Task.objects.all().delete()
    Occurrence.objects.all().delete()
    clock = FrozenClock(T0)
    scheduler = armed(make_tasks(count, overlap=overlap), clock)
    at_minute(clock, 1)
    assert len(scheduler.tick()) == count
    at_minute(clock, 2)
    with CaptureQueriesContext(connection) as queries:
        dispatched = scheduler.tick()
    assert len(dispatched) == (0 if overlap == "skip" else count)
    skipped = Occurrence.objects.filter(outcome="overlap").count()
    assert skipped == (count if overlap == "skip" else 0)
    return len(queries)


@pytest.mark.postgres
@pytest.mark.django_db
def test_round__overlap_costs_one_statement_whatever_the_number_of_tasks() -> None:
    skip_small, skip_large = _statements(100, "skip"), _statements(1000, "skip")
    allow_small = _statements(100, "allow")
    assert skip_small == skip_large
    # The skipping round inserts no job but reads the busy occurrences: one statement in all
    # at most more than a round that inserts every job.
    assert skip_small <= allow_small + 1


@pytest.mark.django_db
@pytest.mark.parametrize("entry", ["exactly_once", "plain"])
def test_round__skip_waits_while_an_earlier_relayed_row_is_not_reported_done(entry: str) -> None:
    from testproject.demo.celery_tasks import plain_row, write_row
    from ultimat3_jobs.cron import parse
    from ultimat3_jobs.zones import resolve_zone

    def entries(occurrence: datetime) -> list[Any]:
        if entry == "plain":
            return [(plain_row, {"label": occurrence.isoformat()})]
        return [(write_row, {"occurrence": occurrence.isoformat()})]

    relayed = TaskHandle(
        entries,
        name=f"skip.relayed-{entry}",
        schedule=parse("* * * * *"),
        zone=resolve_zone("UTC", "test"),
        catch_up="skip",
        max_catch_up=10,
        overlap="skip",
    )
    clock = FrozenClock(T0)
    scheduler = armed([relayed], clock)
    at_minute(clock, 1)
    assert [d.occurrence for d in scheduler.tick()] == [FIRST]
    [first] = Job.objects.filter(task=relayed.name)
    assert first.status == JobStatus.OUTBOX
    # Waiting for the relay, then handed to Celery and not reported done: busy either way.
    at_minute(clock, 2)
    assert scheduler.tick() == []
    Job.objects.filter(pk=first.pk).update(status=JobStatus.RELAYED)
    at_minute(clock, 3)
    assert scheduler.tick() == []
    skipped = Occurrence.objects.filter(task=relayed.name, outcome="overlap")
    assert {r.detail for r in skipped} == {"overlap=skip: 2026-06-01T00:01:00Z not done yet"}
    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED)
    at_minute(clock, 4)
    assert [d.occurrence for d in scheduler.tick()] == [FIRST + 3 * MINUTE]
    assert Job.objects.filter(task=relayed.name).count() == 2
