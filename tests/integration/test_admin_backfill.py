"""The admin's backfill page and the overlap policy on the task page, through the test client."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import constants
from django.test import Client
from django.urls import reverse
from django.utils.html import strip_tags

from ultimat3_jobs.models import Job, Occurrence, Task

from .admin_support import DIGEST, NOW, frozen, logged_in
from .test_admin import _csrf_token, _messages, _nothing_enqueued, runner, tasks, viewer

__all__ = ["frozen", "runner", "tasks", "viewer"]

pytestmark = pytest.mark.django_db

QUARTER = "demo.quarter_hour_ping"
#: Three nightly digests: 03:00 CET on March 5, 6 and 7 (02:00 UTC).
RANGE = {"start": "2026-03-05", "end": "2026-03-07T23:00"}


def backfill_url(row: Task) -> str:
    return reverse("admin:ultimat3_jobs_task_backfill", args=[row.pk])


def change_url(row: Task) -> str:
    return reverse("admin:ultimat3_jobs_task_change", args=[row.pk])


def text(response: object) -> str:
    return " ".join(unescape(strip_tags(response.content.decode())).split())  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["get", "post"])
def test_backfill__anonymous_and_staff_without_run_task_get_403(
    tasks: dict[str, Task], viewer: User, method: str
) -> None:
    url = backfill_url(tasks[DIGEST])
    for client in (Client(), logged_in(viewer)):
        response = getattr(client, method)(url, RANGE)
        assert response.status_code == 403
    assert _nothing_enqueued()


def test_backfill__only_staff_who_may_run_tasks_see_the_button(
    tasks: dict[str, Task], runner: User, viewer: User
) -> None:
    url = backfill_url(tasks[DIGEST])
    assert url in logged_in(runner).get(change_url(tasks[DIGEST])).content.decode()
    assert url not in logged_in(viewer).get(change_url(tasks[DIGEST])).content.decode()


def test_backfill__get_asks_for_the_range_in_the_task_zone(
    tasks: dict[str, Task], runner: User
) -> None:
    response = logged_in(runner).get(backfill_url(tasks[DIGEST]))
    assert response.status_code == 200
    assert "read in the task's zone, Europe/Paris" in text(response)
    assert response.context["planned"] is None
    assert _nothing_enqueued()


def test_backfill__confirmation_lists_each_occurrence_and_writes_nothing(
    tasks: dict[str, Task], runner: User
) -> None:
    present = Job.objects.create(
        name="demo.send_digest",
        key="demo.nightly_digest:1772762400000:digest:2026-03-06",
        run_at=NOW,
        created_at=NOW,
    )
    response = logged_in(runner).get(backfill_url(tasks[DIGEST]), RANGE)

    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(r["local"], r["utc"]) for r in rows] == [
        ("2026-03-05 03:00:00 CET", "2026-03-05 02:00:00 UTC"),
        ("2026-03-06 03:00:00 CET", "2026-03-06 02:00:00 UTC"),
        ("2026-03-07 03:00:00 CET", "2026-03-07 02:00:00 UTC"),
    ]
    assert [job["present_id"] for r in rows for job in r["jobs"]] == [None, present.pk, None]
    page = text(response)
    assert "3 occurrences from 2026-03-05 00:00:00 CET to 2026-03-07 23:00:00 CET" in page
    assert 'value="Yes, backfill 3 occurrences"' in response.content.decode()
    assert "demo.nightly_digest:1772676000000:digest:2026-03-05" in page
    assert list(Job.objects.values_list("pk", flat=True)) == [present.pk]
    assert not Occurrence.objects.exists()


def test_backfill__post_without_csrf_token_is_refused(tasks: dict[str, Task], runner: User) -> None:
    response = logged_in(runner, csrf=True).post(backfill_url(tasks[DIGEST]), RANGE)
    assert response.status_code == 403
    assert _nothing_enqueued()


def test_backfill__post_with_csrf_enqueues_records_and_reports(
    tasks: dict[str, Task], runner: User
) -> None:
    client = logged_in(runner, csrf=True)
    url = backfill_url(tasks[DIGEST])
    token = _csrf_token(client.get(url, RANGE).content.decode())

    response = client.post(url, {**RANGE, "csrfmiddlewaretoken": token}, follow=True)

    assert response.redirect_chain == [(change_url(tasks[DIGEST]), 302)]
    days = ["2026-03-05", "2026-03-06", "2026-03-07"]
    jobs = Job.objects.order_by("occurrence")
    assert [(j.input["day"], j.enqueued_by) for j in jobs] == [(d, "backfill:runner") for d in days]
    record = Occurrence.objects.get()
    assert (record.outcome, record.user, record.count) == ("backfill", "runner", 3)
    assert "via the admin: 3 job(s) created, 0 already present" in record.detail
    [(level, message)] = _messages(response)
    assert level == constants.SUCCESS
    assert "Backfilled 3 occurrence(s) of demo.nightly_digest: 3 job(s) created" in message
    # The task page's history shows the backfill with its range and counts.
    [row] = response.context["history"]
    assert row["outcome_label"] == "backfill"
    assert "3 job(s) created" in text(response)


def test_backfill__a_second_run_over_the_range_creates_nothing(
    tasks: dict[str, Task], runner: User
) -> None:
    client = logged_in(runner)
    client.post(backfill_url(tasks[DIGEST]), RANGE)
    response = client.post(backfill_url(tasks[DIGEST]), RANGE, follow=True)
    level, message = _messages(response)[-1]
    assert level == constants.WARNING
    assert "0 job(s) created, 3 already present" in message
    assert Job.objects.count() == 3


def test_backfill__more_than_the_limit_is_refused_with_the_fix(
    tasks: dict[str, Task], runner: User
) -> None:
    response = logged_in(runner).get(
        backfill_url(tasks[QUARTER]), {"start": "2026-01-01", "end": "2026-03-01"}
    )
    page = text(response)
    assert "has more than 1000 occurrences" in page
    assert "Fix: narrow the range" in page
    assert "Yes, backfill" not in response.content.decode()
    assert _nothing_enqueued()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"start": "2026-03-07", "end": "2026-03-05"}, "after its end"),
        ({"start": "last week", "end": "2026-03-05"}, "is not an ISO 8601 date or date-time"),
    ],
    ids=["start_after_end", "not_iso"],
)
def test_backfill__a_bad_range_is_shown_and_nothing_runs(
    tasks: dict[str, Task], runner: User, data: dict[str, str], needle: str
) -> None:
    response = logged_in(runner).post(backfill_url(tasks[DIGEST]), data)
    assert response.status_code == 200
    assert needle in text(response)
    assert _nothing_enqueued()


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize(
    "data",
    [
        {"start": "0001-01-01", "end": "0001-01-03"},
        {"start": "9999-12-30", "end": "9999-12-31T23:59"},
    ],
    ids=["year_1", "end_of_year_9999"],
)
def test_backfill__a_range_at_the_ends_of_the_calendar_is_refused_with_the_fix(
    tasks: dict[str, Task], runner: User, data: dict[str, str], method: str
) -> None:
    response = getattr(logged_in(runner), method)(backfill_url(tasks[DIGEST]), data)
    assert response.status_code == 200
    page = text(response)
    assert "reaches outside the years 2 to 9899" in page
    assert "Fix: give --start and --end between 0002-01-01 and 9899-12-31" in page
    assert "Yes, backfill" not in response.content.decode()
    assert _nothing_enqueued()


def test_backfill__removed_task_cannot_be_backfilled(runner: User) -> None:
    row = Task.objects.create(name="gone.task", cron="0 3 * * *", tz="UTC", declared=False)
    response = logged_in(runner).post(backfill_url(row), RANGE, follow=True)
    assert response.redirect_chain == [(change_url(row), 302)]
    assert "no longer declared in code" in _messages(response)[0][1]
    assert _nothing_enqueued()


def test_task_change__shows_the_overlap_policy_and_skipped_occurrences(
    tasks: dict[str, Task], viewer: User
) -> None:
    Task.objects.filter(name=DIGEST).update(overlap="skip")
    at = datetime(2026, 3, 8, 2, 0, tzinfo=UTC)
    Occurrence.objects.create(
        task=DIGEST,
        outcome="overlap",
        occurrence=at,
        last_occurrence=at,
        recorded_at=NOW,
        node="node-a",
        detail="overlap=skip: 2026-03-07T02:00:00Z still queued or running",
    )
    Occurrence.objects.create(
        task=DIGEST,
        outcome="backfill",
        occurrence=at - timedelta(days=30),
        last_occurrence=at,
        count=31,
        recorded_at=NOW - timedelta(minutes=1),
        user="ops",
        jobs=[{"job": "demo.send_digest", "key": f"k{n}", "created": True} for n in range(31)],
        detail="backfill ... via the admin: 31 job(s) created, 0 already present",
    )

    response = logged_in(viewer).get(change_url(tasks[DIGEST]))

    page = text(response)
    assert "skip: an occurrence is skipped while an earlier one is queued or running" in page
    overlap, filled = response.context["history"]
    assert overlap["outcome_label"] == "skipped (overlap)"
    assert "overlap=skip: 2026-03-07T02:00:00Z still queued or running" in page
    assert (filled["outcome_label"], filled["by"], len(filled["jobs"]), filled["more_jobs"]) == (
        "backfill",
        "ops",
        10,
        21,
    )
    assert "and 21 more" in page


def test_task_list__filters_by_overlap(tasks: dict[str, Task], viewer: User) -> None:
    Task.objects.filter(name=DIGEST).update(overlap="skip")
    response = logged_in(viewer).get("/admin/ultimat3_jobs/task/?overlap=skip")
    assert [t.name for t in response.context["cl"].result_list] == [DIGEST]


# -- what already fired, paused tasks --------------------------------------------------------


def test_backfill__an_occurrence_that_fired_is_listed_and_left_out(
    tasks: dict[str, Task], runner: User
) -> None:
    # The 6th fired with another payload (an older release): its job's key is not today's.
    fired = Job.objects.create(
        name="demo.send_digest",
        key="demo.nightly_digest:1772762400000:digest:2026-03-06-older",
        run_at=NOW,
        created_at=NOW,
        task=DIGEST,
        occurrence=datetime(2026, 3, 6, 2, 0, tzinfo=UTC),
    )
    client = logged_in(runner)

    response = client.get(backfill_url(tasks[DIGEST]), RANGE)

    rows = response.context["rows"]
    assert [r["fired"] for r in rows] == [False, True, False]
    assert [job["left_out"] for r in rows for job in r["jobs"]] == [False, True, False]
    page = text(response)
    assert "2 new jobs, 0 already present." in page
    assert "1 occurrence already fired: not fired again, 1 job of its payload now left out." in page
    assert "left out: the occurrence already fired" in page

    response = client.post(backfill_url(tasks[DIGEST]), RANGE, follow=True)

    [(level, message)] = _messages(response)
    assert level == constants.SUCCESS
    assert "2 job(s) created, 0 already present. 1 occurrence(s) already fired" in message
    days = Job.objects.exclude(pk=fired.pk).order_by("occurrence")
    assert [j.input["day"] for j in days] == ["2026-03-05", "2026-03-07"]


def test_backfill__the_again_box_fires_them_again(tasks: dict[str, Task], runner: User) -> None:
    Job.objects.create(
        name="demo.send_digest",
        key="demo.nightly_digest:1772762400000:digest:2026-03-06-older",
        run_at=NOW,
        created_at=NOW,
        task=DIGEST,
        occurrence=datetime(2026, 3, 6, 2, 0, tzinfo=UTC),
    )
    client = logged_in(runner, csrf=True)
    url = backfill_url(tasks[DIGEST])
    asked = {**RANGE, "again": "on"}
    page = client.get(url, asked).content.decode()
    assert 'name="again" value="on"' in page  # carried to the confirmation's POST
    assert "fired again." in text(client.get(url, asked))

    client.post(url, {**asked, "csrfmiddlewaretoken": _csrf_token(page)}, follow=True)

    assert Job.objects.filter(occurrence=datetime(2026, 3, 6, 2, 0, tzinfo=UTC)).count() == 2
    assert Job.objects.count() == 4


def test_backfill__a_paused_task_is_refused_with_the_fix_and_the_box_offered(
    tasks: dict[str, Task], runner: User
) -> None:
    Task.objects.filter(name=DIGEST).update(paused=True, paused_by="ops")
    client = logged_in(runner)
    url = backfill_url(tasks[DIGEST])

    for response in (client.get(url, RANGE), client.post(url, RANGE)):
        assert response.status_code == 200
        page = text(response)
        assert 'task "demo.nightly_digest" is paused' in page
        assert "Fix: resume the task on its page in the admin first" in page
        assert 'name="include_paused"' in response.content.decode()
        assert "Yes, backfill" not in response.content.decode()
    assert _nothing_enqueued()

    asked = {**RANGE, "include_paused": "on"}
    preview = client.get(url, asked)
    assert 'value="Yes, backfill 3 occurrences"' in preview.content.decode()
    assert 'name="include_paused" value="on"' in preview.content.decode()
    response = client.post(url, asked, follow=True)

    assert "3 job(s) created" in _messages(response)[0][1]
    assert Task.objects.get(name=DIGEST).paused


def test_backfill__the_paused_box_is_offered_only_on_a_paused_task(
    tasks: dict[str, Task], runner: User
) -> None:
    page = logged_in(runner).get(backfill_url(tasks[DIGEST])).content.decode()
    assert 'name="again"' in page
    assert 'name="include_paused"' not in page


def test_backfill__an_occurrence_ahead_is_due_at_its_own_time(
    tasks: dict[str, Task], runner: User
) -> None:
    # Monday's 03:00 CET is still ahead of NOW (Sunday noon).
    ahead = {"start": "2026-03-08", "end": "2026-03-09T23:00"}
    client = logged_in(runner)
    response = client.get(backfill_url(tasks[DIGEST]), ahead)
    assert [r["ahead"] for r in response.context["rows"]] == [False, True]
    assert "1 occurrence still ahead: due at its own time." in text(response)

    client.post(backfill_url(tasks[DIGEST]), ahead)

    monday = datetime(2026, 3, 9, 2, 0, tzinfo=UTC)
    assert Job.objects.get(occurrence=monday).run_at == monday
