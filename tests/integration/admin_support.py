"""What the admin tests share: a frozen instant, the demo tasks mirrored, staff who log in.

``frozen`` is an autouse fixture: a test module that imports it runs every test at ``NOW``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from ultimat3_jobs import clock, status
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.models import Task
from ultimat3_jobs.registry import registry
from ultimat3_jobs.state import DatabaseState

#: Noon in Paris on a Sunday; the next nightly digest is Monday 03:00 CET = 02:00 UTC.
NOW = datetime(2026, 3, 8, 12, 0, tzinfo=UTC)
DIGEST = "demo.nightly_digest"
TASKS_URL = "/admin/ultimat3_jobs/task/"
JOBS_URL = "/admin/ultimat3_jobs/job/"


@pytest.fixture(autouse=True)
def frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[FrozenClock]:
    frozen_clock = FrozenClock(NOW)
    # The scheduler's status reads the database's clock, as its rows are written on it.
    monkeypatch.setattr(status, "database_now", lambda using=None: frozen_clock())
    with clock.use(frozen_clock):
        yield frozen_clock


def mirror_demo_tasks() -> dict[str, Task]:
    """The demo declarations mirrored into the table, as a scheduler start does."""
    DatabaseState(node_id="t", leader="sole").sync(
        [t for t in registry.tasks() if t.name.startswith("demo.")]
    )
    return {t.name: t for t in Task.objects.all()}


def staff_user(username: str, *codenames: str) -> User:
    """A staff user holding exactly these permissions of the app."""
    user = User.objects.create_user(username, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="ultimat3_jobs", codename__in=codenames)
    )
    return user


def logged_in(user: User | None, *, csrf: bool = False) -> Client:
    """A test client, logged in as ``user`` (anonymous for None)."""
    client = Client(enforce_csrf_checks=csrf)
    if user is not None:
        client.force_login(user)
    return client


def delete_all(client: Client, listing: str, one: int) -> tuple[list[tuple[str, str]], Any]:
    """A "select all" on ``listing`` (a list URL with its filters), the action "Delete
    selected", then "Yes, I'm sure" as a browser posts it: the confirmation's hidden fields, and the
    answer to them. ``one``: the id of a row on the list's first page, which the select-all
    checks as a browser does."""
    selected = {"action": "delete_selected", "select_across": "1", "_selected_action": one}
    page = client.post(listing, selected).content.decode()
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
    return fields, client.post(listing, dict(fields))
