"""What the app's commands do to the process they run in."""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command, get_commands, load_command_class
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from ultimat3_jobs.management.base import JobsCommand
from ultimat3_jobs.management.preflight import latest_migration

pytestmark = pytest.mark.django_db


def test_commands__every_command_of_the_app_is_a_jobs_command() -> None:
    ours = sorted(name for name, app in get_commands().items() if app == "ultimat3_jobs")
    assert "run_worker" in ours and "jobs_status" in ours
    others = [
        n for n in ours if not isinstance(load_command_class("ultimat3_jobs", n), JobsCommand)
    ]
    assert others == []


def test_commands__called_in_process__leave_the_callers_objects_to_the_collector() -> None:
    # Only a command that owns its process (run from the command line) freezes: a test or a
    # caller's code that runs one keeps its garbage collected.
    before = gc.get_freeze_count()
    call_command("jobs_status", stdout=io.StringIO())
    assert gc.get_freeze_count() == before


def test_commands__a_commands_module_loads_the_role_it_runs_only_once_it_runs() -> None:
    # Run from the command line, a command freezes the heap as it starts (JobsCommand); the
    # role's modules, imported by its methods after that, are left out of the full collection
    # their imports set off. Loaded with the command's module, they would be walked with all of
    # Django's setup. `jobs_status` runs no role at all (an exec probe runs it every few
    # seconds). A fresh process: this one has imported them already.
    program = (
        "import sys, django\n"
        "django.setup()\n"
        "before = set(sys.modules)\n"
        "from django.core.management import load_command_class\n"
        "for name in ('run_scheduler', 'run_worker', 'run_jobs', 'run_relay', 'jobs_status'):\n"
        "    load_command_class('ultimat3_jobs', name)\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", program],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "ultimat3_jobs.management.commands.run_worker" in loaded
    roles = {"management.roles", "scheduler", "state", "worker", "relay", "metrics"}
    assert sorted({f"ultimat3_jobs.{name}" for name in roles} & set(loaded)) == []


def test_role_commands__ready_keeps_an_early_signal_for_the_commands_that_run_a_role() -> None:
    from ultimat3_jobs.shutdown import ROLE_COMMANDS

    ours = [name for name, app in get_commands().items() if app == "ultimat3_jobs"]
    roles = {
        name
        for name in ours
        if getattr(load_command_class("ultimat3_jobs", name), "runs_until_signalled", False)
    }
    assert roles == ROLE_COMMANDS


@pytest.mark.django_db(transaction=True)
def test_role_commands__a_database_behind_this_release_is_said_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Started before `migrate` (a rolling deploy), a role ran on the older schema with nothing
    # said until something failed on it.
    latest = latest_migration()
    assert [("ultimat3_jobs", latest)] == MigrationLoader(None).graph.leaf_nodes("ultimat3_jobs")

    def said() -> list[dict[str, str]]:
        capsys.readouterr()
        call_command("run_scheduler", "--once", "--log-format", "json")
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
        return [line for line in lines if line["event"] == "jobs.database-behind"]

    recorded = MigrationRecorder.Migration.objects.filter(app="ultimat3_jobs", name=latest)
    applied = recorded.get()
    try:
        recorded.delete()
        [behind] = said()
    finally:
        applied.save()
    assert (behind["migration"], behind["fix"]) == (
        f"ultimat3_jobs.{latest}",
        "run: python manage.py migrate",
    )
    assert said() == []
