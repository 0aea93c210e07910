"""A job's failure is always recorded, whatever its exception holds: no job is left running."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from ultimat3_jobs import job
from ultimat3_jobs.logs import failure_fields
from ultimat3_jobs.models import Job, JobStatus
from ultimat3_jobs.retries import format_error
from ultimat3_jobs.worker import CLEAN_EXIT, Worker

pytestmark = pytest.mark.usefixtures("fresh_registry")


class Unprintable(Exception):
    """An exception whose message cannot even be read."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


def _raise(kind: str) -> None:
    if kind == "unprintable":
        raise Unprintable()
    if kind == "surrogate":
        raise ValueError("bad text \ud800 in the message")
    if kind == "nul":
        raise ValueError("a NUL \x00 in the message")
    raise AssertionError(kind)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["unprintable", "surrogate", "nul"])
@pytest.mark.parametrize("attempts", [1, 2], ids=["last_attempt", "retried"])
def test_worker__a_failure_that_is_hard_to_print_is_still_recorded(
    kind: str, attempts: int, caplog: pytest.LogCaptureFixture
) -> None:
    @job(name="rec.explode", max_attempts=attempts)
    def explode(kind: str) -> None:
        _raise(kind)

    explode.enqueue({"kind": kind})
    worker = Worker(
        burst=True,
        poll_interval=timedelta(seconds=0.05),
        heartbeat_interval=timedelta(seconds=0.2),
        backoff_max=timedelta(hours=1),
        rand=lambda: 1.0,  # no jitter: a retried job waits 2 s, so the burst ends with it queued
        drain_on_shutdown=False,
    )
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs.worker"):
        assert worker.run() == CLEAN_EXIT

    row = Job.objects.get()
    assert row.status == (JobStatus.FAILED if attempts == 1 else JobStatus.QUEUED)
    assert "Traceback" in row.last_error
    assert {"unprintable": "Unprintable", "surrogate": "\\ud800", "nul": "\\x00"}[kind] in (
        row.last_error
    )
    events = [getattr(r, "event", "") for r in caplog.records]
    assert "jobs.worker.record-failed" not in events
    assert ("jobs.worker.job-failed" if attempts == 1 else "jobs.worker.job-retrying") in events


def test_format_error__is_storable_whatever_the_exception_holds() -> None:
    for kind in ["unprintable", "surrogate", "nul"]:
        try:
            _raise(kind)
        except Exception as error:
            text = format_error(error)
            fields = failure_fields(error)
        text.encode("utf-8")  # valid UTF-8: no lone surrogate left
        assert "\x00" not in text
        assert fields["code"] == "jobs.unexpected-error"
        assert fields["error"]


def test_failure_fields__an_unprintable_error_is_described_by_its_type() -> None:
    fields: dict[str, Any] = failure_fields(Unprintable())
    assert fields["error"] == "Unprintable: <Unprintable whose str() raised>"
