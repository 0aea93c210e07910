"""The admin for Django Tasks: their return value and errors, and "Run now" of their schedule."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django_tasks import TaskResultStatus

from testproject.demo import background
from ultimat3_jobs.declarations import task
from ultimat3_jobs.models import Job
from ultimat3_jobs.models import Task as TaskRow
from ultimat3_jobs.registry import Registry
from ultimat3_jobs.state import DatabaseState

from .admin_support import JOBS_URL, logged_in, staff_user


def staff(*codenames: str) -> Client:
    return logged_in(staff_user("runner", *codenames))


def page_of(client: Client, job_id: str) -> str:
    url = reverse("admin:ultimat3_jobs_job_change", args=[job_id])
    return client.get(url).content.decode()


@pytest.mark.django_db(transaction=True)
def test_job_admin__shows_a_django_tasks_return_value_and_error() -> None:
    ok = background.send_email.enqueue(to="ops@example.com")
    bad = background.explode.enqueue(reason="admin")
    call_command("run_worker", "--burst", "--no-listen")
    client = staff("view_job")

    listing = client.get(JOBS_URL).content.decode()
    ok_page = page_of(client, ok.id)
    bad_page = page_of(client, bad.id)

    assert "{&quot;sent&quot;: &quot;ops@example.com&quot;}" in listing
    assert "builtins.ValueError" in listing
    assert "Django Task" in ok_page
    assert re.search(r"&quot;sent&quot;: &quot;ops@example.com&quot;", ok_page)
    assert "builtins.ValueError" in bad_page
    assert "exploded: admin" in bad_page  # the traceback


@pytest.mark.django_db
def test_job_admin__a_job_page_has_no_django_task_section() -> None:
    from ultimat3_jobs.registry import registry

    ping = registry.get_job("demo.ping")
    assert ping is not None
    result = ping.enqueue({"label": "x"})

    page = page_of(staff("view_job"), str(result.job_id))

    assert "Return value" not in page
    assert "Django Task" not in page


@pytest.mark.django_db(transaction=True)
def test_run_now__enqueues_a_schedules_django_tasks(fresh_registry: Registry) -> None:
    @task(cron="0 * * * *", tz="UTC", name="admintest.django")
    def hourly(occurrence: datetime) -> list[Any]:
        return [(background.add, {"a": 40, "b": 2})]

    DatabaseState(node_id="t", leader="sole").sync([hourly])
    row = TaskRow.objects.get(name="admintest.django")
    client = staff("view_task", "change_task", "run_task", "view_job")
    url = reverse("admin:ultimat3_jobs_task_run_one", args=[row.pk])

    confirm = client.get(url).content.decode()
    token = re.search(r'name="run_token" value="([^"]+)"', confirm)
    assert token, "no run token in the confirmation page"
    response = client.post(url, {"run_token": token.group(1)})

    assert "testproject.demo.background.add" in confirm
    assert response.status_code == 302
    [job] = Job.objects.filter(task="admintest.django")
    assert (job.backend, job.enqueued_by) == ("default", "admin:runner")
    call_command("run_worker", "--burst", "--no-listen")
    result = background.add.get_result(str(job.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
