"""``manage.py check`` messages: ids, wording, and the fix as the hint."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

from ultimat3_jobs import Entry
from ultimat3_jobs.checks import REMOVED_TASKS_LISTED, check_removed_tasks, check_settings
from ultimat3_jobs.conf import get_settings
from ultimat3_jobs.errors import ConfigurationError
from ultimat3_jobs.leaders import ADVISORY_NEEDS_POSTGRES_FIX
from ultimat3_jobs.models import Task

ROOT = Path(__file__).resolve().parents[2]


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


@override_settings(ULTIMAT3_JOBS={})
def test_check_settings__defaults_are_clean() -> None:
    assert check_settings() == []


@override_settings(ULTIMAT3_JOBS={"MISFIRE_GRACE": 0.5, "TICK_INTERVAL": 2, "LEASE_TTL": 30})
def test_check_settings__grace_shorter_than_tick_warns() -> None:
    [warning] = check_settings()
    assert warning.id == "ultimat3_jobs.W001"
    assert "MISFIRE_GRACE" in (warning.hint or "")


@override_settings(ULTIMAT3_JOBS={"LEADER": "lease", "LEASE_TTL": 1, "TICK_INTERVAL": 1})
def test_check_settings__lease_ttl_not_longer_than_tick_is_an_error() -> None:
    assert ids(check_settings()) == ["ultimat3_jobs.E003"]


def test_check_settings__the_values_its_hints_suggest_pass_it_under_a_long_tick() -> None:
    given: dict[str, object] = {"LEADER": "lease", "TICK_INTERVAL": 120, "HEARTBEAT_INTERVAL": 120}
    with override_settings(ULTIMAT3_JOBS=given):
        found = check_settings()
    assert ids(found) == [
        "ultimat3_jobs.E003", "ultimat3_jobs.W001", "ultimat3_jobs.W013", "ultimat3_jobs.E004",
    ]  # fmt: skip
    for message in found:
        suggested = re.search(r'\["(\w+)"\].*e\.g\. ([\d.]+)', message.hint or "")
        assert suggested is not None, message.hint
        given[suggested[1]] = float(suggested[2])
    with override_settings(ULTIMAT3_JOBS=given):
        assert check_settings() == []


@override_settings(ULTIMAT3_JOBS={"LEADER": "lease", "TICK_INTERVAL": 30})
def test_check_settings__a_tick_longer_than_the_lease_is_fine_under_heartbeat_rounds() -> None:
    # A round at least once a heartbeat interval (5 s) renews the 10 s lease.
    assert check_settings() == []


@override_settings(ULTIMAT3_JOBS={"TICK_INTERVALL": 1})
def test_check_settings__unknown_key_is_reported_with_the_known_ones() -> None:
    [warning] = check_settings()
    assert warning.id == "ultimat3_jobs.W002"
    assert "TICK_INTERVALL" in warning.msg
    assert "TICK_INTERVAL" in (warning.hint or "")


@override_settings(ULTIMAT3_JOBS={"TICK_INTERVAL": -1})
def test_check_settings__bad_value_is_an_error_whose_hint_is_the_fix() -> None:
    [error] = check_settings()
    assert error.id == "ultimat3_jobs.E002"
    with pytest.raises(ConfigurationError) as caught:
        get_settings()
    assert error.hint == caught.value.fix


@override_settings(ULTIMAT3_JOBS={"STALE_ROUND_WARNING": 5, "TICK_INTERVAL": 5})
def test_check_settings__a_stale_round_warning_within_one_tick_warns() -> None:
    [warning] = check_settings()
    assert warning.id == "ultimat3_jobs.W013"
    assert "STALE_ROUND_WARNING (5s) is not longer than TICK_INTERVAL (5s)" in warning.msg


@pytest.mark.parametrize("queue", ["a, b", " padded"])
def test_check_queue_names__a_default_queue_no_worker_can_name_warns(queue: str) -> None:
    from ultimat3_jobs.checks import check_queue_names

    with override_settings(ULTIMAT3_JOBS={"DEFAULT_QUEUE": queue}):
        assert check_settings() == []
        warnings = check_queue_names()
    assert [w.id for w in warnings] == ["ultimat3_jobs.W014"]
    assert repr(queue) in warnings[0].msg


@pytest.mark.usefixtures("fresh_registry")
def test_check_queue_names__a_job_queue_no_worker_can_name_warns() -> None:
    from ultimat3_jobs import job
    from ultimat3_jobs.checks import check_queue_names

    @job(name="queues.split", queue="reports,emails")
    def split() -> None: ...

    @job(name="queues.fine", queue="reports")
    def fine() -> None: ...

    [warning] = check_queue_names()
    assert warning.id == "ultimat3_jobs.W014"
    assert warning.msg.startswith("job \"queues.split\" has queue 'reports,emails'")


@override_settings(ULTIMAT3_JOBS={"LEADER": "advisory"})
def test_check_settings__advisory_leader_needs_postgres() -> None:
    from django.db import connection

    messages = check_settings()
    if connection.vendor == "postgresql":
        assert messages == []
    else:
        [error] = messages
        assert error.id == "ultimat3_jobs.E001"
        assert error.hint == ADVISORY_NEEDS_POSTGRES_FIX


@pytest.mark.django_db
def test_check_removed_tasks__a_stored_task_no_longer_declared_warns() -> None:
    Task.objects.create(name="gone.nightly", cron="0 3 * * *", tz="UTC")
    [warning] = check_removed_tasks()
    assert warning.id == "ultimat3_jobs.W003"
    assert "gone.nightly" in warning.msg


@pytest.mark.django_db
def test_check_removed_tasks__past_ten_they_are_one_warning_with_their_count() -> None:
    Task.objects.bulk_create(
        Task(name=f"gone.{n:05}", cron="0 3 * * *", tz="UTC") for n in range(2_500)
    )

    [warning] = check_removed_tasks()

    assert warning.id == "ultimat3_jobs.W003"
    assert warning.msg.startswith("2,500 tasks are in the database but no longer declared")
    assert '"gone.00000", "gone.00001"' in warning.msg
    assert warning.msg.endswith('"gone.00009" and 2,490 more')
    assert 'filter "In code: No"' in (warning.hint or "")


@pytest.mark.django_db
def test_check_removed_tasks__ten_are_a_warning_each() -> None:
    Task.objects.bulk_create(
        Task(name=f"gone.{n}", cron="0 3 * * *", tz="UTC") for n in range(REMOVED_TASKS_LISTED)
    )

    warnings = check_removed_tasks()

    assert [w.msg.split('"')[1] for w in warnings] == [f"gone.{n}" for n in range(10)]


def test_manage_check__advisory_on_sqlite_exits_non_zero_with_id_and_hint(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "ULTIMAT3_JOBS": '{"LEADER": "advisory"}',
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ultimat3_jobs.E001" in result.stderr
    assert "HINT: " + ADVISORY_NEEDS_POSTGRES_FIX in result.stderr


@pytest.mark.usefixtures("fresh_registry")
def test_check_dst_options__real_time_schedule_with_options_warns() -> None:
    from ultimat3_jobs import task
    from ultimat3_jobs.checks import REAL_TIME_DST_FIX, check_dst_options

    @task(cron="*/15 * * * *", tz="Europe/London", name="dst.real", dst_repeat="both")
    def real(occurrence: datetime) -> list[Entry]:
        return []

    @task(cron="30 1 * * *", tz="Europe/London", name="dst.wall", dst_repeat="both")
    def wall(occurrence: datetime) -> list[Entry]:
        return []

    [warning] = check_dst_options()
    assert (warning.id, warning.hint) == ("ultimat3_jobs.W010", REAL_TIME_DST_FIX)
    assert '"dst.real"' in warning.msg


@pytest.mark.usefixtures("fresh_registry")
def test_check_overlap_of_relayed_entries__skip_on_an_engine_that_may_never_report_done() -> None:
    from celery.signals import task_success

    from testproject.demo import background
    from testproject.demo.celery_tasks import plain_row, write_row
    from ultimat3_jobs import task
    from ultimat3_jobs.celery import _plain_task_succeeded
    from ultimat3_jobs.checks import check_scheduled_jobs
    from ultimat3_jobs.relay_checks import UNREPORTED_CELERY_FIX, UNREPORTED_TASKS_FIX

    def check_overlap_of_relayed_entries() -> list[checks.CheckMessage]:
        return [m for m in check_scheduled_jobs() if m.id == "ultimat3_jobs.W007"]

    @task(cron="0 3 * * *", tz="UTC", name="checks.exclusive", overlap="skip")
    def exclusive(occurrence: datetime) -> list[Entry]:
        return [
            (background.elsewhere, {"label": "a"}),  # DummyBackend: no get_result
            (background.elsewhere, {"label": "b"}),  # the same task: said once
            (background.reported, {"label": "c"}),  # answers get_result
            (background.record_immediately, {"label": "d"}),  # runs inside enqueue()
            (write_row, {"occurrence": "e"}),  # ExactlyOnceTask: done in its transaction
            (plain_row, {"label": "f"}),  # plain, acknowledged late: its handlers mark it
        ]

    @task(cron="0 3 * * *", tz="UTC", name="checks.shared")
    def shared(occurrence: datetime) -> list[Entry]:
        return [(background.elsewhere, {"label": "g"})]  # overlap="allow": nothing to hold

    dummy = checks.Warning(
        'task "checks.exclusive" has overlap="skip" and schedules the Django Task '
        '"testproject.demo.background.elsewhere" on backend "elsewhere", which cannot say when '
        "a task finished (no supports_get_result): its row would stay relayed, and the task "
        "would never fire again",
        hint=UNREPORTED_TASKS_FIX,
        id="ultimat3_jobs.W007",
    )
    assert check_overlap_of_relayed_entries() == [dummy]

    plain_row.acks_late = False
    try:
        early = check_overlap_of_relayed_entries()
    finally:
        plain_row.acks_late = True
    assert early == [
        dummy,
        checks.Warning(
            'task "checks.exclusive" has overlap="skip" and schedules the plain Celery task '
            '"demo.plain_row", which acknowledges its message before running: a worker killed '
            "mid-task loses it, and nothing resends a plain task: its row would stay relayed, "
            "and the task would never fire again",
            hint=UNREPORTED_CELERY_FIX,
            id="ultimat3_jobs.W007",
        ),
    ]

    task_success.disconnect(_plain_task_succeeded)
    try:
        unheard = check_overlap_of_relayed_entries()
    finally:
        task_success.connect(_plain_task_succeeded)
    assert unheard == [
        dummy,
        checks.Warning(
            'task "checks.exclusive" has overlap="skip" and schedules the plain Celery task '
            '"demo.plain_row", whose end no handler records here (ultimat3_jobs.celery\'s '
            "signal handlers are not connected): its row would stay relayed, and the task "
            "would never fire again",
            hint=UNREPORTED_CELERY_FIX,
            id="ultimat3_jobs.W007",
        ),
    ]


@pytest.mark.usefixtures("fresh_registry")
def test_check_scheduled_jobs__runs_each_tasks_function_once_for_every_rule() -> None:
    # W004, W006 and W007 all read what a task schedules: one call serves them all, so a
    # project of many tasks does not pay for each function once a rule.
    from testproject.demo import background
    from testproject.demo.celery_tasks import write_row
    from ultimat3_jobs import task

    calls: list[datetime] = []

    @task(cron="0 3 * * *", tz="UTC", name="checks.counted", overlap="skip")
    def counted(occurrence: datetime) -> list[Entry]:
        calls.append(occurrence)
        # An input no job row could keep: the rules look at the jobs, not at the inputs.
        return [(background.elsewhere, {"label": float("nan")}), (write_row, {"occurrence": "x"})]

    messages = checks.run_checks()
    assert len(calls) == 1
    [overlap] = [m for m in messages if m.id == "ultimat3_jobs.W007"]
    assert '"checks.counted"' in overlap.msg


@pytest.mark.usefixtures("fresh_registry")
@override_settings(ULTIMAT3_JOBS={"SENTRY_CRONS": True})
def test_check_monitors__w011_counts_the_monitors_sentry_crons_leaves_out_none_of(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A per-second task under SENTRY_CRONS is no monitor (W012 names it): W011 counted it.
    from ultimat3_jobs import checkins, task
    from ultimat3_jobs.checks import check_monitors
    from ultimat3_jobs.registry import registry

    monkeypatch.setattr(checkins, "sentry_installed", lambda: False)

    @task(cron="* * * * * *", tz="UTC", name="mon.every_second")
    def every_second(occurrence: datetime) -> list[Entry]:
        return []

    @task(cron="0 3 * * *", tz="UTC", name="mon.nightly")
    def nightly(occurrence: datetime) -> list[Entry]:
        return []

    messages = {m.id: m.msg for m in check_monitors()}
    assert set(messages) == {"ultimat3_jobs.W011", "ultimat3_jobs.W012"}
    # As many as would be sent check-ins, were sentry-sdk there.
    monitors = checkins.watched_tasks(registry.tasks(), get_settings())
    assert "mon.nightly" in monitors and "mon.every_second" not in monitors
    said = f"{len(monitors)} task(s) are Sentry Crons monitors"
    assert messages["ultimat3_jobs.W011"].startswith(said)
    assert "mon.every_second" in messages["ultimat3_jobs.W012"]
