"""``manage.py jobs_status`` on a real database: what an operator without the admin reads."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command

from ultimat3_jobs import clock
from ultimat3_jobs.leaders import LeaseLeader
from ultimat3_jobs.models import Job, JobStatus, Occurrence, Task
from ultimat3_jobs.registry import registry
from ultimat3_jobs.state import DatabaseState

from .plans import plans_of

pytestmark = pytest.mark.django_db


def run(*argv: str) -> str:
    out = io.StringIO()
    call_command("jobs_status", *argv, stdout=out)
    return out.getvalue()


def status_json() -> dict[str, Any]:
    return json.loads(run("--json"))


def make_job(status: str, queue: str = "default") -> None:
    now = clock.now()
    Job.objects.create(
        name="demo.ping",
        key=uuid.uuid4().hex,
        queue=queue,
        status=status,
        run_at=now,
        created_at=now,
    )


@pytest.fixture
def leader() -> DatabaseState:
    state = DatabaseState(node_id="status-node", leader="lease")
    assert LeaseLeader(node_id="status-node", ttl=timedelta(seconds=30)).acquire()
    state.sync([t for t in registry.tasks() if t.name.startswith("demo.")])
    state.heartbeat(is_leader=True, round_at=clock.now(), error="")
    return state


def fired(task: str, occurrence: datetime, late: float) -> None:
    Occurrence.objects.create(
        task=task,
        outcome="fired",
        occurrence=occurrence,
        recorded_at=occurrence + timedelta(seconds=late),
    )


def test_jobs_status__json_reports_leader_round_lateness_jobs_and_next_runs(
    leader: DatabaseState,
) -> None:
    for status in (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED, JobStatus.FAILED):
        make_job(status)
    make_job(JobStatus.QUEUED, queue="emails")
    now = clock.now().replace(microsecond=0)
    fired("demo.every_ten_seconds", now - timedelta(seconds=20), 0.5)
    fired("demo.every_ten_seconds", now - timedelta(seconds=10), 1.5)
    fired("demo.quarter_hour_ping", now - timedelta(hours=3), 90)  # outside the window

    report = status_json()

    assert report["leader"]["node"] == "status-node"
    assert report["leader"]["leader"] == "lease"
    assert report["healthy"] is True
    assert report["last_round_age_s"] >= 0
    assert report["jobs"]["by_status"] == {
        "queued": 1,
        "running": 0,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 0,
        "outbox": 0,
        "relayed": 0,
    }
    assert report["jobs"]["by_queue"]["emails"]["queued"] == 1
    assert report["jobs"]["by_queue"]["default"]["succeeded"] == 2
    lateness = report["lateness"]
    assert (lateness["fired"], lateness["last_s"], lateness["max_s"]) == (2, 1.5, 1.5)
    assert lateness["mean_s"] == pytest.approx(1.0)
    assert lateness["last_task"] == "demo.every_ten_seconds"

    tasks = {t["name"]: t for t in report["tasks"]}
    assert set(tasks) == set(Task.objects.values_list("name", flat=True))
    ten = tasks["demo.every_ten_seconds"]
    next_run = datetime.fromisoformat(ten["next_run"])
    assert next_run.second % 10 == 0 and next_run > datetime.fromisoformat(report["now"])
    assert datetime.fromisoformat(ten["last_fired"]) == now - timedelta(seconds=10)
    digest = tasks["demo.nightly_digest"]
    assert (digest["cron"], digest["tz"]) == ("0 3 * * *", "Europe/Paris")
    assert digest["state"] == "active"
    assert datetime.fromisoformat(digest["next_run"]).astimezone(UTC).hour in (1, 2)
    assert digest["last_fired"] is None


def test_jobs_status__text_names_the_leader_and_each_task(leader: DatabaseState) -> None:
    Task.objects.filter(name="demo.nightly_digest").update(paused=True)
    text = run()
    assert "Leader:      " in text and "status-node" in text
    assert "Jobs:        queued 0, running 0, succeeded 0, failed 0, cancelled 0" in text
    assert "Lateness:    nothing fired in the last 1 h" in text
    digest = next(line for line in text.splitlines() if line.startswith("demo.nightly_digest"))
    assert "paused" in digest and "Europe/Paris" in digest


def test_jobs_status__without_a_scheduler_warns_with_the_fix() -> None:
    report = status_json()
    assert report["leader"] is None
    assert report["healthy"] is False
    assert "run_scheduler" in report["warnings"][0]["fix"]


@pytest.mark.postgres
def test_jobs_status__reads_the_history_by_its_indexes_not_all_of_it(
    leader: DatabaseState,
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    now = clock.now()
    fired("demo.every_ten_seconds", now - timedelta(seconds=10), 1.5)
    with CaptureQueriesContext(connection) as queries:
        report = status_json()
    assert report["lateness"]["fired"] == 1
    reads = [q["sql"] for q in queries if '"ultimat3_jobs_occurrence"' in q["sql"]]
    # The last hour's records for the lateness, and each task's newest fired one.
    assert len(reads) == 2
    lateness, per_task = plans_of(reads)
    assert "u3j_occ_recorded" in lateness
    assert "u3j_occ_task" in per_task
