"""The LISTEN thread while its database is away: it retries, backing off, never fatal."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest

from ultimat3_jobs.listener import Listener


class _Unreachable(Listener):
    def __init__(self) -> None:
        super().__init__(
            role="worker", using="default", queues=None, wake=lambda: None, retry_after=0.1
        )
        self.attempts: list[float] = []

    def _connect(self) -> psycopg.Connection[Any]:
        self.attempts.append(time.monotonic())
        raise psycopg.OperationalError("connection refused")


def test_listener__a_database_away_is_asked_less_and_less_often(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener = _Unreachable()
    with caplog.at_level(logging.WARNING, logger="ultimat3_jobs"):
        listener.start()
        time.sleep(2.0)
        listener.stop()

    lost = [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.worker.listen-lost"
    ]
    # 0.1 + 0.2 + 0.4 + 0.8 s: five attempts in two seconds, where a fixed 0.1 s made twenty.
    assert 4 <= len(listener.attempts) <= 6
    assert [f["retry_in"] for f in lost[:4]] == [0.1, 0.2, 0.4, 0.8]
    assert [f["failures"] for f in lost[:4]] == [1, 2, 3, 4]
    assert lost[0]["code"] == "jobs.database-unavailable"
