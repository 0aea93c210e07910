"""A Sentry client for the tests, whose transport writes each envelope item to a file
(``testproject.sentry_envelopes``): the check-ins a test made, read back, no network."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk

from testproject.sentry_envelopes import EnvelopeFile, read
from ultimat3_jobs.monitors import check_in_id

#: The DSN and environment of the tests' Sentry clients (this fixture's, and the example
#: project's under ``ULTIMAT3_SENTRY_ENVELOPES``), as ``checkins.deployment`` says them.
DSN, ENVIRONMENT = "https://public@sentry.invalid/1", "test"


def occurrence_check_in(task: str, occurrence: Any) -> str:
    """The check-in id of ``task``'s ``occurrence`` from the tests' clients."""
    return check_in_id(task, occurrence, f"{DSN}|{ENVIRONMENT}")


@pytest.fixture
def envelopes(tmp_path: Path) -> Iterator[Path]:
    """A Sentry client for the test's duration; the file its envelopes go to."""
    path = tmp_path / "envelopes.jsonl"
    sentry_sdk.init(
        dsn=DSN,
        transport=EnvelopeFile(str(path)),
        default_integrations=False,
        auto_enabling_integrations=False,
        environment=ENVIRONMENT,
    )
    try:
        yield path
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def check_ins(path: Path) -> list[dict[str, Any]]:
    """The check-ins sent so far, in the order they were."""
    return [item["payload"] for item in read(str(path)) if item["type"] == "check_in"]


def by_check_in(path: Path, monitor: str) -> dict[str, list[str]]:
    """``monitor``'s check-in ids, each with its statuses in the order they were sent."""
    found: dict[str, list[str]] = {}
    for payload in check_ins(path):
        if payload["monitor_slug"] == monitor:
            found.setdefault(payload["check_in_id"], []).append(payload["status"])
    return found
