"""A backfill and a round of one task write one after the other, on PostgreSQL: the backfill
holds the task row's lock, the one the round's compare-and-set takes, and each sees what the
other wrote once it has the row."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, connections

from ultimat3_jobs import backfill, clock, job, task
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.handles import Entry, TaskHandle
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Job
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.store import JobStore, PostgresStore, Rows

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry"),
]

NOW = datetime(2026, 6, 10, 12, 0, 30, tzinfo=UTC)
#: What the tasks' payload says; a deploy between two writers changes every key.
RELEASE = {"n": 1}


@job(name="bfl.build")
def build(hour: str, release: int) -> None: ...


def hourly(name: str) -> TaskHandle:
    def entries(occurrence: datetime) -> list[Entry]:
        return [(build, {"hour": occurrence.isoformat(), "release": RELEASE["n"]})]

    entries.__qualname__ = f"hourly_{name}"
    return task(cron="0 * * * *", tz="UTC", name=name)(entries)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.fixture(autouse=True)
def frozen() -> Iterator[FrozenClock]:
    RELEASE["n"] = 1
    frozen_clock = FrozenClock(NOW)
    with clock.use(frozen_clock):
        yield frozen_clock
    RELEASE["n"] = 1


class Holding(PostgresStore):
    """A store that stops after one of its writes, inside the caller's transaction, until let
    go: the task row stays locked meanwhile."""

    def __init__(self, using: str, after: str) -> None:
        super().__init__(using)
        self.after = after
        self.reached, self.go = threading.Event(), threading.Event()

    def _hold(self, write: str) -> None:
        if write == self.after:
            self.reached.set()
            assert self.go.wait(30), "never let go"

    def insert_round(self, rows: Rows) -> Any:
        enqueued = super().insert_round(rows)
        self._hold("insert_round")
        return enqueued

    def insert_record(self, row: dict[str, Any]) -> Any:
        record = super().insert_record(row)
        self._hold("insert_record")
        return record


class Running:
    """A call in a thread of its own (its own connection), with its result or error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = call()
            except BaseException as error:
                self.error = error
            finally:
                connections.close_all()

        self.thread = threading.Thread(target=target)
        self.thread.start()

    def value(self) -> Any:
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.result


def waiting_on_a_lock(timeout: float = 20) -> bool:
    """Whether a session of this database waits for a lock, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            [(waiting,)] = cursor.fetchall()
        if waiting:
            return True
        time.sleep(0.05)
    return False


def scheduler_for(
    handle: TaskHandle, frozen: FrozenClock, store: JobStore | None = None
) -> Scheduler:
    state = DatabaseState(node_id="node-a", leader="sole", clock=frozen, store=store)
    return Scheduler(
        state=state, leader=SoleLeader(), clock=frozen, tasks=[handle], drain_on_shutdown=False
    )


def releases(name: str) -> list[tuple[datetime | None, int]]:
    jobs = Job.objects.filter(task=name).order_by("occurrence", "id")
    return [(j.occurrence, j.input["release"]) for j in jobs]


def test_backfill__waits_for_a_round_holding_the_task_row_then_leaves_out_what_it_fired(
    frozen: FrozenClock,
) -> None:
    handle = hourly("bfl.round-first")
    scheduler_for(handle, frozen).tick()  # arms at 13:00
    frozen.set(at("2026-06-10T13:00:00.300Z"))
    holding = Holding("default", after="insert_round")
    scheduler = scheduler_for(handle, frozen, store=holding)
    round_ = Running(scheduler.tick)
    assert holding.reached.wait(20), "the round never wrote its jobs"
    RELEASE["n"] = 2  # the backfill runs a later release: its key for 13:00 is another one

    backfilling = Running(
        lambda: backfill.run(
            handle, at("2026-06-10T12:00Z"), at("2026-06-10T13:00Z"), user="ops", via="test"
        )
    )

    assert waiting_on_a_lock(), "the backfill did not wait for the round's lock"
    assert backfilling.thread.is_alive()
    holding.go.set()
    [fired] = round_.value()
    done = backfilling.value()
    assert [r.result.created for r in fired.jobs] == [True]
    # It read what fired once the round had committed: 13:00 is left out, 12:00 enqueued.
    assert [o.occurrence for o in done.plan.already_fired] == [at("2026-06-10T13:00Z")]
    assert (done.created, done.plan.left_out) == (1, 1)
    assert releases("bfl.round-first") == [
        (at("2026-06-10T12:00Z"), 2),
        (at("2026-06-10T13:00Z"), 1),
    ]


def test_round__waits_for_a_backfill_holding_the_task_row_then_adds_nothing_to_its_jobs(
    frozen: FrozenClock,
) -> None:
    handle = hourly("bfl.backfill-first")
    scheduler = scheduler_for(handle, frozen)
    scheduler.tick()  # arms at 13:00
    holding = Holding("default", after="insert_record")
    backfilling = Running(
        lambda: backfill.run(
            handle,
            at("2026-06-10T13:00Z"),
            at("2026-06-10T14:00Z"),
            user="ops",
            via="test",
            store=holding,
        )
    )
    assert holding.reached.wait(20), "the backfill never wrote its record"
    RELEASE["n"] = 2  # the scheduler runs a later release: its key for 13:00 is another one
    frozen.set(at("2026-06-10T13:00:00.300Z"))

    round_ = Running(scheduler.tick)

    assert waiting_on_a_lock(), "the round did not wait for the backfill's lock"
    assert round_.thread.is_alive()
    holding.go.set()
    done = backfilling.value()
    [fired] = round_.value()
    assert done.created == 2
    # Its compare-and-set read the backfill's mark once it had the row: nothing new for 13:00.
    assert (fired.occurrence, fired.jobs) == (at("2026-06-10T13:00Z"), [])
    assert releases("bfl.backfill-first") == [
        (at("2026-06-10T13:00Z"), 1),
        (at("2026-06-10T14:00Z"), 1),
    ]
