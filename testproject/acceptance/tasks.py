"""Per-second tasks the real-process tests watch. Never installed by default."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta

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


def _asked_with_now(occurrence: datetime) -> bool:
    """Whether the function is asked for its jobs' names (the checks, the sync, the admin)
    rather than run by a round: those ask with now, to the millisecond, a round with its
    occurrence, a whole second, and later. Now falls on a whole second once in a thousand."""
    late = datetime.now(UTC) - occurrence
    return bool(occurrence.microsecond) or late < timedelta(milliseconds=5)


if os.environ.get("ULTIMAT3_ACCEPTANCE_SLOW"):

    @task(
        cron="* * * * * *", tz="UTC", name="acceptance.slow", catch_up="run-all", max_catch_up=1000
    )
    def slow(occurrence: datetime) -> list[Entry]:
        # A round that takes a while, so a signal lands on a round in flight; the marker file
        # tells the test when one has begun.
        if _asked_with_now(occurrence):
            return [(mark, {"occurrence": "describe"})]
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


if os.environ.get("ULTIMAT3_ACCEPTANCE_MONITORS"):
    # Sentry Crons monitors, fired by a test that moves their watermarks back three minutes.

    @job(name="acceptance.monitored_job")
    def monitored_job(occurrence: str, part: int) -> None:
        time.sleep(0.1)

    @job(name="acceptance.failing_job", max_attempts=1)
    def failing_job(occurrence: str) -> None:
        raise RuntimeError("a monitored occurrence's job fails")

    @task(cron="* * * * *", tz="Europe/Paris", name="acceptance.monitored", catch_up="run-all")
    def monitored(occurrence: datetime) -> list[Entry]:
        # Two jobs: whichever ends last closes the check-in, once.
        at = occurrence.isoformat()
        return [
            (monitored_job, {"occurrence": at, "part": 1}),
            (monitored_job, {"occurrence": at, "part": 2}),
        ]

    @task(
        cron="* * * * *",
        tz="UTC",
        name="acceptance.monitored_fails",
        catch_up="run-all",
        monitor={"checkin_margin": 2, "max_runtime": 5},
    )
    def monitored_fails(occurrence: datetime) -> list[Entry]:
        at = occurrence.isoformat()
        return [(monitored_job, {"occurrence": at, "part": 1}), (failing_job, {"occurrence": at})]

    @task(
        cron="* * * * *",
        tz="UTC",
        name="acceptance.monitored_overlap",
        catch_up="run-all",
        overlap="skip",
        monitor=True,
    )
    def monitored_overlap(occurrence: datetime) -> list[Entry]:
        return [(monitored_job, {"occurrence": occurrence.isoformat(), "part": 1})]

    @task(cron="* * * * *", tz="UTC", name="acceptance.monitored_dropped", monitor=True)
    def monitored_dropped(occurrence: datetime) -> list[Entry]:
        return [(monitored_job, {"occurrence": occurrence.isoformat(), "part": 1})]

    @task(
        cron="* * * * *", tz="UTC", name="acceptance.monitored_paused", catch_up="run-all",
        monitor=True,
    )  # fmt: skip
    def monitored_paused(occurrence: datetime) -> list[Entry]:
        return [(monitored_job, {"occurrence": occurrence.isoformat(), "part": 1})]

    @task(
        cron="* * * * *", tz="UTC", name="acceptance.unmonitored", catch_up="run-all",
        monitor=False,
    )  # fmt: skip
    def unmonitored(occurrence: datetime) -> list[Entry]:
        return [(monitored_job, {"occurrence": occurrence.isoformat(), "part": 1})]

    if DJANGO_TASKS:
        from testproject.demo.background import stamp

        @task(
            cron="* * * * *", tz="UTC", name="acceptance.monitored_django_task",
            catch_up="run-all", monitor=True,
        )  # fmt: skip
        def monitored_django_task(occurrence: datetime) -> list[Entry]:
            # A Django Task's run closes its check-in where it runs: in a process pool, the child.
            return [(stamp, {"occurrence": occurrence.isoformat()})]


if os.environ.get("ULTIMAT3_ACCEPTANCE_MANY"):
    # Past one slice of new task rows, which a first start makes in a thread of their own while
    # its COPY takes the ones before (``store.postgres.SYNC_SLICE``). With a STALL path, the
    # last task's function, called in that thread for its jobs' names, writes to that file and
    # hangs, so a test can kill the process with the COPY under way.

    def _declare_many(index: int, last: bool) -> None:
        def entries(occurrence: datetime) -> list[Entry]:
            stall = os.environ.get("ULTIMAT3_ACCEPTANCE_STALL")
            if last and stall and threading.current_thread().name == "ultimat3-rows-ahead":
                with open(stall, "a") as file:
                    file.write(f"{os.getpid()}\n")
                time.sleep(120)
            return [(mark, {"occurrence": occurrence.isoformat()})]

        task(cron="0 0 1 1 *", tz="UTC", name=f"acceptance.many.{index:05d}")(entries)

    _many = int(os.environ["ULTIMAT3_ACCEPTANCE_MANY"])
    for _index in range(_many):
        _declare_many(_index, _index == _many - 1)


if os.environ.get("ULTIMAT3_ACCEPTANCE_FLEET"):
    from testproject.acceptance import soak  # noqa: F401  (the whole-fleet soak's schedule)
