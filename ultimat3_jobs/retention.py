"""Pruning: finished jobs and occurrence records older than the retention period go.

Queued and running jobs are never touched, however old. The job store deletes the rows
(``JobStore.prune``), in batches so a first prune of a large table never holds one huge
transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from . import clock, history
from .conf import get_settings
from .db import job_database
from .logs import emit
from .store import JobStore, Progress, store_for

logger = logging.getLogger("ultimat3_jobs.retention")

BATCH_SIZE = 1000


@dataclass(frozen=True)
class Pruned:
    """What a prune removed (or, in a dry run, would remove), and the cutoff it used."""

    jobs: int
    occurrences: int
    nodes: int
    cutoff: datetime


def prune(
    *,
    older_than: timedelta | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
    using: str | None = None,
    batch_size: int = BATCH_SIZE,
    store: JobStore | None = None,
    progress: Progress | None = None,
) -> Pruned:
    """Delete finished jobs, occurrence records and silent nodes older than ``older_than``, and
    record the prune (``history.pruned``).

    ``older_than`` defaults to the ``RETENTION_DAYS`` setting; ``dry_run`` only counts.
    ``store``: the job store of ``using`` (default: the database of the job running here, as
    the nightly prune is, else the app's: ``db.job_database``).
    ``progress`` hears of each batch deleted.
    """
    keep = older_than if older_than is not None else timedelta(days=get_settings().retention_days)
    at = now or clock.now()
    cutoff = at - keep
    store = store or store_for(using if using is not None else job_database())
    # What fired before the cutoff may leave no trace: a backfill asks (``pruned_before``).
    # Recorded before the first batch goes, so a prune killed midway is on record; once done,
    # the record says what went, or goes itself if nothing did.
    record = None
    if not dry_run:
        record = store.insert_record(history.pruned(cutoff, at=at, detail="deleting"))
    jobs, occurrences, nodes = store.prune(
        cutoff, batch_size=batch_size, dry_run=dry_run, progress=progress
    )
    result = Pruned(jobs=jobs, occurrences=occurrences, nodes=nodes, cutoff=cutoff)
    if record is not None and (jobs or occurrences):
        record.detail = f"deleted {jobs} finished job(s), {occurrences} record(s), {nodes} node(s)"
        record.save(using=store.using, update_fields=["detail"])
    elif record is not None:
        record.delete(using=store.using)
    emit(
        logger,
        "jobs.retention.pruned",
        jobs=result.jobs,
        occurrences=result.occurrences,
        nodes=result.nodes,
        cutoff=cutoff,
        dry_run=dry_run,
        database=store.using,
    )
    return result
