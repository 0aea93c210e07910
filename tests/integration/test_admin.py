"""The admin through Django's test client: permissions, CSRF, "Run now", pausing, jobs, status."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth.models import User
from django.contrib.messages import constants
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from django.utils.html import strip_tags

from ultimat3_jobs.admin import TaskAdmin, TaskPauseForm, filters
from ultimat3_jobs.clock import FrozenClock
from ultimat3_jobs.conf import get_settings
from ultimat3_jobs.db import dedicated_connection
from ultimat3_jobs.declarations import job, task
from ultimat3_jobs.humanize import describe_cron, descriptor_locale, duration
from ultimat3_jobs.leaders import leader_application
from ultimat3_jobs.models import CheckIn, Job, JobStatus, Lease, Node, Occurrence, Task
from ultimat3_jobs.registry import Registry, registry
from ultimat3_jobs.scheduler import Scheduler
from ultimat3_jobs.state import DatabaseState
from ultimat3_jobs.status import scheduler_status
from ultimat3_jobs.store import store_for

from .admin_support import (
    DIGEST,
    JOBS_URL,
    NOW,
    TASKS_URL,
    delete_all,
    frozen,
    logged_in,
    mirror_demo_tasks,
    staff_user,
)

__all__ = ["frozen"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def tasks() -> dict[str, Task]:
    return mirror_demo_tasks()


@pytest.fixture
def runner() -> User:
    """Staff who may see tasks and jobs and run tasks now."""
    return staff_user("runner", "view_task", "change_task", "run_task", "view_job", "change_job")


@pytest.fixture
def viewer() -> User:
    """Staff who may see and pause tasks, but not run them."""
    return staff_user("viewer", "view_task", "change_task", "view_job")


def run_url(task_row: Task) -> str:
    return reverse("admin:ultimat3_jobs_task_run_one", args=[task_row.pk])


def _messages(response: Any) -> list[tuple[int, str]]:
    return [(m.level, str(m)) for m in response.context["messages"]]


def _nothing_enqueued() -> bool:
    return not Job.objects.exists() and not Occurrence.objects.exists()


def _confirmed(client: Client, url: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``data`` plus the one-time token of the confirmation form at ``url``, as a submit sends."""
    data = dict(data or {})
    page = client.get(url, {"ids": data["ids"]} if "ids" in data else {}).content.decode()
    found = re.search(r'name="run_token" value="([^"]+)"', page)
    assert found, "no run token in the confirmation page"
    return {**data, "run_token": found.group(1)}


