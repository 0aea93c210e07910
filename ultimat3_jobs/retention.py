"""Pruning: finished jobs and occurrence records older than the retention period go.

Queued and running jobs are never touched, however old. Rows go in batches so a first prune
of a large table never holds one huge transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Model, QuerySet

from . import clock
from .conf import get_settings
from .jobstore import finished_before
from .logs import emit
from .models import Job, Node, Occurrence

logger = logging.getLogger("ultimat3_jobs.retention")

BATCH_SIZE = 1000


@dataclass(frozen=True)
class Pruned:
    """What a prune removed (or, in a dry run, would remove), and the cutoff it used."""

    jobs: int
    occurrences: int
    nodes: int
    cutoff: datetime


def expired(
    cutoff: datetime, using: str = DEFAULT_DB_ALIAS
) -> tuple[QuerySet[Job], QuerySet[Occurrence], QuerySet[Node]]:
    """The rows a prune at ``cutoff`` removes."""
    jobs = finished_before(cutoff, using)
    occurrences = Occurrence.objects.using(using).filter(recorded_at__lt=cutoff)
    # A node silent for the whole retention period is long dead; its jobs were recovered.
    nodes = Node.objects.using(using).filter(last_seen_at__lt=cutoff)
    return jobs, occurrences, nodes


def _delete_in_batches(rows: QuerySet[Model], batch_size: int) -> int:
    deleted = 0
    while True:
        ids = list(rows.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return deleted
        count, _ = rows.model._default_manager.using(rows.db).filter(pk__in=ids).delete()
        deleted += count


def prune(
    *,
    older_than: timedelta | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
    using: str = DEFAULT_DB_ALIAS,
    batch_size: int = BATCH_SIZE,
) -> Pruned:
    """Delete finished jobs, occurrence records and silent nodes older than ``older_than``.

    ``older_than`` defaults to the ``RETENTION_DAYS`` setting; ``dry_run`` only counts.
    """
    keep = older_than if older_than is not None else timedelta(days=get_settings().retention_days)
    cutoff = (now or clock.now()) - keep
    querysets = expired(cutoff, using)
    if dry_run:
        counts = [rows.count() for rows in querysets]
    else:
        counts = [_delete_in_batches(rows, batch_size) for rows in querysets]
    result = Pruned(jobs=counts[0], occurrences=counts[1], nodes=counts[2], cutoff=cutoff)
    emit(
        logger,
        "jobs.retention.pruned",
        jobs=result.jobs,
        occurrences=result.occurrences,
        nodes=result.nodes,
        cutoff=cutoff,
        dry_run=dry_run,
    )
    return result
