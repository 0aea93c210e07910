"""The app's database where ``DATABASE_ROUTERS`` send it: every place that names no database
means that one, not ``default``."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import load_command_class
from django.db import DEFAULT_DB_ALIAS
from django.test import override_settings
from django.utils.connection import ConnectionDoesNotExist

from ultimat3_jobs.backends import JobsBackend
from ultimat3_jobs.checks import judged_databases
from ultimat3_jobs.db import app_database
from ultimat3_jobs.management.preflight import not_migrated_fix
from ultimat3_jobs.status import scheduler_status
from ultimat3_jobs.store import store_for


class ToJobs:
    """Sends the app's models to an alias "jobs" (not in DATABASES here: a read of it fails,
    which tells where a read went)."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "jobs" if model._meta.app_label == "ultimat3_jobs" else None

    db_for_read = db_for_write

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return db == "jobs" if app_label == "ultimat3_jobs" else None


ROUTED = override_settings(DATABASE_ROUTERS=[f"{__name__}.ToJobs"])


def test_app_database__is_default_without_a_router_and_the_routed_one_with() -> None:
    assert app_database() == DEFAULT_DB_ALIAS
    with ROUTED:
        assert app_database() == "jobs"


@pytest.mark.parametrize(
    "command", ["run_scheduler", "run_worker", "run_relay", "jobs_status", "prune_jobs"]
)
def test_commands__default_to_the_app_database(command: str) -> None:
    with ROUTED:
        parser = load_command_class("ultimat3_jobs", command).create_parser("manage.py", command)
        assert parser.parse_args([]).database == "jobs"


def test_callers_that_name_no_database__go_where_the_router_sends_the_app() -> None:
    with ROUTED:
        assert JobsBackend("routed", {"QUEUES": ["default"]}).database == "jobs"
        with pytest.raises(ConnectionDoesNotExist):
            store_for()
        with pytest.raises(ConnectionDoesNotExist):
            scheduler_status()
    assert JobsBackend("plain", {"QUEUES": ["default"]}).database == DEFAULT_DB_ALIAS


def test_not_migrated_fix__names_the_database_to_migrate() -> None:
    assert not_migrated_fix("default") == "run: python manage.py migrate"
    assert not_migrated_fix("jobs") == "run: python manage.py migrate --database jobs"


def test_judged_databases__a_migrate_of_one_without_the_apps_tables_judges_the_apps() -> None:
    # ``migrate`` runs the checks on its target: the project's own database, the app routed
    # elsewhere, was refused for a leader it never serves.
    assert judged_databases([DEFAULT_DB_ALIAS]) == [DEFAULT_DB_ALIAS]
    with ROUTED:
        assert judged_databases([DEFAULT_DB_ALIAS]) == ["jobs"]
        assert judged_databases(["nowhere"]) == []