def _csrf_token(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


# -- "Run now": who may ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["get", "post"])
def test_run_now__anonymous_gets_403_and_nothing_runs(tasks: dict[str, Task], method: str) -> None:
    url = run_url(tasks[DIGEST])
    response = getattr(Client(), method)(url)

    assert response.status_code == 403
    assert _nothing_enqueued()


@pytest.mark.parametrize("method", ["get", "post"])
def test_run_now__staff_without_run_task_gets_403(
    tasks: dict[str, Task], viewer: User, method: str
) -> None:
    response = getattr(logged_in(viewer), method)(run_url(tasks[DIGEST]))

    assert response.status_code == 403
    assert _nothing_enqueued()


def test_run_now__non_staff_with_run_task_is_not_let_in(tasks: dict[str, Task]) -> None:
    user = staff_user("outsider", "run_task")
    user.is_staff = False
    user.save()

    response = logged_in(user).post(run_url(tasks[DIGEST]))

    assert response.status_code == 403
    assert _nothing_enqueued()


def test_run_now__button_only_for_run_task(
    tasks: dict[str, Task], viewer: User, runner: User
) -> None:
    change = reverse("admin:ultimat3_jobs_task_change", args=[tasks[DIGEST].pk])
    for page in (TASKS_URL, change):
        assert run_url(tasks[DIGEST]) not in logged_in(viewer).get(page).content.decode()
        assert run_url(tasks[DIGEST]) in logged_in(runner).get(page).content.decode()


def test_run_now__action_only_for_run_task(
    tasks: dict[str, Task], viewer: User, runner: User
) -> None:
    assert "run_selected" not in logged_in(viewer).get(TASKS_URL).content.decode()
    assert "run_selected" in logged_in(runner).get(TASKS_URL).content.decode()


# -- "Run now": GET confirms, POST runs ----------------------------------------------------


def test_run_now__get_shows_confirmation_and_changes_nothing(
    tasks: dict[str, Task], runner: User
) -> None:
    watermark = datetime(2026, 3, 8, 2, 0, tzinfo=UTC)
    Task.objects.filter(name=DIGEST).update(last_fired_at=watermark)

    response = logged_in(runner).get(run_url(tasks[DIGEST]))

    html = response.content.decode()
    assert response.status_code == 200
    assert 'value="Yes, run now"' in html
    assert "digest:2026-03-08" in html  # the key it would enqueue
    assert _nothing_enqueued()
    assert Task.objects.get(name=DIGEST).last_fired_at == watermark


def test_run_now__post_without_csrf_token_is_refused(tasks: dict[str, Task], runner: User) -> None:
    response = logged_in(runner, csrf=True).post(run_url(tasks[DIGEST]))

    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert _nothing_enqueued()


def test_run_now__post_with_csrf_enqueues_and_records_a_manual_occurrence(
    tasks: dict[str, Task], runner: User
) -> None:
    watermark = datetime(2026, 3, 8, 2, 0, tzinfo=UTC)
    Task.objects.filter(name=DIGEST).update(last_fired_at=watermark)
    client = logged_in(runner, csrf=True)
    page = client.get(run_url(tasks[DIGEST])).content.decode()
    token = _csrf_token(page)
    run_token = re.search(r'name="run_token" value="([^"]+)"', page)
    assert run_token

    response = client.post(
        run_url(tasks[DIGEST]), {"csrfmiddlewaretoken": token, "run_token": run_token.group(1)}
    )

    assert response.status_code == 302
    assert response["Location"] == TASKS_URL
    job_row = Job.objects.get()
    assert (job_row.name, job_row.key, job_row.enqueued_by) == (
        "demo.send_digest",
        "digest:2026-03-08",
        "admin:runner",
    )
    assert job_row.occurrence is None  # a plain key, not an occurrence's
    assert job_row.task == DIGEST  # so filtering jobs by task finds manual runs
    record = Occurrence.objects.get()
    assert (record.task, record.outcome, record.user, record.occurrence) == (
        DIGEST,
        "manual",
        "runner",
        NOW,
    )
    assert record.jobs == [{"job": "demo.send_digest", "key": "digest:2026-03-08", "created": True}]
    assert Task.objects.get(name=DIGEST).last_fired_at == watermark


def test_task_enqueue__from_code_records_a_manual_run_by_code_in_its_history(
    tasks: dict[str, Task], viewer: User
) -> None:
    from ultimat3_jobs.registry import registry

    handle = registry.get_task(DIGEST)
    assert handle is not None

    [result] = handle.enqueue()

    record = Occurrence.objects.get()
    assert (record.task, record.outcome, record.user, record.detail) == (
        DIGEST,
        "manual",
        "code",
        "task.enqueue()",
    )
    assert record.jobs == [{"job": result.job, "key": result.result.key, "created": True}]
    page = logged_in(viewer).get(
        reverse("admin:ultimat3_jobs_task_change", args=[tasks[DIGEST].pk])
    )
    [row] = page.context["history"]
    assert (row["outcome"], row["by"]) == ("manual", "code")


def test_task_enqueue__an_enqueued_by_longer_than_the_records_user_column_still_enqueues(
    tasks: dict[str, Task],
) -> None:
    from ultimat3_jobs.registry import registry

    handle = registry.get_task(DIGEST)
    assert handle is not None
    who = "service:" + "x" * 190  # 198 characters: a job row takes 200, a record's user 150

    [result] = handle.enqueue(enqueued_by=who)

    assert Job.objects.get(pk=result.result.job_id).enqueued_by == who
    record = Occurrence.objects.get()
    assert record.user == who[:150]


def test_run_now__message_names_each_created_job(tasks: dict[str, Task], runner: User) -> None:
    client = logged_in(runner)
    response = client.post(
        run_url(tasks[DIGEST]), _confirmed(client, run_url(tasks[DIGEST])), follow=True
    )

    job_id = Job.objects.get().pk
    [(level, text)] = _messages(response)
    assert level == constants.SUCCESS
    assert strip_tags(text) == (
        f"Ran demo.nightly_digest now: demo.send_digest #{job_id} (key digest:2026-03-08) created."
    )
    assert f'href="{reverse("admin:ultimat3_jobs_job_change", args=[job_id])}"' in text


def test_run_now__second_run_says_already_present(tasks: dict[str, Task], runner: User) -> None:
    client = logged_in(runner)
    url = run_url(tasks[DIGEST])
    client.post(url, _confirmed(client, url), follow=True)  # shows, and so consumes, its message

    response = client.post(url, _confirmed(client, url), follow=True)

    job_id = Job.objects.get().pk
    [(level, text)] = _messages(response)
    assert level == constants.WARNING
    assert strip_tags(text) == (
        f"Ran demo.nightly_digest now, nothing new: demo.send_digest #{job_id} "
        "(key digest:2026-03-08) already present, not enqueued again."
    )
    assert Occurrence.objects.filter(outcome="manual").count() == 2
    assert Occurrence.objects.first().jobs[0]["created"] is False  # type: ignore[union-attr]


def test_run_now__next_returns_to_the_change_page(tasks: dict[str, Task], runner: User) -> None:
    change = reverse("admin:ultimat3_jobs_task_change", args=[tasks[DIGEST].pk])

    client, url = logged_in(runner), run_url(tasks[DIGEST])
    response = client.post(url, _confirmed(client, url, {"next": change}))
    offsite = client.post(url, _confirmed(client, url, {"next": "https://evil.example/"}))

    assert response["Location"] == change
    assert offsite["Location"] == TASKS_URL


def test_run_now__task_error_is_shown_and_nothing_is_enqueued(
    fresh_registry: Registry, runner: User
) -> None:
    @job(name="admintest.noop")
    def noop() -> None:
        return None

    @task(cron="0 * * * *", tz="UTC", name="admintest.broken")
    def broken(occurrence: datetime) -> list[Any]:
        raise RuntimeError("the ledger is locked")

    DatabaseState(node_id="t", leader="sole").sync([broken])
    row = Task.objects.get(name="admintest.broken")

    client = logged_in(runner)
    page = client.get(run_url(row)).content.decode()
    response = client.post(run_url(row), _confirmed(client, run_url(row)), follow=True)

    assert "the ledger is locked" in page
    assert 'value="Yes, run now"' not in page
    [(level, text)] = _messages(response)
    assert level == constants.ERROR
    assert "Could not run admintest.broken:" in text
    assert "RuntimeError: the ledger is locked" in text
    assert 'Fix: fix the function of task "admintest.broken"' in unescape(strip_tags(text))
    assert _nothing_enqueued()


def test_run_now__task_without_entries_says_nothing_was_enqueued(
    fresh_registry: Registry, runner: User
) -> None:
    @task(cron="0 * * * *", tz="UTC", name="admintest.idle")
    def idle(occurrence: datetime) -> list[Any]:
        return []

    DatabaseState(node_id="t", leader="sole").sync([idle])
    row = Task.objects.get(name="admintest.idle")
    client = logged_in(runner)

    response = client.post(run_url(row), _confirmed(client, run_url(row)), follow=True)

    assert _messages(response) == [
        (
            constants.WARNING,
            "Ran admintest.idle now, but it returned no jobs: nothing was enqueued.",
        )
    ]
    assert not Job.objects.exists()
    assert Occurrence.objects.get().jobs == []


def test_run_now__removed_task_has_no_button_and_does_not_run(runner: User) -> None:
    row = Task.objects.create(name="gone.task", cron="0 3 * * *", tz="UTC", declared=False)

    client = logged_in(runner)
    listing = client.get(TASKS_URL).content.decode()
    response = client.post(run_url(row), _confirmed(client, run_url(row)), follow=True)

    assert run_url(row) not in listing
    [(level, text)] = _messages(response)
    assert level == constants.ERROR
    assert "Could not run gone.task: it is no longer declared in code." in text
    assert _nothing_enqueued()


def test_run_selected__confirms_then_runs_each_task(tasks: dict[str, Task], runner: User) -> None:
    client = logged_in(runner)
    ids = [tasks[DIGEST].pk, tasks["demo.quarter_hour_ping"].pk]

    chosen = client.post(TASKS_URL, {"action": "run_selected", "_selected_action": ids})
    assert chosen.status_code == 302
    assert _nothing_enqueued()  # the action only leads to the confirmation
    confirmation = client.get(chosen["Location"])
    assert confirmation.status_code == 200
    assert DIGEST in confirmation.content.decode()
    assert "demo.quarter_hour_ping" in confirmation.content.decode()
    assert _nothing_enqueued()

    url = reverse("admin:ultimat3_jobs_task_run")
    response = client.post(url, _confirmed(client, url, {"ids": ids}), follow=True)

    assert sorted(Job.objects.values_list("name", flat=True)) == ["demo.ping", "demo.send_digest"]
    texts = sorted(strip_tags(text) for _, text in _messages(response))
    assert texts[0].startswith("Ran demo.nightly_digest now: demo.send_digest")
    assert texts[1].startswith("Ran demo.quarter_hour_ping now: demo.ping")


def test_run_selected__more_than_a_hundred_tasks_is_refused_with_nothing_run(
    tasks: dict[str, Task], runner: User
) -> None:
    Task.objects.bulk_create(
        Task(name=f"family.{n:03}", cron="0 3 * * *", tz="UTC") for n in range(150)
    )
    client = logged_in(runner)
    one = Task.objects.filter(name__startswith="family.").first()
    assert one is not None

    response = client.post(
        f"{TASKS_URL}?q=family.",
        {"action": "run_selected", "select_across": "1", "_selected_action": one.pk},
        follow=True,
    )

    [(level, text)] = _messages(response)
    assert level == constants.WARNING
    assert text.startswith("Run now takes at most 100 tasks at a time; 150 were selected")
    assert _nothing_enqueued()


def test_run_selected__staff_without_run_task_cannot_trigger_it(
    tasks: dict[str, Task], viewer: User
) -> None:
    response = logged_in(viewer).post(
        TASKS_URL, {"action": "run_selected", "_selected_action": [tasks[DIGEST].pk]}
    )
    confirm = logged_in(viewer).post(reverse("admin:ultimat3_jobs_task_run"), {"ids": [1, 2]})

    assert response.status_code == 200  # the admin answers "no action selected"
    assert confirm.status_code == 403
    assert _nothing_enqueued()


# -- the tasks list and page ---------------------------------------------------------------


def test_task_list__shows_next_run_in_task_zone_and_utc(
    tasks: dict[str, Task], viewer: User
) -> None:
    html = logged_in(viewer).get(TASKS_URL).content.decode()

    row = html[html.index(">demo.nightly_digest<") :].split("</tr>")[0]
    assert "2026-03-09 03:00 CET" in row
    assert "2026-03-09 02:00 UTC" in row
    assert "in 14 h" in row
    assert "0 3 * * *" in row
    assert "At 03:00" in row
    assert "run-once" in row


def test_task_list__an_armed_task_that_never_fired_says_never(
    tasks: dict[str, Task], viewer: User
) -> None:
    # Arming puts the watermark just before the first occurrence, in the future.
    armed = NOW + timedelta(hours=14) - timedelta(milliseconds=1)
    Task.objects.filter(name=DIGEST).update(last_fired_at=armed)
    Task.objects.exclude(name=DIGEST).update(last_fired_at=NOW - timedelta(hours=1))
    fired = Task.objects.exclude(name=DIGEST).first()
    assert fired is not None
    hour_ago = NOW - timedelta(hours=1)
    Occurrence.objects.create(
        task=fired.name, outcome="fired", occurrence=hour_ago, recorded_at=hour_ago
    )
    html = logged_in(viewer).get(TASKS_URL).content.decode()
    row = html[html.index(f">{DIGEST}<") :].split("</tr>")[0]
    assert '<td class="field-last_fired_column">never</td>' in row
    # Its newest fired record, not the watermark: the others moved past dropped ones alone.
    assert html.count("1 h ago") == 1
    row = html[html.index(f">{fired.name}<") :].split("</tr>")[0]
    assert "1 h ago" in row


def test_task_list__filters_and_search(tasks: dict[str, Task], viewer: User) -> None:
    Task.objects.filter(name=DIGEST).update(paused=True, paused_note="ledger migration")
    client = logged_in(viewer)

    def names(query: str) -> list[str]:
        response = client.get(TASKS_URL + query)
        return [t.name for t in response.context["cl"].result_list]

    assert names("?paused__exact=1") == [DIGEST]
    assert names("?tz=America/New_York") == ["demo.quarter_hour_ping"]
    assert names("?q=ledger") == [DIGEST]
    assert names("?catch_up=run-once") == [DIGEST]


@pytest.mark.parametrize("tz", ["America", "Bogota", "localtime", ""])
def test_removed_task__a_stored_zone_this_version_refuses_shows_no_next_run(
    tasks: dict[str, Task], viewer: User, tz: str
) -> None:
    # "America" is a directory of the zone database: ZoneInfo raises IsADirectoryError for it.
    from ultimat3_jobs.overview import overview

    row = Task.objects.create(name="gone.odd", cron="0 3 * * *", tz=tz, declared=False)
    client = logged_in(viewer)

    listed = client.get(TASKS_URL)
    changed = client.get(reverse("admin:ultimat3_jobs_task_change", args=[row.pk]))

    assert listed.status_code == changed.status_code == 200
    row_html = listed.content.decode().split(">gone.odd<")[1].split("</tr>")[0]
    assert ">removed from code</span>" in row_html
    assert "will not run" not in row_html  # no next run to say it of
    [odd] = [t for t in overview()["tasks"] if t["name"] == "gone.odd"]
    assert odd["next_run"] is None


def test_task_list__paused_and_removed_tasks_say_they_will_not_run(
    tasks: dict[str, Task], viewer: User
) -> None:
    Task.objects.filter(name=DIGEST).update(paused=True, paused_note="ledger", paused_by="bob")
    Task.objects.create(name="gone.task", cron="0 3 * * *", tz="UTC", declared=False)

    html = logged_in(viewer).get(TASKS_URL).content.decode()

    paused = html.split(">demo.nightly_digest<")[1].split("</tr>")[0]
    assert "paused: will be skipped" in paused
    assert ">paused</span>" in paused
    assert "ledger (bob)" in paused
    gone = html.split(">gone.task<")[1].split("</tr>")[0]
    assert "removed from code: will not run" in gone
    assert ">removed from code</span>" in gone
    active = html.split(">demo.quarter_hour_ping<")[1].split("</tr>")[0]
    assert ">active</span>" in active
    assert "2026-03-09 03:00 UTC" in gone  # from the stored cron and zone


def test_task_change__previews_ten_runs_marking_a_dst_gap(
    fresh_registry: Registry, viewer: User, frozen: FrozenClock
) -> None:
    @job(name="admintest.noop")
    def noop() -> None:
        return None

    @task(cron="30 2 * * *", tz="Europe/Paris", name="admintest.half_past_two")
    def half_past_two(occurrence: datetime) -> list[Any]:
        return [(noop, {})]

    DatabaseState(node_id="t", leader="sole").sync([half_past_two])
    frozen.set(datetime(2026, 3, 25, 12, 0, tzinfo=UTC))
    row = Task.objects.get(name="admintest.half_past_two")

    response = logged_in(viewer).get(reverse("admin:ultimat3_jobs_task_change", args=[row.pk]))

    runs = response.context["next_runs"]
    assert len(runs) == 10
    assert [r["kind"] for r in runs].count("gap-shifted") == 1
    shifted = next(r for r in runs if r["kind"] == "gap-shifted")
    assert (shifted["local"], shifted["utc"]) == ("2026-03-29 03:00 CEST", "2026-03-29 01:00 UTC")
    html = response.content.decode()
    assert "DST gap: this slot does not exist, so it runs when the gap ends" in html
    assert "Wall-clock schedule" in html


def test_task_change__marks_a_repeated_hour(
    fresh_registry: Registry, viewer: User, frozen: FrozenClock
) -> None:
    @job(name="admintest.noop")
    def noop() -> None:
        return None

    @task(cron="30 * * * *", tz="Europe/Paris", name="admintest.hourly")
    def hourly(occurrence: datetime) -> list[Any]:
        return [(noop, {})]

    DatabaseState(node_id="t", leader="sole").sync([hourly])
    # Clocks go back at 03:00 CEST on 2026-10-25: 02:30 happens twice, and an hour field of
    # "*" makes the schedule real-time, so it runs on both passes.
    frozen.set(datetime(2026, 10, 24, 23, 15, tzinfo=UTC))
    row = Task.objects.get(name="admintest.hourly")

    response = logged_in(viewer).get(reverse("admin:ultimat3_jobs_task_change", args=[row.pk]))

    kinds = [(r["local"], r["kind"]) for r in response.context["next_runs"]]
    assert kinds[:4] == [
        ("2026-10-25 01:30 CEST", "normal"),
        ("2026-10-25 02:30 CEST", "repeated-first"),
        ("2026-10-25 02:30 CET", "repeated"),
        ("2026-10-25 03:30 CET", "normal"),
    ]
    assert "Repeated hour: second pass" in response.content.decode()
    assert "Repeated hour: first pass" in response.content.decode()


def test_task_change__history_lists_each_outcome_with_its_jobs(
    tasks: dict[str, Task], viewer: User
) -> None:
    existing = Job.objects.create(
        name="demo.send_digest", key="digest:2026-03-07", run_at=NOW, created_at=NOW
    )
    at = datetime(2026, 3, 7, 2, 0, tzinfo=UTC)
    common = {"task": DIGEST, "recorded_at": NOW}
    Occurrence.objects.create(
        outcome="fired",
        occurrence=at,
        last_occurrence=at,
        node="node-a",
        jobs=[{"job": "demo.send_digest", "key": existing.key, "created": True}],
        **common,
    )
    Occurrence.objects.create(
        outcome="dropped",
        occurrence=at - timedelta(days=3),
        last_occurrence=at - timedelta(days=1),
        count=3,
        **common,
    )
    Occurrence.objects.create(outcome="paused", occurrence=at, last_occurrence=at, **common)
    Occurrence.objects.create(
        outcome="manual",
        occurrence=NOW,
        user="alice",
        jobs=[{"job": "demo.send_digest", "key": existing.key, "created": False}],
        **common,
    )

    response = logged_in(viewer).get(
        reverse("admin:ultimat3_jobs_task_change", args=[tasks[DIGEST].pk])
    )

    history = response.context["history"]
    assert [h["outcome_label"] for h in history] == [
        "manual",
        "skipped (paused)",
        "dropped",
        "fired",
    ]
    assert history[0]["by"] == "alice"
    assert history[2]["count"] == 3
    assert history[2]["first"] == "2026-03-04 03:00:00 CET"
    assert history[2]["last"] == "2026-03-06 03:00:00 CET"
    assert history[3]["jobs"] == [
        {"job": "demo.send_digest", "key": existing.key, "created": True, "id": existing.pk}
    ]
    html = response.content.decode()
    assert reverse("admin:ultimat3_jobs_job_change", args=[existing.pk]) in html
    assert "already present" in html


def test_task_change__history_shows_each_occurrence_to_the_second(
    tasks: dict[str, Task], viewer: User
) -> None:
    task = "demo.every_ten_seconds"
    for seconds in (10, 20):
        at = NOW - timedelta(minutes=1) + timedelta(seconds=seconds)
        Occurrence.objects.create(
            task=task, outcome="fired", occurrence=at, last_occurrence=at, recorded_at=at
        )

    response = logged_in(viewer).get(
        reverse("admin:ultimat3_jobs_task_change", args=[tasks[task].pk])
    )

    assert [h["first"] for h in response.context["history"]] == [
        "2026-03-08 11:59:20 UTC",
        "2026-03-08 11:59:10 UTC",
    ]


# -- pausing is the only edit --------------------------------------------------------------


def _change(client: Client, row: Task, **data: Any) -> Any:
    url = reverse("admin:ultimat3_jobs_task_change", args=[row.pk])
    return client.post(url, {"paused_note": "", **data})


def test_task_pause__records_who_and_when(tasks: dict[str, Task], viewer: User) -> None:
    response = _change(
        logged_in(viewer), tasks[DIGEST], paused="on", paused_note="ledger migration"
    )

    assert response.status_code == 302
    row = Task.objects.get(name=DIGEST)
    assert (row.paused, row.paused_note, row.paused_by, row.paused_at) == (
        True,
        "ledger migration",
        "viewer",
        NOW,
    )


def test_task_pause__needs_a_note(tasks: dict[str, Task], viewer: User) -> None:
    response = _change(logged_in(viewer), tasks[DIGEST], paused="on")

    assert response.status_code == 200
    assert "Say why the task is paused." in response.content.decode()
    assert not Task.objects.get(name=DIGEST).paused


def test_task_resume__clears_the_pause(tasks: dict[str, Task], viewer: User) -> None:
    Task.objects.filter(name=DIGEST).update(
        paused=True, paused_note="x", paused_by="bob", paused_at=NOW
    )

    _change(logged_in(viewer), tasks[DIGEST])

    row = Task.objects.get(name=DIGEST)
    assert (row.paused, row.paused_note, row.paused_by, row.paused_at) == (False, "", "", None)


# The nightly digest (run-once, 03:00 Paris = 02:00 UTC) fired on 5 March, was paused that
# noon, and is resumed at NOW, 8 March noon: 6, 7 and 8 March came due while it was paused.
FIRED_5TH = datetime(2026, 3, 5, 2, 0, tzinfo=UTC)
PAUSED_5TH = datetime(2026, 3, 5, 12, 0, tzinfo=UTC)


def _resume_after(watermark: datetime, viewer: User, tasks: dict[str, Task]) -> Any:
    Task.objects.filter(name=DIGEST).update(
        last_fired_at=watermark, paused=True, paused_note="x", paused_by="bob", paused_at=PAUSED_5TH
    )
    return _change(logged_in(viewer), tasks[DIGEST])


def _round_after_resume(frozen: FrozenClock) -> list[Any]:
    frozen.advance(1)
    digest = registry.get_task(DIGEST)
    assert digest is not None
    scheduler = Scheduler(
        state=DatabaseState(node_id="s", leader="sole", clock=frozen),
        clock=frozen,
        tasks=[digest],
        drain_on_shutdown=False,
    )
    return list(scheduler.tick())


def test_task_resume__with_no_scheduler_records_what_came_due_while_paused_not_replayed(
    tasks: dict[str, Task], viewer: User, frozen: FrozenClock
) -> None:
    response = _resume_after(FIRED_5TH, viewer, tasks)

    [record] = Occurrence.objects.all()
    assert (record.outcome, record.count, record.occurrence, record.user) == (
        "paused",
        3,
        datetime(2026, 3, 6, 2, 0, tzinfo=UTC),
        "viewer",
    )
    assert Task.objects.get(name=DIGEST).last_fired_at == NOW
    assert "3 occurrence(s) of demo.nightly_digest came due while it was paused" in unescape(
        str(list(response.wsgi_request._messages))
    )
    assert _round_after_resume(frozen) == []  # run-once would have fired 6 March
    assert not Job.objects.exists()


def test_task_resume__an_occurrence_missed_before_the_pause_is_left_to_the_catch_up(
    tasks: dict[str, Task], viewer: User, frozen: FrozenClock
) -> None:
    _resume_after(FIRED_5TH - timedelta(days=1), viewer, tasks)  # 5 March was missed too

    assert not Occurrence.objects.exists()
    assert Task.objects.get(name=DIGEST).last_fired_at == FIRED_5TH - timedelta(days=1)
    [fired] = _round_after_resume(frozen)
    assert fired.occurrence == FIRED_5TH


def test_task_resume__what_a_leading_scheduler_s_rounds_recorded_is_not_recorded_again(
    tasks: dict[str, Task], viewer: User
) -> None:
    _node("leader", is_leader=True, last_round_at=NOW - timedelta(seconds=1))

    _resume_after(NOW - timedelta(seconds=1), viewer, tasks)  # its last round's watermark

    assert not Occurrence.objects.exists()
    assert Task.objects.get(name=DIGEST).last_fired_at == NOW - timedelta(seconds=1)


def test_task_resume__a_leader_killed_before_its_rounds_recorded_the_pause_is_not_waited_for(
    tasks: dict[str, Task], viewer: User, frozen: FrozenClock
) -> None:
    # Its node row still says it leads (SIGKILLed, it never said otherwise), and no round of
    # it recorded the three nights: resuming records them, or the next leader replays them.
    _node("leader", is_leader=True, last_round_at=NOW - timedelta(seconds=1))

    _resume_after(FIRED_5TH, viewer, tasks)

    [record] = Occurrence.objects.all()
    assert (record.outcome, record.count) == ("paused", 3)
    assert _round_after_resume(frozen) == []
    assert not Job.objects.exists()


def test_task_change__declaration_fields_are_read_only(
    tasks: dict[str, Task], viewer: User
) -> None:
    client = logged_in(viewer)
    _change(client, tasks[DIGEST], cron="* * * * *", tz="UTC", name="x", catch_up="skip")

    row = Task.objects.get(name=DIGEST)
    assert (row.cron, row.tz, row.catch_up) == ("0 3 * * *", "Europe/Paris", "run-once")
    assert client.get(TASKS_URL + "add/").status_code == 403


def test_task_pause__never_writes_back_a_watermark_the_scheduler_moved(
    tasks: dict[str, Task], viewer: User
) -> None:
    stale = Task.objects.get(name=DIGEST)  # as the admin loaded it
    moved = datetime(2026, 3, 8, 2, 0, tzinfo=UTC)
    Task.objects.filter(pk=stale.pk).update(last_fired_at=moved)  # the scheduler, meanwhile
    form = TaskPauseForm({"paused": "on", "paused_note": "n"}, instance=stale)
    assert form.is_valid()
    request = RequestFactory().post("/")
    request.user = viewer

    TaskAdmin(Task, site).save_model(request, form.save(commit=False), form, change=True)

    assert Task.objects.get(pk=stale.pk).last_fired_at == moved
    assert Task.objects.get(pk=stale.pk).paused


def _removed(name: str) -> Task:
    """A task no longer declared in code, with a record of its history and a check-in."""
    at = datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
    Occurrence.objects.create(task=name, outcome="fired", occurrence=at, recorded_at=at)
    CheckIn.objects.create(task=name, occurrence=at, status="ok", started_at=at, finished_at=at)
    return Task.objects.create(name=name, cron="0 3 * * *", tz="UTC", declared=False)


def test_task_delete__only_for_tasks_removed_from_code_and_their_records_stay(
    tasks: dict[str, Task],
) -> None:
    client = logged_in(User.objects.create_superuser("root"))
    gone = _removed("gone.task")
    url = reverse("admin:ultimat3_jobs_task_delete", args=[gone.pk])

    declared = client.get(reverse("admin:ultimat3_jobs_task_delete", args=[tasks[DIGEST].pk]))
    removed = client.post(url, {"post": "yes"})

    assert declared.status_code == 403
    assert removed.status_code == 302
    assert not Task.objects.filter(name="gone.task").exists()
    # The audit trail, pruned after RETENTION_DAYS like any other.
    assert Occurrence.objects.filter(task="gone.task").exists()
    assert CheckIn.objects.filter(task="gone.task").exists()


def test_task_delete_selected__refuses_a_selection_with_a_declared_task_and_deletes_nothing(
    tasks: dict[str, Task],
) -> None:
    client = logged_in(User.objects.create_superuser("root"))
    ids = [_removed("gone.a").pk, tasks[DIGEST].pk]
    before = Task.objects.count()

    page = client.post(TASKS_URL, {"action": "delete_selected", "_selected_action": ids})
    confirmed = client.post(
        TASKS_URL, {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    )

    assert "tasks still declared in code (remove their @task first)" in page.content.decode()
    assert confirmed.status_code == 403
    assert Task.objects.count() == before
    assert Occurrence.objects.filter(task="gone.a").exists()


def test_task_delete_selected__deletes_a_selection_of_tasks_removed_from_code(
    tasks: dict[str, Task],
) -> None:
    client = logged_in(staff_user("cleaner", "view_task", "delete_task"))
    ids = [_removed("gone.a").pk, _removed("gone.b").pk]
    _removed("gone.kept")

    client.post(TASKS_URL, {"action": "delete_selected", "_selected_action": ids, "post": "yes"})

    assert not Task.objects.filter(name__in=["gone.a", "gone.b"]).exists()
    assert Task.objects.filter(name="gone.kept").exists()
    assert set(tasks) <= set(Task.objects.values_list("name", flat=True))


def test_task_delete_selected__all_of_thousands_removed_from_code_in_one_confirmation(
    tasks: dict[str, Task],
) -> None:
    client = logged_in(User.objects.create_superuser("root"))
    Task.objects.bulk_create(
        Task(name=f"gone.{n:05}", cron="0 3 * * *", tz="UTC", declared=False) for n in range(1_500)
    )
    one = Task.objects.filter(declared=False).first()
    assert one is not None

    fields, confirmed = delete_all(client, f"{TASKS_URL}?declared__exact=0", one.pk)

    # Django refuses a form of more than 1,000 fields: one per task would never be accepted.
    assert len(fields) < 10
    assert confirmed.status_code == 302
    assert not Task.objects.filter(declared=False).exists()
    assert set(Task.objects.values_list("name", flat=True)) == set(tasks)


def test_delete_removed_tasks__a_task_declared_again_meanwhile_stays() -> None:
    gone = _removed("gone.back")
    selected = Task.objects.filter(pk=gone.pk)  # as the admin's confirmation page read it
    Task.objects.filter(pk=gone.pk).update(declared=True)  # a scheduler's sync, meanwhile

    deleted = store_for("default").delete_removed_tasks(selected)

    assert deleted == 0
    assert Task.objects.filter(pk=gone.pk).exists()


# -- jobs ----------------------------------------------------------------------------------


def _job(key: str, status: str = JobStatus.QUEUED, **fields: Any) -> Job:
    return Job.objects.create(
        name=fields.pop("name", "demo.ping"),
        key=key,
        status=status,
        run_at=NOW,
        created_at=NOW,
        **fields,
    )


def test_job_list__filters_by_status_task_and_queue(viewer: User) -> None:
    _job("a", JobStatus.FAILED, task=DIGEST, queue="mail")
    _job("b", JobStatus.QUEUED, task=DIGEST)
    _job("c", JobStatus.FAILED, queue="mail")
    client = logged_in(viewer)

    def keys(query: str) -> list[str]:
        return sorted(j.key for j in client.get(JOBS_URL + query).context["cl"].result_list)

    assert keys("?status__exact=failed") == ["a", "c"]
    assert keys(f"?task={DIGEST}") == ["a", "b"]
    assert keys("?queue=mail&status__exact=failed") == ["a", "c"]


def _filter_choices(response: Any, title: str) -> list[tuple[str, bool]]:
    """(display, selected) of the list filter ``title``, as its sidebar shows them."""
    changelist = response.context["cl"]
    [spec] = [spec for spec in changelist.filter_specs if spec.title == title]
    return [(str(c["display"]), c["selected"]) for c in spec.choices(changelist)]


def test_job_list__a_filter_lists_fifty_values_and_a_selected_one_whatever_its_count(
    viewer: User,
) -> None:
    for n in range(60):
        _job(f"k{n}", task=f"family.{n:02}")
    client = logged_in(viewer)

    listed = _filter_choices(client.get(JOBS_URL), "task")
    selected = client.get(JOBS_URL, {"task": "family.59"})

    assert listed[0] == ("All", True)
    assert [display for display, _ in listed[1:51]] == [f"family.{n:02}" for n in range(50)]
    assert listed[51:] == [("… more: search for task", False)]
    assert ("family.59", True) in _filter_choices(selected, "task")
    assert [job.key for job in selected.context["cl"].result_list] == ["k59"]
    found = client.get(JOBS_URL, {"q": "family.59"}).context["cl"].result_list
    assert [job.key for job in found] == ["k59"]


def test_job_list__a_filter_reads_its_values_from_the_latest_rows_only(
    viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filters, "RECENT_ROWS", 3)
    for n in range(3):
        _job(f"old{n}", queue="old")
    for n in range(3):
        _job(f"new{n}", queue="new")
    client = logged_in(viewer)

    listed = _filter_choices(client.get(JOBS_URL), "queue")
    old = client.get(JOBS_URL, {"queue": "old"})

    assert listed == [("All", True), ("new", False)]
    assert _filter_choices(old, "queue") == [("All", False), ("new", False), ("old", True)]
    assert sorted(job.key for job in old.context["cl"].result_list) == ["old0", "old1", "old2"]


@pytest.mark.postgres
def test_job_list__a_whole_big_table_counts_as_postgresqls_estimate_a_filtered_list_exactly(
    viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connection

    for n in range(5):
        _job(f"seen{n}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ultimat3_jobs_job")  # the estimate: 5 rows
    for n in range(3):
        _job(f"since{n}", JobStatus.FAILED)
    monkeypatch.setattr(filters, "ESTIMATE_FROM", 5)
    client = logged_in(viewer)

    whole = client.get(JOBS_URL).context["cl"]
    failed = client.get(JOBS_URL, {"status__exact": "failed"}).context["cl"]

    assert whole.result_count == 5  # not read row by row: the table holds 8
    assert len(whole.result_list) == 8
    assert failed.result_count == 3


def test_job_list__search_finds_key_input_and_error(viewer: User) -> None:
    _job("digest:2026-03-08", name="demo.send_digest", input={"day": "2026-03-08"})
    _job("p1", input={"label": "quarter-hour zebra"})
    _job("p2", JobStatus.FAILED, last_error="SMTPServerDisconnected: the relay hung up")
    client = logged_in(viewer)

    def keys(q: str) -> list[str]:
        response = client.get(JOBS_URL, {"q": q})
        return sorted(j.key for j in response.context["cl"].result_list)

    assert keys("digest:2026") == ["digest:2026-03-08"]
    assert keys("zebra") == ["p1"]
    assert keys("relay hung up") == ["p2"]


def test_job_retry__requeues_failed_jobs_with_fresh_attempts(
    runner: User, frozen: FrozenClock
) -> None:
    failed = _job(
        "f", JobStatus.FAILED, attempts=3, finished_at=NOW, worker="w1", last_error="boom"
    )
    running = _job("r", JobStatus.RUNNING, attempts=1)
    frozen.advance(60)

    response = logged_in(runner).post(
        JOBS_URL,
        {"action": "retry_failed", "_selected_action": [failed.pk, running.pk]},
        follow=True,
    )

    failed.refresh_from_db()
    assert (failed.status, failed.attempts, failed.finished_at, failed.worker) == (
        "queued",
        0,
        None,
        "",
    )
    assert failed.run_at == NOW + timedelta(seconds=60)
    assert failed.last_error == "boom"
    assert Job.objects.get(pk=running.pk).status == "running"
    [(level, text)] = _messages(response)
    assert (level, text) == (
        constants.WARNING,
        "Requeued 1 failed job. Left 1 alone: not failed (any more).",
    )


def test_job_cancel__cancels_queued_jobs_only(runner: User) -> None:
    queued = _job("q")
    running = _job("r", JobStatus.RUNNING)

    response = logged_in(runner).post(
        JOBS_URL,
        {"action": "cancel_queued", "_selected_action": [queued.pk, running.pk]},
        follow=True,
    )

    assert Job.objects.get(pk=queued.pk).status == "cancelled"
    assert Job.objects.get(pk=queued.pk).finished_at == NOW
    assert Job.objects.get(pk=running.pk).status == "running"
    assert "Cancelled 1 queued job." in _messages(response)[0][1]


@pytest.mark.parametrize(
    ("action", "status", "said"),
    [
        ("retry_failed", JobStatus.FAILED, "Requeued 2 failed jobs."),
        ("cancel_queued", JobStatus.QUEUED, "Cancelled 2 queued jobs."),
    ],
)
def test_job_actions__on_a_list_filtered_by_the_status_report_what_they_did(
    runner: User, action: str, status: str, said: str
) -> None:
    # The selection is the filtered list's: once its rows change status, it selects none.
    jobs = [_job(f"j{i}", status) for i in range(2)]

    response = logged_in(runner).post(
        f"{JOBS_URL}?status__exact={status}",
        {"action": action, "_selected_action": [job.pk for job in jobs]},
        follow=True,
    )

    assert _messages(response) == [(constants.SUCCESS, said)]


def test_job_search__finds_an_input_by_its_non_ascii_text(runner: User) -> None:
    # On SQLite the input is kept as JSON text with "ü" written "\u00fc".
    munich = _job("munich", input={"label": "München"})
    _job("munich-other", name="demo.other", input={"label": "München"})
    _job("paris", input={"label": "Paris"})
    client = logged_in(runner)

    def found(q: str) -> list[str]:
        listed = client.get(JOBS_URL, {"q": q}).context["cl"].result_list
        return sorted(job.key for job in listed)

    assert found("München") == ["munich", "munich-other"]
    assert found("MÜNCHEN") == ["munich", "munich-other"]
    assert found('"München"') == ["munich", "munich-other"]  # the admin's quoted phrase
    assert found("München demo.ping") == [munich.key]  # each word must match, as ever
    assert found("Zürich") == []


def test_job_actions__need_change_permission(viewer: User) -> None:
    failed = _job("f", JobStatus.FAILED)
    queued = _job("q")
    client = logged_in(viewer)

    listing = client.get(JOBS_URL).content.decode()
    for action in ("retry_failed", "cancel_queued"):
        client.post(JOBS_URL, {"action": action, "_selected_action": [failed.pk, queued.pk]})

    assert "retry_failed" not in listing
    assert "cancel_queued" not in listing
    assert Job.objects.get(pk=failed.pk).status == "failed"
    assert Job.objects.get(pk=queued.pk).status == "queued"


def test_job_change__is_read_only_even_with_change_permission(runner: User) -> None:
    row = _job("q", input={"label": "x"})
    client = logged_in(runner)
    url = reverse("admin:ultimat3_jobs_job_change", args=[row.pk])

    page = client.get(url)
    saved = client.post(url, {"key": "other", "status": "succeeded"})

    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert saved.status_code == 403
    assert (Job.objects.get(pk=row.pk).key, Job.objects.get(pk=row.pk).status) == ("q", "queued")
    assert client.get(JOBS_URL + "add/").status_code == 403


def test_history_and_node_admins__show_rows_read_only() -> None:
    root = User.objects.create_superuser("root")
    Occurrence.objects.create(task=DIGEST, outcome="paused", occurrence=NOW, recorded_at=NOW)
    Node.objects.create(
        node_id="n1", role="scheduler", host="h", pid=1, started_at=NOW, last_seen_at=NOW
    )
    client = logged_in(root)

    occurrences = client.get("/admin/ultimat3_jobs/occurrence/")
    nodes = client.get("/admin/ultimat3_jobs/node/")

    assert "skipped (paused)" in occurrences.content.decode()
    assert occurrences.context["cl"].result_count == 1
    assert nodes.context["cl"].result_count == 1
    assert client.get("/admin/ultimat3_jobs/occurrence/add/").status_code == 403
    assert 'name="_save"' not in client.get("/admin/ultimat3_jobs/node/n1/change/").content.decode()


# -- scheduler status ----------------------------------------------------------------------


def _node(node_id: str, **fields: Any) -> Node:
    defaults: dict[str, Any] = {
        "role": "scheduler",
        "host": f"{node_id}.internal",
        "pid": 100,
        "leader": "lease",
        "started_at": NOW - timedelta(hours=1),
        "last_seen_at": NOW - timedelta(seconds=2),
    }
    fields = {**defaults, **fields}
    if fields.get("is_leader") and fields["leader"] == "lease":
        # Its lease, as a leading node holds it: the status asks the database who leads.
        Lease.objects.update_or_create(
            name="scheduler", defaults={"owner": node_id, "expires_at": NOW + timedelta(minutes=30)}
        )
    return Node.objects.create(node_id=node_id, **fields)


def test_scheduler_status__names_the_live_leader_and_its_last_round() -> None:
    _node("old", is_leader=True, last_seen_at=NOW - timedelta(hours=1))  # crashed
    _node("a", is_leader=True, last_round_at=NOW - timedelta(seconds=3), clock_skew_ms=20)
    _node("b", is_leader=False)
    _node("w", role="worker")

    status = scheduler_status(NOW)

    assert status.leader is not None and status.leader.node_id == "a"
    assert [n.node_id for n in status.schedulers] == ["a", "b"]
    assert [n.node_id for n in status.workers] == ["w"]
    # On the database's clock: the round's instant less the skew its node measured then.
    assert status.last_round_at == NOW - timedelta(seconds=3, milliseconds=20)
    assert status.warnings == []


def test_scheduler_status__a_node_whose_lease_another_took_is_not_the_leader() -> None:
    # Its row says it leads (stopped with SIGSTOP, or killed): the lease says who does.
    _node("stale", is_leader=True, last_round_at=NOW - timedelta(seconds=3))
    Lease.objects.filter(name="scheduler").update(expires_at=NOW - timedelta(seconds=1))

    status = scheduler_status(NOW)

    assert status.leader is None
    [warning] = status.warnings
    assert warning.message.startswith(
        "The scheduler stale.internal:100 says it leads, but no longer holds its lease leadership"
    )


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("held_by", "leads"),
    [(None, False), ("a", True), ("other", False)],
    ids=["nobody", "its-own-connection", "another-node-s"],
)
def test_scheduler_status__an_advisory_leader_leads_while_its_connection_holds_the_lock(
    held_by: str | None, leads: bool
) -> None:
    # A SIGKILLed advisory leader loses its lock with its connection at once; its row says it
    # leads until it goes silent, and the next leader's connection is named for its own node.
    _node("a", is_leader=True, leader="advisory", last_round_at=NOW - timedelta(seconds=1))
    with contextlib.ExitStack() as held:
        if held_by is not None:
            conn = held.enter_context(dedicated_connection("default", leader_application(held_by)))
            conn.execute("SELECT pg_advisory_lock(%s)", [get_settings().advisory_lock_key])
        status = scheduler_status(NOW)
    assert (status.leader is not None) == leads
    assert any("says it leads" in w.message for w in status.warnings) == (not leads)


def test_scheduler_status__two_nodes_that_both_lead_are_named() -> None:
    # A deploy that moves from advisory to lease leaders: each node holds its own election.
    _node("adv", is_leader=True, leader="sole", last_round_at=NOW - timedelta(seconds=1))
    _node("lease", is_leader=True, last_round_at=NOW - timedelta(seconds=1))

    [warning] = scheduler_status(NOW).warnings

    assert warning.message.startswith("Schedulers ")
    assert "adv.internal:100 (sole)" in warning.message
    assert "lease.internal:100 (lease)" in warning.message
    assert warning.fix == "give every scheduler the same LEADER and ADVISORY_LOCK_KEY settings"


@override_settings(ULTIMAT3_JOBS={"STALE_ROUND_WARNING": 60})
def test_scheduler_status__warns_when_rounds_stopped() -> None:
    _node("a", is_leader=True, last_round_at=NOW - timedelta(seconds=61))

    [warning] = scheduler_status(NOW).warnings

    assert warning.message == (
        "No scheduler round for 61 s (warning after 60 s): tasks are not being dispatched."
    )
    assert "run_scheduler" in warning.fix


def test_scheduler_status__warns_when_no_scheduler_ever_ran() -> None:
    [warning] = scheduler_status(NOW).warnings

    assert warning.message == "No scheduler has run against this database yet."


@override_settings(ULTIMAT3_JOBS={"CLOCK_SKEW_WARNING": 1.0})
def test_scheduler_status__warns_about_a_skewed_clock() -> None:
    _node("a", is_leader=True, last_round_at=NOW, clock_skew_ms=-2500, host="db1", pid=7)
    _node("b", clock_skew_ms=900)

    [warning] = scheduler_status(NOW).warnings

    assert warning.message == (
        "The clock of scheduler db1:7 is 2.5 s behind the database (warning above 1 s)."
    )
    assert "NTP" in warning.fix


def test_scheduler_status__stopped_leader_does_not_lead() -> None:
    _node("a", is_leader=True, last_round_at=NOW, stopped_at=NOW - timedelta(seconds=1))

    assert scheduler_status(NOW).leader is None


def test_scheduler_status__every_scheduler_stopped_cleanly__warns_at_once() -> None:
    stopped = NOW - timedelta(seconds=2)
    _node("a", is_leader=True, last_round_at=stopped, last_seen_at=stopped, stopped_at=stopped)
    _node("b", last_seen_at=stopped, stopped_at=stopped - timedelta(seconds=1))

    status = scheduler_status(NOW)

    assert not status.healthy
    [warning] = status.warnings
    assert warning.message == (
        "No scheduler is running (the last one stopped 2 s ago): tasks are not being dispatched."
    )
    assert "run_scheduler" in warning.fix and "run_jobs" in warning.fix


def test_scheduler_status__the_only_scheduler_went_silent__names_when_it_was_heard_from() -> None:
    gone = NOW - timedelta(minutes=5)
    _node("a", is_leader=True, last_round_at=gone, last_seen_at=gone)

    [warning] = scheduler_status(NOW).warnings

    assert warning.message == (
        "No scheduler is running (the last one was last heard from 5 min ago): tasks are not "
        "being dispatched."
    )


@pytest.mark.parametrize("scheduler", ["never_ran", "stopped"])
def test_scheduler_status__the_start_fix_fits_any_project(scheduler: str) -> None:
    if scheduler == "stopped":
        _node("a", last_round_at=NOW, last_seen_at=NOW, stopped_at=NOW)

    [warning] = scheduler_status(NOW).warnings

    assert warning.fix == (
        "start one with `python manage.py run_scheduler`, or `python manage.py run_jobs` (the "
        "scheduler and a worker in one process)"
    )


def test_task_list__after_a_clean_stop_the_badge_needs_attention_at_once(
    tasks: dict[str, Task], viewer: User
) -> None:
    stopped = NOW - timedelta(seconds=1)
    _node("a", is_leader=True, last_round_at=stopped, last_seen_at=stopped, stopped_at=stopped)

    html = logged_in(viewer).get(TASKS_URL).content.decode()

    status = strip_tags(html[html.index('id="scheduler-status"') : html.index("</section>")])
    assert "Scheduler needs attention" in " ".join(status.split())
    assert "No scheduler is running (the last one stopped 1 s ago)" in status
    assert ">running<" not in html[html.index('id="scheduler-status"') : html.index("</section>")]


def test_task_list__shows_scheduler_status(tasks: dict[str, Task], viewer: User) -> None:
    _node("a", is_leader=True, last_round_at=NOW - timedelta(minutes=5), host="sched1", pid=42)

    html = logged_in(viewer).get(TASKS_URL).content.decode()

    status = html[html.index('id="scheduler-status"') : html.index("</section>")]
    assert "sched1:42" in status
    assert "2026-03-08 11:55:00 UTC (5 min ago)" in status
    assert "No scheduler round for 5 min" in status
    assert "needs attention" in status


# -- words ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 3 * * *", "At 03:00"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("0 9 * * 1-5", "At 09:00, Monday through Friday"),
        ("*/5 * * * * *", "Every 5 seconds"),
        ("0 0 L 2 *", "At 00:00, on the last day of the month, only in February"),
    ],
    ids=["daily", "step", "weekdays", "seconds_field", "last_day"],
)
def test_describe_cron__says_it_in_words(expr: str, words: str) -> None:
    assert describe_cron(expr, "en-us") == words


