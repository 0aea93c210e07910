"""Per-second tasks the real-process tests watch. Never installed by default."""

from __future__ import annotations

import os
import time
from datetime import datetime

from ultimat3_jobs import Entry, job, task
from ultimat3_jobs.tasks_compat import AVAILABLE as DJANGO_TASKS


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


if DJANGO_TASKS:  # the `tasks` extra, or Django 6: without it the project runs the rest
    from testproject.demo.background import stamp

    @task(
        cron="* * * * * *",
        tz="UTC",
        name="acceptance.django_task_every_second",
        catch_up="run-all",
        max_catch_up=1000,
    )
    def django_task_every_second(occurrence: datetime) -> list[Entry]:
        # A Django Task on JobsBackend: written in the round, with the occurrence key.
        return [(stamp, {"occurrence": occurrence.isoformat()})]


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


if os.environ.get("ULTIMAT3_ACCEPTANCE_GATE"):

    @job(name="acceptance.hold")
    def hold(occurrence: str) -> None:
        """Runs until the test opens the gate (creates the file), so it outlives its period."""
        gate = os.environ["ULTIMAT3_ACCEPTANCE_GATE"]
        deadline = time.monotonic() + 120  # never hang a test run for good
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)

    @task(cron="* * * * * *", tz="UTC", name="acceptance.exclusive", overlap="skip")
    def exclusive(occurrence: datetime) -> list[Entry]:
        return [(hold, {"occurrence": occurrence.isoformat()})]


if os.environ.get("ULTIMAT3_ACCEPTANCE_RELEASE"):

    @job(name="acceptance.build")
    def build(occurrence: str, release: str) -> None:
        """A job whose input names the release that enqueued it: a deploy changes its key."""

    @task(
        cron="* * * * * *",
        tz="UTC",
        name="acceptance.released",
        catch_up="run-all",
        max_catch_up=1000,
    )
    def released(occurrence: datetime) -> list[Entry]:
        # The payload of the release this process runs, as a deploy between two runs changes it.
        release = os.environ["ULTIMAT3_ACCEPTANCE_RELEASE"]
        return [(build, {"occurrence": occurrence.isoformat(), "release": release})]


if os.environ.get("ULTIMAT3_ACCEPTANCE_RELAY"):
    from testproject.acceptance import relayed  # noqa: F401  (its tasks register on import)
