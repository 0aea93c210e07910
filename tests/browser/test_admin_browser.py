"""The admin in headless Chromium against a live server: log in, see next runs, "Run now",
and delete a thousand removed tasks at once.

Chromium is Debian's package, driven by Playwright from PyPI; Playwright never downloads a
browser here. The test installs Chromium itself when it runs as root and it is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections
from playwright.sync_api import Page, expect, sync_playwright
from pytest_django.live_server_helper import LiveServer

from ultimat3_jobs import clock
from ultimat3_jobs.models import Job, Occurrence, Task
from ultimat3_jobs.registry import registry
from ultimat3_jobs.state import DatabaseState

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "a-browser-test-password"


def _install_chromium() -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(
            f"{CHROMIUM} is missing and this test cannot install it (not root, or no apt-get): "
            "install Debian's package with `sudo apt-get install -y chromium`, then rerun",
            pytrace=False,
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.fail(
                f"`{' '.join(command)}` failed ({done.returncode}) while installing Chromium:\n"
                f"{done.stderr[-2000:]}",
                pytrace=False,
            )
    if not CHROMIUM.exists():
        pytest.fail(f"apt-get installed chromium but {CHROMIUM} is still missing", pytrace=False)


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    """Debian's Chromium, installed on first use when we may."""
    if not CHROMIUM.exists():
        _install_chromium()
    return CHROMIUM


@pytest.fixture
def page(chromium_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Page]:
    # Playwright's sync API keeps an event loop in this thread, which Django's ORM would take
    # for async code; the test's own ORM calls are synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    monkeypatch.setenv("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": 1920, "height": 1000}, locale="en-US")
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()
            # Inside sync_playwright() Django's connections live in another contextvars
            # context, so the test's queries opened a connection of their own: close it, or
            # PostgreSQL refuses to drop the test database.
            connections.close_all()


@pytest.fixture
def operator() -> User:
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="ultimat3_jobs",
            codename__in=["view_task", "change_task", "run_task", "view_job", "view_occurrence"],
        )
    )
    return user


def test_admin_browser__run_now_from_the_tasks_list(
    live_server: LiveServer, page: Page, operator: User
) -> None:
    base = live_server.url
    state = DatabaseState(node_id="browser-test", leader="lease")
    state.sync([t for t in registry.tasks() if t.name.startswith("demo.")])
    # A real heartbeat, so the status box shows a leader and its last round.
    state.heartbeat(is_leader=True, round_at=clock.now(), error="")

    page.goto(f"{base}/admin/ultimat3_jobs/task/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")

    row = page.locator("#result_list tr", has_text="demo.nightly_digest")
    next_run = row.locator("td.field-next_run_column")
    expect(next_run).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d 03:00 CES?T"))
    expect(next_run).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d 0[12]:00 UTC"))
    expect(page.locator("#scheduler-status")).to_contain_text("Leader")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-tasks-list.png"), full_page=True)

    row.get_by_role("link", name="Run now").click()
    expect(page.locator("h1")).to_have_text("Run demo.nightly_digest now?")
    assert not Job.objects.exists()  # the confirmation page changes nothing
    page.screenshot(path=str(ARTIFACTS / "admin-run-now-confirmation.png"), full_page=True)
    page.get_by_role("button", name="Yes, run now").click()

    message = page.locator("ul.messagelist li.success")
    expect(message).to_contain_text("Ran demo.nightly_digest now: demo.send_digest")
    expect(message).to_contain_text("created")
    created = Job.objects.get()
    assert created.enqueued_by == "admin:operator"
    assert Occurrence.objects.get().user == "operator"

    page.goto(f"{base}/admin/ultimat3_jobs/job/")
    job_row = page.locator("#result_list tr", has_text=created.key)
    expect(job_row).to_contain_text("demo.send_digest")
    expect(job_row).to_contain_text("queued")
    expect(job_row).to_contain_text("admin:operator")
    page.screenshot(path=str(ARTIFACTS / "admin-jobs-list.png"), full_page=True)

    page.goto(f"{base}/admin/ultimat3_jobs/task/")
    page.locator("#result_list a", has_text="demo.nightly_digest").click()
    expect(page.locator("#next-runs tbody tr")).to_have_count(10)
    expect(page.locator("#history")).to_contain_text("manual")
    page.screenshot(path=str(ARTIFACTS / "admin-task-change.png"), full_page=True)


def test_admin_browser__select_all_of_a_thousand_removed_tasks_and_delete_them(
    live_server: LiveServer, page: Page
) -> None:
    User.objects.create_superuser("root", password=PASSWORD)
    Task.objects.bulk_create(
        Task(name=f"gone.{n:04}", cron="0 3 * * *", tz="UTC", declared=False) for n in range(1_100)
    )
    Task.objects.create(name="kept.declared", cron="0 3 * * *", tz="UTC")

    page.goto(f"{live_server.url}/admin/ultimat3_jobs/task/?declared__exact=0")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.check("#action-toggle")
    page.get_by_text("Select all 1100 tasks").click()
    page.select_option("select[name=action]", "delete_selected")
    page.get_by_role("button", name="Go").click()
    # Django's confirmation would post a field per task, past the 1,000 it accepts.
    page.get_by_role("button", name=re.compile("Yes, I.m sure")).click()

    expect(page.locator("ul.messagelist li.success")).to_contain_text("Successfully deleted 1100")
    assert list(Task.objects.values_list("name", flat=True)) == ["kept.declared"]