def test_describe_cron__follows_the_language() -> None:
    assert descriptor_locale("fr") == "fr_FR"
    assert descriptor_locale("xx") == "en_US"
    assert describe_cron("0 3 * * *", "de") != describe_cron("0 3 * * *", "en-us")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (45, "45 s"),
        (119, "119 s"),
        (720, "12 min"),
        (3 * 3600, "3 h"),
        (3 * 3600 + 300, "3 h 5 min"),
        (2 * 86400 + 4 * 3600, "2 d 4 h"),
    ],
)
def test_duration__is_short(seconds: int, text: str) -> None:
    assert duration(timedelta(seconds=seconds)) == text


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("listing", "statement_of", "index"),
    [
        # The failed jobs and their count, however many finished jobs the table keeps.
        (JOBS_URL + "?status__exact=failed", "'failed'", "u3j_job_failed"),
        (JOBS_URL + "?status__exact=cancelled", "'cancelled'", "u3j_job_failed"),
        # The history, newest first, however long it is (its filters read the newest rows by
        # id).
        ("/admin/ultimat3_jobs/occurrence/", '"recorded_at" DESC', "u3j_occ_recorded"),
        # The few records not of a fired occurrence, and their count.
        ("/admin/ultimat3_jobs/occurrence/?outcome__exact=dropped", "'dropped'", "u3j_occ_unfired"),
    ],
)
def test_lists__read_by_an_index_not_the_whole_table(
    listing: str, statement_of: str, index: str
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from .plans import plans_of

    Job.objects.create(
        name="demo.ping", key="k1", status=JobStatus.FAILED, run_at=NOW, created_at=NOW
    )
    Occurrence.objects.create(task=DIGEST, outcome="fired", occurrence=NOW, recorded_at=NOW)
    with CaptureQueriesContext(connection) as queries:
        response = logged_in(User.objects.create_superuser("root")).get(listing)
    assert response.status_code == 200
    reads = [q["sql"] for q in queries if statement_of in q["sql"]]
    assert reads
    for plan in plans_of(reads):
        assert index in plan
