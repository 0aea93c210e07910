"""The app's own declarations: a nightly prune of finished jobs and old occurrence records.

Autodiscovered at startup like every app's ``tasks.py``, so it imports nothing but the
declaration API; the pruning code loads when the job runs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ultimat3_jobs import Entry, job, task


# The name its prunes are recorded under too (``history.PRUNE_TASK``).
@job(name="ultimat3_jobs.prune")
def prune(days: int | None = None) -> None:
    """Delete what is older than ``days`` (default: the ``RETENTION_DAYS`` setting)."""
    from ultimat3_jobs.retention import prune as run_prune

    run_prune(older_than=None if days is None else timedelta(days=days))


@task(cron="17 3 * * *", tz="UTC", name="ultimat3_jobs.prune")
def nightly_prune(occurrence: datetime) -> list[Entry]:
    # Off the hour, so it does not land with every other nightly job; pause it in the admin
    # to keep everything.
    return [(prune, {})]
