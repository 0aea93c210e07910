"""Per-second tasks the real-process tests watch. Never installed by default."""

from __future__ import annotations

import os
import time
from datetime import datetime

from ultimat3_jobs import Entry, job, task


@job(name="acceptance.mark")
def mark(occurrence: str) -> None:
    """The scheduler tests read the job table itself; running the job changes nothing."""


@task(
    cron="* * * * * *",
    tz="UTC",
    name="acceptance.every_second",
    catch_up="run-all",
    max_catch_up=1000,
)
def every_second(occurrence: datetime) -> list[Entry]:
    return [(mark, {"occurrence": occurrence.isoformat()})]


if os.environ.get("ULTIMAT3_ACCEPTANCE_SLOW"):

    @task(
        cron="* * * * * *", tz="UTC", name="acceptance.slow", catch_up="run-all", max_catch_up=1000
    )
    def slow(occurrence: datetime) -> list[Entry]:
        # A round that takes a while, so a signal lands on a round in flight; the marker file
        # tells the test when one has begun.
        if occurrence.microsecond:
            return [(mark, {"occurrence": "describe"})]  # describe() asks with now, not a round
        marker = os.environ.get("ULTIMAT3_ACCEPTANCE_MARKER")
        if marker:
            with open(marker, "a") as file:
                file.write(f"{os.getpid()} {occurrence.isoformat()}\n")
        time.sleep(float(os.environ["ULTIMAT3_ACCEPTANCE_SLOW"]))
        return [(mark, {"occurrence": occurrence.isoformat()})]


if os.environ.get("ULTIMAT3_ACCEPTANCE_RELAY"):
    from testproject.acceptance import relayed  # noqa: F401  (its tasks register on import)
