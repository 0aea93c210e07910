"""``manage.py check`` messages: ids, wording, and the fix as the hint."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

from ultimat3_jobs import Entry
from ultimat3_jobs.checks import check_removed_tasks, check_settings
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
