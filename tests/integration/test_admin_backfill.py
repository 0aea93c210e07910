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
