"""The README's quickstart in headless Chromium: ``make run``'s launcher on a free port, log in
with the login it prints, see a demo job succeed, press "Run now".

The tasks list screenshot is saved to ``artifacts/tasks-list.png``; with
``ULTIMAT3_UPDATE_DOCS=1`` (``make screenshot``) also to ``docs/tasks-list.png``, the one the
README shows, so a test run leaves the checkout as it found it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.acceptance.demo import Demo, start_demo

from .test_admin_browser import ARTIFACTS, chromium_path, page

__all__ = ["chromium_path", "page"]

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = start_demo(tmp_path)
    yield running
    if running.popen.poll() is None:
        running.stop()


def test_quickstart__log_in_see_a_demo_job_succeed_and_run_a_task_now(
    demo: Demo, page: Page
) -> None:
    username, password = demo.login(timeout=60)
    base = demo.base_url

    page.goto(f"{base}/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()

    # The ten-second task fires within ten seconds and the worker runs its job a moment later.
    jobs_url = f"{base}/admin/ultimat3_jobs/job/?status__exact=succeeded&name=demo.record_beat"
    for _ in range(30):
        page.goto(jobs_url)
        if page.locator("#result_list tbody tr").count():
            break
        page.wait_for_timeout(2000)
    succeeded = page.locator("#result_list tbody tr").first
    expect(succeeded).to_contain_text("demo.record_beat")
    expect(succeeded).to_contain_text("succeeded")
    expect(succeeded).to_contain_text("scheduler")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "quickstart-jobs.png"), full_page=True)

    page.goto(f"{base}/admin/ultimat3_jobs/task/")
    row = page.locator("#result_list tr", has_text="demo.every_ten_seconds")
    expect(row.locator("td.field-last_fired_column")).not_to_contain_text("never")
    expect(page.locator("#scheduler-status")).to_contain_text("Leader")
    page.screenshot(path=str(ARTIFACTS / "tasks-list.png"), full_page=True)
    if os.environ.get("ULTIMAT3_UPDATE_DOCS") == "1":
        DOCS.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS / "tasks-list.png"), full_page=True)

    row.get_by_role("link", name="Run now").click()
    expect(page.locator("h1")).to_have_text("Run demo.every_ten_seconds now?")
    page.get_by_role("button", name="Yes, run now").click()
    message = page.locator("ul.messagelist li.success")
    expect(message).to_contain_text("Ran demo.every_ten_seconds now: demo.record_beat")
    expect(message).to_contain_text("created")

    # The worker of `make run` runs the manual job too.
    manual_url = f"{base}/admin/ultimat3_jobs/job/?enqueued_by=admin%3A{username}"
    for _ in range(30):
        page.goto(manual_url)
        if re.search(r"\bsucceeded\b", page.locator("#result_list tbody").inner_text()):
            break
        page.wait_for_timeout(1000)
    manual = page.locator("#result_list tbody tr").first
    expect(manual).to_contain_text(f"admin:{username}")
    expect(manual).to_contain_text("succeeded")

    assert demo.stop() == 0, demo.output()[-3000:]
