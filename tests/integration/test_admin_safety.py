"""The admin refuses what would lose work: deleting live jobs, running twice, bad ids, a 500."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import constants
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from ultimat3_jobs import clock, job, task
from ultimat3_jobs.admin import bulk
from ultimat3_jobs.handles import JobHandle
from ultimat3_jobs.models import Job, JobStatus, Occurrence, RunToken, Task
from ultimat3_jobs.registry import registry
from ultimat3_jobs.state import DatabaseState

from .admin_support import (
    DIGEST,
    JOBS_URL,
    delete_all,
    frozen,
    logged_in,
    mirror_demo_tasks,
    staff_user,
)

__all__ = ["frozen"]

pytestmark = pytest.mark.django_db

RUN_URL = "/admin/ultimat3_jobs/task/run/"


@pytest.fixture
def demo_tasks() -> dict[str, Task]:
    return mirror_demo_tasks()


def _staff(*codenames: str) -> Client:
    return logged_in(staff_user(f"staff-{uuid.uuid4().hex[:8]}", *codenames))


def _runner() -> Client:
    return _staff("view_task", "change_task", "run_task", "view_job")


def _superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "x"))
    return client


def _job(status: str) -> Job:
    now = clock.now()
    return Job.objects.create(
        name="demo.ping",
        key=f"k:{uuid.uuid4().hex}",
        input={"label": status},
        status=status,
        run_at=now,
        created_at=now,
        finished_at=now if status in ("succeeded", "failed", "cancelled") else None,
    )


def _messages(response: Any) -> list[tuple[int, str]]:
    return [(m.level, strip_tags(str(m))) for m in response.context["messages"]]


def _form(client: Client, url: str, ids: list[int] | None = None) -> dict[str, Any]:
    """What submitting the confirmation form at ``url`` posts: its ids and one-time token."""
    page = client.get(url, {"ids": ids} if ids else {}).content.decode()
    token = re.search(r'name="run_token" value="([^"]+)"', page)
    assert token, "no run token in the confirmation page"
    return {"run_token": token.group(1), **({"ids": ids} if ids else {})}


# -- deleting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.RUNNING])
def test_job_delete__a_queued_or_running_job_cannot_be_deleted(status: str) -> None:
    row = _job(status)
    client = _superuser()
    url = reverse("admin:ultimat3_jobs_job_delete", args=[row.pk])

    assert client.get(url).status_code == 403
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=row.pk, status=status).exists()


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_job_delete__a_finished_job_can_be_deleted(status: str) -> None:
    row = _job(status)
    client = _staff("view_job", "delete_job")
    url = reverse("admin:ultimat3_jobs_job_delete", args=[row.pk])

    response = client.post(url, {"post": "yes"})

    assert response.status_code == 302
    assert not Job.objects.filter(pk=row.pk).exists()


def test_job_delete_selected__refuses_a_selection_with_live_jobs_and_deletes_nothing() -> None:
    live = [_job(JobStatus.QUEUED), _job(JobStatus.RUNNING)]
    done = _job(JobStatus.SUCCEEDED)
    client = _superuser()
    ids = [row.pk for row in [*live, done]]

    page = client.post(JOBS_URL, {"action": "delete_selected", "_selected_action": ids})
    confirmed = client.post(
        JOBS_URL, {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    )

    assert "queued or running jobs (cancel queued ones" in page.content.decode()
    assert confirmed.status_code == 403
    assert Job.objects.count() == 3


def test_job_delete_selected__deletes_a_selection_of_finished_jobs() -> None:
    done = [_job(JobStatus.SUCCEEDED), _job(JobStatus.FAILED)]
    kept = _job(JobStatus.QUEUED)
    client = _staff("view_job", "delete_job")

    client.post(
        JOBS_URL,
        {"action": "delete_selected", "_selected_action": [r.pk for r in done], "post": "yes"},
    )

    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]


def test_job_delete_selected__all_of_thousands_of_failed_jobs_in_one_confirmation() -> None:
    now = clock.now()
    Job.objects.bulk_create(
        Job(name="demo.ping", key=f"failed:{n}", status=JobStatus.FAILED, run_at=now,
            created_at=now, finished_at=now)
        for n in range(1_500)
    )  # fmt: skip
    kept = _job(JobStatus.QUEUED)
    one = Job.objects.filter(status=JobStatus.FAILED).first()
    assert one is not None

    fields, confirmed = delete_all(_superuser(), f"{JOBS_URL}?status__exact=failed", one.pk)

    # Django refuses a form of more than 1,000 fields: one per job would never be accepted.
    assert len(fields) < 10
    assert confirmed.status_code == 302
    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]


def test_job_delete_selected__past_its_limit_deletes_nothing_and_names_prune_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk, "DELETE_SELECTED_MAX", 3)
    done = [_job(JobStatus.SUCCEEDED) for _ in range(4)]

    response = _superuser().post(
        JOBS_URL,
        {"action": "delete_selected", "select_across": "1", "_selected_action": done[0].pk},
        follow=True,
    )

    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith("Delete takes at most 3 jobs at a time: nothing was deleted.")
    assert "manage.py prune_jobs --days N" in message
    assert Job.objects.count() == 4


def test_occurrence_records__cannot_be_deleted_even_by_a_superuser(
    demo_tasks: dict[str, Task],
) -> None:
    client = _superuser()
    url = reverse("admin:ultimat3_jobs_task_run_one", args=[demo_tasks[DIGEST].pk])
    client.post(url, _form(client, url))
    record = Occurrence.objects.get()

    delete = reverse("admin:ultimat3_jobs_occurrence_delete", args=[record.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    listing = client.get("/admin/ultimat3_jobs/occurrence/").content.decode()
    assert "delete_selected" not in listing
    assert Occurrence.objects.filter(pk=record.pk).exists()


# -- Run now --------------------------------------------------------------------------------------


def test_run_now__the_confirmation_of_a_paused_task_says_it_is_paused(
    demo_tasks: dict[str, Task],
) -> None:
    Task.objects.filter(name=DIGEST).update(paused=True, paused_note="ledger migration")
    url = reverse("admin:ultimat3_jobs_task_run_one", args=[demo_tasks[DIGEST].pk])

    page = strip_tags(_runner().get(url).content.decode())
    active = reverse(
        "admin:ultimat3_jobs_task_run_one", args=[demo_tasks["demo.quarter_hour_ping"].pk]
    )
    active_page = strip_tags(_runner().get(active).content.decode())

    assert "This task is paused" in page
    assert "Running it now still enqueues its jobs; it stays paused." in page
    assert "This task is paused" not in active_page


def test_run_now__submitting_one_confirmation_twice_enqueues_once(
    demo_tasks: dict[str, Task],
) -> None:
    client = _runner()
    url = reverse("admin:ultimat3_jobs_task_run_one", args=[demo_tasks[DIGEST].pk])
    form = _form(client, url)

    first = client.post(url, form, follow=True)
    second = client.post(url, form, follow=True)

    assert Job.objects.count() == 1
    assert Occurrence.objects.filter(outcome="manual").count() == 1
    assert _messages(first)[0][0] == constants.SUCCESS
    assert second.redirect_chain[0][0] == "/admin/ultimat3_jobs/task/"
    assert _messages(second) == [
        (constants.WARNING, "This confirmation was already submitted: nothing was run again.")
    ]
    assert RunToken.objects.count() == 1


@pytest.mark.parametrize(
    "token", ["", "forged", "other-tasks"], ids=["missing", "forged", "other_tasks"]
)
def test_run_now__a_post_without_a_good_token_runs_nothing_and_asks_again(
    demo_tasks: dict[str, Task], token: str
) -> None:
    client = _runner()
    url = reverse("admin:ultimat3_jobs_task_run_one", args=[demo_tasks[DIGEST].pk])
    if token == "other-tasks":
        other = reverse(
            "admin:ultimat3_jobs_task_run_one", args=[demo_tasks["demo.quarter_hour_ping"].pk]
        )
        token = _form(client, other)["run_token"]

    response = client.post(url, {"run_token": token})

    assert response.status_code == 200  # the confirmation again, with a fresh token
    assert 'value="Yes, run now"' in response.content.decode()
    [(level, text)] = _messages(response)
    assert level == constants.WARNING
    assert "nothing was run" in text
    assert not Job.objects.exists()


def test_run_selected__one_failing_task_is_reported_and_the_others_run(
    fresh_registry: Any,
) -> None:
    @job(name="safety.fine", key="fine:{n}")
    def fine(n: int) -> None: ...

    def key_that_raises(data: dict[str, Any]) -> str:
        raise LookupError("no such tenant")

    @job(name="safety.raising_key", key=key_that_raises)
    def raising_key(n: int) -> None: ...

    @job(name="safety.loose", key="loose:{day}")
    def loose(**options: Any) -> None: ...

    produced: dict[str, list[tuple[JobHandle, dict[str, Any]]]] = {
        "safety.a_good": [(fine, {"n": 1})],
        "safety.b_key_raises": [(raising_key, {"n": 1})],
        "safety.c_field_missing": [(loose, {})],
        "safety.d_good_too": [(fine, {"n": 2})],
    }

    def declare(name: str) -> Any:
        def entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
            return produced[name]

        return task(cron="0 * * * *", tz="UTC", name=name)(entries)

    handles = [declare(name) for name in produced]
    DatabaseState(node_id="t", leader="sole").sync(handles)
    ids = sorted(Task.objects.filter(name__in=produced).values_list("pk", flat=True))
    client = _runner()

    response = client.post(RUN_URL, _form(client, RUN_URL, ids), follow=True)

    assert response.status_code == 200
    assert sorted(Job.objects.values_list("key", flat=True)) == ["fine:1", "fine:2"]
    levels = {
        name: [level for level, text in _messages(response) if name in text] for name in produced
    }
    assert levels == {
        "safety.a_good": [constants.SUCCESS],
        "safety.b_key_raises": [constants.ERROR],
        "safety.c_field_missing": [constants.ERROR],
        "safety.d_good_too": [constants.SUCCESS],
    }
    errors = " ".join(text for level, text in _messages(response) if level == constants.ERROR)
    assert "no such tenant" in errors
    assert "Nothing was enqueued" in errors


@pytest.mark.parametrize("bad", ["²", "1" * 25, "١٢", "-1", "1e3"])
def test_run_now__bad_ids_answer_404(demo_tasks: dict[str, Task], bad: str) -> None:
    client = _runner()

    one = client.get(f"/admin/ultimat3_jobs/task/{bad}/run/")
    many = client.get(RUN_URL, {"ids": [str(demo_tasks[DIGEST].pk), bad]})
    posted = client.post(RUN_URL, {"ids": [bad]})

    assert (one.status_code, many.status_code, posted.status_code) == (404, 404, 404)
    assert not Job.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_run_now__two_simultaneous_submits_of_one_form_enqueue_once() -> None:
    import threading

    from django.db import connections

    DatabaseState(node_id="t", leader="sole").sync(
        [t for t in registry.tasks() if t.name.startswith("demo.")]
    )
    row = Task.objects.get(name=DIGEST)
    url = reverse("admin:ultimat3_jobs_task_run_one", args=[row.pk])
    client = _runner()
    form = _form(client, url)
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def submit() -> None:
        try:
            barrier.wait()
            statuses.append(client.post(url, form).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert statuses == [302, 302]
    assert Job.objects.count() == 1
    assert Occurrence.objects.filter(outcome="manual").count() == 1
