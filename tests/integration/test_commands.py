"""What the app's commands do to the process they run in."""

from __future__ import annotations

import gc
import io

import pytest
from django.core.management import call_command, get_commands, load_command_class

from ultimat3_jobs.management.base import JobsCommand

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
