"""Relayed jobs in the admin: their columns, the stuck warning, Run now and the actions."""

from __future__ import annotations

from datetime import datetime, timedelta
from html import unescape
from typing import Any

import pytest
from django.contrib.messages import constants
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from testproject.demo import celery_tasks
from ultimat3_jobs import clock
from ultimat3_jobs.declarations import task
from ultimat3_jobs.engines import celery_task_id
from ultimat3_jobs.manual import run_now
from ultimat3_jobs.models import Job
from ultimat3_jobs.outbox import celery_task_handle
from ultimat3_jobs.registry import Registry
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.status import scheduler_status
from ultimat3_jobs.store import store_for

from .admin_support import JOBS_URL, NOW, frozen, logged_in, staff_user

__all__ = ["frozen"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    return logged_in(
        staff_user("ops", "view_task", "change_task", "run_task", "view_job", "change_job")
    )


def outbox_row(label: str, *, relayed_ago: timedelta | None = None) -> Job:
    """An outbox row of the plain Celery task, relayed ``relayed_ago`` before NOW if given."""
    handle = celery_task_handle(celery_tasks.plain_row)
    result = handle.enqueue({"label": label}, key=f"k:{label}")
    job = Job.objects.get(pk=result.job_id)
    if relayed_ago is not None:
        store_for("default").record_relayed(
            job_id=job.pk,
            engine_id=celery_task_id(job.key),
            now=NOW - relayed_ago,
        )
        job.refresh_from_db()
    return job


def page_text(response: Any) -> str:
    return " ".join(unescape(strip_tags(response.content.decode())).split())


def _messages(response: Any) -> list[tuple[int, str]]:
    return [(m.level, str(m)) for m in response.context["messages"]]


def test_job_page__a_relayed_job_shows_where_it_went_and_when(staff: Client) -> None:
    job = outbox_row("seen", relayed_ago=timedelta(seconds=30))
    store_for("default").relayed_done(job_id=job.pk, now=NOW)
    text = page_text(staff.get(reverse("admin:ultimat3_jobs_job_change", args=[job.pk])))
    assert "Relayed at" in text and "Done at" in text
    assert celery_task_id(job.key) in text
    assert "celery" in text


def test_job_page__a_job_our_worker_runs_has_no_relay_section(staff: Client) -> None:
    from testproject.demo.tasks import ping

    result = ping.enqueue({"label": "ours"})
    response = staff.get(reverse("admin:ultimat3_jobs_job_change", args=[result.job_id]))
    assert response.status_code == 200
    assert "Relayed at" not in page_text(response)


def test_jobs_list__warns_about_relayed_jobs_not_done_in_time(staff: Client) -> None:
    outbox_row("young", relayed_ago=timedelta(seconds=30))
    quiet = staff.get(JOBS_URL)
    assert not [m for m in _messages(quiet) if m[0] == constants.WARNING]
    outbox_row("old", relayed_ago=timedelta(hours=1))
    response = staff.get(JOBS_URL)
    [(_, text)] = [m for m in _messages(response) if m[0] == constants.WARNING]
    assert "1 relayed job has not been done after 15 min" in text
    assert "run_relay" in text
    assert "via celery" in page_text(response)


def test_status__counts_stuck_relayed_jobs_among_its_warnings() -> None:
    outbox_row("a", relayed_ago=timedelta(hours=2))
    outbox_row("b", relayed_ago=timedelta(hours=2))
    DatabaseState(node_id="n", leader="sole").sync([])
    messages = [w.message for w in scheduler_status(NOW).warnings]
    assert "2 relayed jobs have not been done after 15 min." in messages


def test_run_now__a_task_whose_entry_is_a_celery_task_writes_an_outbox_row(
    fresh_registry: Registry,
) -> None:
    @task(cron="0 3 * * *", tz="UTC", name="relay.admin.nightly")
    def nightly(occurrence: datetime) -> list[Any]:
        return [(celery_tasks.plain_row, {"label": occurrence.date().isoformat()})]

    run = run_now(nightly, user="ops")
    [entry] = run.created
    job = Job.objects.get(pk=entry.result.job_id)
    assert (job.status, job.relay, job.enqueued_by, job.task) == (
        "outbox",
        "celery",
        "admin:ops",
        "relay.admin.nightly",
    )
    assert job.input == {"label": "2026-03-08"}


def test_actions__cancel_an_unsent_outbox_row_and_retry_a_failed_one(staff: Client) -> None:
    waiting = outbox_row("waiting")
    failed = outbox_row("failed", relayed_ago=timedelta(seconds=5))
    store_for("default").relayed_done(job_id=failed.pk, now=NOW, ok=False, error="boom")
    staff.post(JOBS_URL, {"action": "cancel_queued", "_selected_action": [waiting.pk]})
    staff.post(JOBS_URL, {"action": "retry_failed", "_selected_action": [failed.pk]})
    waiting.refresh_from_db()
    failed.refresh_from_db()
    assert waiting.status == "cancelled"
    assert (failed.status, failed.done_at, failed.relayed_at) == ("outbox", None, None)


def test_status__counts_live_relays(staff: Client) -> None:
    from ultimat3_jobs import nodes

    DatabaseState(node_id="n", leader="sole").sync([])
    nodes.heartbeat(using="default", node_id="relay-1", role="relay", started_at=NOW)
    status = scheduler_status(clock.now())
    assert [n.node_id for n in status.relays] == ["relay-1"]
    text = page_text(staff.get("/admin/ultimat3_jobs/task/"))
    assert "1 relay" in text
