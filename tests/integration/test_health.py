"""Health: each role alive and ready, in its own process and as the database tells it; the
``/healthz`` and ``/readyz`` of ``--metrics-port``, ``jobs_status --check`` and the
django-health-check checks."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connections
from django.test import Client
from django.utils import timezone

from ultimat3_jobs import clock, metrics, nodes
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.db import dedicated_connection
from ultimat3_jobs.health import (
    ProcessHealth,
    RoleHealth,
    database_health,
    relay_health,
    scheduler_health,
    worker_health,
)
from ultimat3_jobs.leaders import SoleLeader
from ultimat3_jobs.models import Lease, Node
from ultimat3_jobs.relay import Relay
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.status import scheduler_status
from ultimat3_jobs.testing import MemoryState
from ultimat3_jobs.worker import Worker

from .factories import running

TICK = timedelta(seconds=1)


def running_scheduler() -> Scheduler:
    scheduler = Scheduler(state=MemoryState(), tick_interval=TICK, drain_on_shutdown=False)
    scheduler.life.begin()  # Running, without the loop's thread: the test moves its rounds.
    return scheduler


# -- in the role's own process ------------------------------------------------------------------


def test_scheduler_health__alive_while_its_rounds_come_within_three_ticks() -> None:
    scheduler = running_scheduler()
    now = time.monotonic()
    scheduler.round_began, scheduler.round_ended = now - 0.6, now - 0.5
    scheduler.is_leader = True
    found = scheduler_health(scheduler, moment=now)
    assert (found.live, found.ready) == (True, True)
    assert found.detail == "leader, last round 0.5 s ago"

    scheduler.round_began, scheduler.round_ended = now - 3.2, now - 3.1
    found = scheduler_health(scheduler, moment=now)
    assert (found.live, found.ready) == (False, False)
    assert "more than 3 ticks" in found.detail and found.fix


def test_scheduler_health__a_long_round_in_flight_is_alive_a_hung_one_is_not() -> None:
    scheduler = running_scheduler()
    now = time.monotonic()
    scheduler.round_ended, scheduler.round_began = now - 31, now - 30
    found = scheduler_health(scheduler, moment=now)
    assert found.live and found.detail.startswith("standby, a round in flight for 30.0 s")
    scheduler.round_ended, scheduler.round_began = now - 62, now - 61  # past STALE_ROUND_WARNING
    found = scheduler_health(scheduler, moment=now)
    assert not found.live
    assert found.detail == (
        "standby, a round in flight for 61.0 s (more than STALE_ROUND_WARNING, 60.0 s)"
    )


def test_scheduler_health__a_failed_round_is_alive_while_backing_off_but_not_ready() -> None:
    scheduler = running_scheduler()
    now = time.monotonic()
    scheduler.round_began, scheduler.round_ended = now - 20.1, now - 20
    scheduler.round_failed, scheduler.last_error = True, "connection refused"
    found = scheduler_health(scheduler, moment=now)
    assert (found.live, found.ready) == (True, False)
    assert "leadership unknown: connection refused" in found.detail


def test_scheduler_health__not_started_stopped_or_draining() -> None:
    scheduler = Scheduler(state=MemoryState(), drain_on_shutdown=False)
    assert not scheduler_health(scheduler).live
    scheduler.life.begin()
    scheduler.life.drain("test")
    found = scheduler_health(scheduler)
    assert (found.live, found.ready) == (True, False)


@pytest.mark.django_db
def test_worker_health__its_heartbeat_written_within_three_intervals() -> None:
    worker = Worker(heartbeat_interval=timedelta(seconds=1), drain_on_shutdown=False)
    assert not worker_health(worker).live  # idle: not running
    worker.life.begin()
    now = time.monotonic()
    worker.node.attempted = worker.node.written = now - 2
    assert (worker_health(worker, moment=now).live, worker_health(worker, moment=now).ready) == (
        True,
        True,
    )
    worker.node.attempted = worker.node.written = now - 3.5
    assert not worker_health(worker, moment=now).live
    # Its heartbeat tried and failed: the database is away, the loop backs off and lives on.
    worker.node.attempted, worker.node.written = now - 5, now - 40
    found = worker_health(worker, moment=now)
    assert (found.live, found.ready) == (True, False)
    assert "database away" in found.detail


@pytest.mark.django_db
def test_worker_health__a_heartbeat_being_written_is_not_a_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A probe may come while a heartbeat is being written: a database slow to answer, or
    # SQLite waiting for another process's write. It sees the last heartbeat written.
    worker = Worker(heartbeat_interval=timedelta(seconds=1), drain_on_shutdown=False)
    worker.life.begin()
    probed = []
    write = nodes.heartbeat

    def probed_while_written(**fields: Any) -> None:
        probed.append(worker_health(worker))
        write(**fields)

    monkeypatch.setattr(nodes, "heartbeat", probed_while_written)
    worker.node.beat()
    worker.node.beat()
    assert [(found.live, found.ready) for found in probed] == [(True, True), (True, True)]
    assert probed[0].detail == "starting" and "database away" not in probed[1].detail

    def refused(**fields: Any) -> None:
        raise DatabaseError("connection refused")

    monkeypatch.setattr(nodes, "heartbeat", refused)
    with pytest.raises(DatabaseError):
        worker.node.beat()
    found = worker_health(worker)
    assert (found.live, found.ready) == (True, False)
    assert "database away" in found.detail


@pytest.mark.django_db
def test_relay_health__not_ready_while_its_broker_refuses_rows() -> None:
    relay = Relay(listen=False)
    relay.life.begin()
    now = time.monotonic()
    relay.node.attempted = relay.node.written = now
    assert relay_health(relay, moment=now).ready
    relay.broker_reachable = False
    found = relay_health(relay, moment=now)
    assert (found.live, found.ready) == (True, False)
    assert "its broker could not be reached" in found.detail


# -- /healthz and /readyz ----------------------------------------------------------------------


@pytest.fixture
def exporter() -> Iterator[tuple[ProcessHealth, str]]:
    health = ProcessHealth()
    server = metrics.serve(0, "127.0.0.1", health=health)
    try:
        yield health, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.django_db
def test_exporter__answers_healthz_and_readyz_for_the_roles_of_its_process(
    exporter: tuple[ProcessHealth, str],
) -> None:
    health, base = exporter
    status, body = get(f"{base}/healthz")
    assert status == 503  # nothing running in this process yet
    assert json.loads(body) == {"status": "fail", "roles": []}

    scheduler = running_scheduler()
    scheduler.round_began = scheduler.round_ended = time.monotonic()
    health.watch(scheduler)
    status, body = get(f"{base}/healthz")
    assert status == 200
    [role] = json.loads(body)["roles"]
    assert (role["role"], role["live"], role["ready"]) == ("scheduler", True, True)
    assert get(f"{base}/readyz")[0] == 200

    scheduler.life.drain("test")  # draining: alive, no longer ready
    assert get(f"{base}/healthz")[0] == 200
    status, body = get(f"{base}/readyz")
    assert status == 503 and json.loads(body)["status"] == "fail"

    status, body = get(f"{base}/metrics")
    assert status == 200 and b"ultimat3_jobs_jobs" in body


# -- from the database -------------------------------------------------------------------------


def node(node_id: str, role: str, *, seen_ago: float = 0.0, **fields: Any) -> Node:
    now = timezone.now()
    return Node.objects.create(
        node_id=node_id,
        role=role,
        host="host",
        pid=1,
        started_at=now - timedelta(hours=1),
        last_seen_at=now - timedelta(seconds=seen_ago),
        **fields,
    )


def lease_for(node_id: str, seconds: float = 10) -> None:
    Lease.objects.create(
        name="scheduler", owner=node_id, expires_at=timezone.now() + timedelta(seconds=seconds)
    )


def leader(node_id: str = "s1", *, round_ago: float = 0.5, seen_ago: float = 0.5) -> Node:
    return node(
        node_id,
        "scheduler",
        seen_ago=seen_ago,
        leader="lease",
        is_leader=True,
        last_round_at=timezone.now() - timedelta(seconds=round_ago),
    )


def by_role(found: list[RoleHealth]) -> dict[str, RoleHealth]:
    return {role.role: role for role in found}


@pytest.mark.django_db
def test_database_health__a_leader_with_a_recent_round_and_a_worker_heard_from() -> None:
    leader()
    lease_for("s1")
    node("w1", "worker", seen_ago=1)
    found = by_role(database_health())
    assert set(found) == {"scheduler", "worker"}  # no relay runs: not asked about
    assert found["scheduler"].ready and found["worker"].ready
    assert found["scheduler"].detail.startswith("leader host:1 (lease), last round")


@pytest.mark.django_db
def test_database_health__a_leader_silent_past_three_heartbeats_is_not_alive() -> None:
    leader(round_ago=16, seen_ago=16)  # 3 x HEARTBEAT_INTERVAL (5 s) = 15 s
    lease_for("s1")
    found = by_role(database_health(roles=["scheduler"]))["scheduler"]
    assert (found.live, found.ready) == (False, False)
    assert "no scheduler heard from for" in found.detail


@pytest.mark.django_db
@pytest.mark.parametrize("skew_s", [-20.0, 300.0])
def test_database_health__a_leaders_last_round_is_judged_on_the_database_clock(
    skew_s: float,
) -> None:
    # A round keeps its node's instant: a leader 20 s behind the database, dispatching every
    # second, read as silent for 20 s (a probe would restart it again and again); one 5 min
    # ahead read "last round -299 s ago".
    now = timezone.now()
    node(
        "s1", "scheduler", leader="lease", is_leader=True, clock_skew_ms=int(skew_s * 1000),
        last_round_at=now + timedelta(seconds=skew_s - 0.5),
    )  # fmt: skip
    lease_for("s1")
    found = by_role(database_health(roles=["scheduler"]))["scheduler"]
    assert found.ready, found.detail
    age = float(found.detail.rsplit("last round ", 1)[1].split(" s ago")[0])
    assert 0 <= age < 5
    status = scheduler_status()
    # Its clock is warned about; no round is said to be missing.
    assert [w.message.split(" is ")[0] for w in status.warnings] == [
        "The clock of scheduler host:1"
    ]
    assert status.last_round_at is not None
    assert abs((status.last_round_at - now).total_seconds() + 0.5) < 0.1


@pytest.mark.django_db
def test_scheduler_status__is_judged_on_the_database_clock_whatever_the_viewers_says() -> None:
    # A viewer 30 s ahead saw the lease expired and "no leader"; 90 s behind, a silent
    # scheduler alive.
    leader()
    lease_for("s1")
    for ahead in (30, -90):
        with clock.use(FrozenClock(timezone.now() + timedelta(seconds=ahead))):
            status = scheduler_status()
        assert status.leader is not None and status.leader.node_id == "s1"
        assert status.warnings == []


@pytest.mark.django_db
def test_database_health__a_lease_another_node_holds_or_that_expired_is_lost_leadership() -> None:
    leader()
    lease_for("someone-else")
    found = by_role(database_health(roles=["scheduler"]))["scheduler"]
    assert not found.ready and "its lease expired or another node holds it" in found.detail


@pytest.mark.django_db
def test_database_health__standbys_without_a_leader_are_alive_not_ready() -> None:
    node("s2", "scheduler", leader="lease", is_leader=False)
    found = by_role(database_health(roles=["scheduler"]))["scheduler"]
    assert (found.live, found.ready) == (True, False)
    assert "none leads" in found.detail


@pytest.mark.django_db
def test_database_health__a_worker_or_relay_reporting_errors_is_not_ready() -> None:
    node("w1", "worker", last_error="connection refused")
    node("r1", "relay", last_error="3 failed passes")
    found = by_role(database_health(roles=["worker", "relay"]))
    assert (found["worker"].live, found["worker"].ready) == (True, False)
    assert "3 failed passes" in found["relay"].detail


@pytest.mark.django_db(transaction=True)
def test_database_health__a_draining_worker_is_alive_not_ready_from_its_drain_on() -> None:
    # Its own /readyz says so; a probe of the database (jobs_status --check) must too, at
    # once rather than at its next heartbeat.
    from testproject.demo.tasks import slow_ping

    worker = Worker(
        node_id="w-drain",
        listen=False,
        heartbeat_interval=timedelta(seconds=20),
        poll_interval=timedelta(seconds=0.05),
        drain_grace=timedelta(seconds=30),
    )
    slow_ping.enqueue({"label": "slow", "seconds": 2})
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not Node.objects.filter(node_id="w-drain").exists() or not worker._in_flight:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert by_role(database_health(roles=["worker"]))["worker"].ready
        worker.stop("SIGTERM", wait=False)
        deadline = time.monotonic() + 5
        while by_role(database_health(roles=["worker"]))["worker"].ready:
            assert time.monotonic() < deadline, "still ready while draining"
            time.sleep(0.02)
        found = by_role(database_health(roles=["worker"]))["worker"]
        assert (found.live, found.detail) == (True, "1 worker(s), each draining")
    finally:
        worker.stop("test")


@pytest.mark.django_db
def test_database_health__a_relay_is_asked_about_once_one_runs_or_crashed() -> None:
    leader()
    lease_for("s1")
    node("w1", "worker")
    node("r1", "relay", seen_ago=3600)  # crashed an hour ago: its row was never stopped
    found = by_role(database_health())
    assert not found["relay"].live


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_database_health__an_advisory_leader_whose_lock_is_gone_is_seen_at_once() -> None:
    from ultimat3_jobs.conf import get_settings

    node("s1", "scheduler", leader="advisory", is_leader=True, last_round_at=timezone.now())
    found = by_role(database_health(roles=["scheduler"]))["scheduler"]
    assert not found.ready and "its advisory lock is gone" in found.detail

    holder = dedicated_connection("default", "test advisory holder")
    try:
        holder.execute("SELECT pg_advisory_lock(%s)", [get_settings().advisory_lock_key])
        assert by_role(database_health(roles=["scheduler"]))["scheduler"].ready
    finally:
        holder.close()
    # The server ends the holder's session, and frees its lock, a moment after the close.
    deadline = time.monotonic() + 10
    while _advisory_locks_held() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not by_role(database_health(roles=["scheduler"]))["scheduler"].ready


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_database_health__the_leader_that_took_over_from_a_killed_one_is_the_one_asked_about() -> (
    None
):
    from ultimat3_jobs.conf import get_settings
    from ultimat3_jobs.leaders import leader_application

    # The killed leader's row still says it leads, heard from more recently than the new one.
    node("dead", "scheduler", leader="advisory", is_leader=True, last_round_at=timezone.now())
    node(
        "new", "scheduler", seen_ago=1, leader="advisory", is_leader=True,
        last_round_at=timezone.now(),
    )  # fmt: skip
    holder = dedicated_connection("default", leader_application("new"))
    try:
        holder.execute("SELECT pg_advisory_lock(%s)", [get_settings().advisory_lock_key])
        found = by_role(database_health(roles=["scheduler"]))["scheduler"]
        assert found.ready, found.detail
        assert found.detail.startswith("leader host:1 (advisory), last round")
    finally:
        holder.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_database_health__the_same_lock_held_in_another_database_is_not_this_leader_s() -> None:
    import psycopg

    from ultimat3_jobs.conf import get_settings

    node("s1", "scheduler", leader="advisory", is_leader=True, last_round_at=timezone.now())
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    # Another project's leader on the same server, in its own database, under the default key.
    elsewhere = psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)
    try:
        elsewhere.execute("SELECT pg_advisory_lock(%s)", [get_settings().advisory_lock_key])
        found = by_role(database_health(roles=["scheduler"]))["scheduler"]
        assert not found.ready and "its advisory lock is gone" in found.detail
    finally:
        elsewhere.close()


def _advisory_locks_held() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        (count,) = cursor.fetchone()
    return int(count)


# -- jobs_status --check ------------------------------------------------------------------------


def check(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("jobs_status", "--check", *argv, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue() + str(error)
    return 0, out.getvalue()


@pytest.mark.django_db
def test_jobs_status_check__exits_0_when_every_role_is_ready() -> None:
    leader()
    lease_for("s1")
    node("w1", "worker")
    code, text = check()
    assert code == 0, text
    assert text.splitlines()[0].startswith("scheduler: ok: leader host:1 (lease)")
    assert text.splitlines()[1] == "worker: ok: 1 worker(s) heard from"


@pytest.mark.django_db
def test_jobs_status_check__exits_1_naming_the_role_and_its_fix() -> None:
    node("w1", "worker")
    code, text = check()
    assert code == 1
    assert "scheduler: FAILED: no scheduler heard from (none is running)" in text
    assert "fix: start one with `python manage.py run_scheduler`" in text
    assert "not healthy: scheduler" in text
    assert check("--role", "worker")[0] == 0


@pytest.mark.django_db
def test_jobs_status_check__json() -> None:
    node("w1", "worker")
    code, text = check("--json", "--role", "worker")
    assert code == 0
    report = json.loads(text)
    assert report["healthy"] is True
    assert report["roles"][0]["role"] == "worker"


# -- django-health-check ------------------------------------------------------------------------


def test_health_check_plugin__a_database_it_cannot_read_is_said_with_the_code_and_fix(
    django_db_blocker: Any,
) -> None:
    import asyncio

    from health_check.exceptions import ServiceUnavailable

    from ultimat3_jobs.health_checks import Worker

    away = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": "1",  # Nothing listens: every connection is refused at once.
        "NAME": "nowhere",
        "OPTIONS": {},
    }
    connections.settings["away"] = away
    try:
        with django_db_blocker.unblock(), pytest.raises(ServiceUnavailable) as raised:
            asyncio.run(Worker(database="away").run())
    finally:
        connections["away"].close()
        del connections.settings["away"]
    said = str(raised.value)
    assert "the database could not be read (OperationalError) [jobs.database-unavailable]" in said
    assert "; fix: " in said


@pytest.mark.django_db
def test_health_check_plugin__the_scheduler_and_worker_checks_on_their_page() -> None:
    client = Client()
    response = client.get("/health/jobs/?format=json")
    assert response.status_code == 500
    answers = response.json()
    assert "no scheduler heard from" in answers["Scheduler(database='default')"]
    assert "no worker heard from" in answers["Worker(database='default')"]

    leader()
    lease_for("s1")
    node("w1", "worker")
    response = client.get("/health/jobs/?format=json")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "Scheduler(database='default')": "OK",
        "Worker(database='default')": "OK",
    }
    assert client.get("/health/jobs/").status_code == 200  # its HTML page


def _seen(node_id: str) -> tuple[Any, Any]:
    row = Node.objects.filter(node_id=node_id).values_list("last_seen_at", "last_round_at")
    return row.get() if row.exists() else (None, None)


@pytest.mark.django_db(transaction=True)
def test_loops__idle_past_their_heartbeat_interval_still_heartbeat_within_it() -> None:
    # A tick or a poll interval far longer than HEARTBEAT_INTERVAL (three of which the health
    # checks allow): the scheduler and the relay were judged dead while they rested.
    every = timedelta(seconds=0.2)
    state = DatabaseState(node_id="s-long-tick", leader="sole", heartbeat_interval=every)
    scheduler = Scheduler(
        state=state, leader=SoleLeader(), tasks=[], tick_interval=timedelta(seconds=60),
        drain_on_shutdown=False,
    )  # fmt: skip
    relay = Relay(node_id="r-long-poll", listen=False, poll_interval=timedelta(seconds=60))
    relay.node.every = every

    scheduler.start()
    try:
        with running(relay):
            time.sleep(0.5)
            first = _seen("s-long-tick"), _seen("r-long-poll")
            time.sleep(1.0)
            then = _seen("s-long-tick"), _seen("r-long-poll")
    finally:
        scheduler.stop("test")
    assert None not in (first[0][0], first[1][0])
    assert then[0][0] > first[0][0] and then[0][1] > first[0][1]  # rounds, each heard from
    assert then[1][0] > first[1][0]
