"""Example declarations: what a project's ``tasks.py`` looks like."""

from __future__ import annotations

from datetime import datetime

from ultimat3_jobs import Entry, job, task

from .models import Ping


@job(key="digest:{day}")
def send_digest(day: str) -> None:
    """Pretend to mail the digest of ``day``; leave a row so the run can be seen."""
    Ping.objects.create(label=f"digest {day}")


@job
def ping(label: str) -> None:
    Ping.objects.create(label=label)


@task(cron="0 3 * * *", tz="Europe/Paris", catch_up="run-once")
def nightly_digest(occurrence: datetime) -> list[Entry]:
    # The occurrence, not now: a late or replayed run builds the digest of its own day.
    return [(send_digest, {"day": occurrence.date().isoformat()})]


@task(cron="*/15 * * * *", tz="America/New_York")
def quarter_hour_ping(occurrence: datetime) -> list[Entry]:
    return [(ping, {"label": f"quarter-hour {occurrence.isoformat()}"})]
