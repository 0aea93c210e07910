"""Occurrence records: what was decided about each occurrence, in one shape.

The scheduler's round (fired, dropped, skipped while paused or for overlap), "Run now" (manual)
and a backfill make them here and the job store writes them; the admin reads a task's recent
history back (``JobStore.recent_records``) with the ids of the jobs each record produced.
``Occurrence.jobs`` is built and parsed only here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import OuterRef, Subquery

from .catchup import Span
from .db import jsonb_field
from .models import Occurrence, Outcome

#: How each outcome reads in the admin.
OUTCOME_LABELS = {
    Outcome.FIRED.value: "fired",
    Outcome.DROPPED.value: "dropped",
    Outcome.PAUSED.value: "skipped (paused)",
    Outcome.MANUAL.value: "manual",
    Outcome.OVERLAP.value: "skipped (overlap)",
    Outcome.BACKFILL.value: "backfill",
    Outcome.PRUNED.value: "pruned",
}

#: The task a prune is recorded under: the app's own nightly prune (``tasks.py``).
PRUNE_TASK = "ultimat3_jobs.prune"


@dataclass(slots=True)
class RecordedJob:
    """One job a record produced: its name, its key, and whether that key was new."""

    job: str
    key: str
    created: bool


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """A record, with the id of each of its jobs that still exists (pruned ones have none)."""

    record: Occurrence
    jobs: list[tuple[RecordedJob, int | None]]


_FIRED = str(Outcome.FIRED)


def outcome_label(outcome: str) -> str:
    return OUTCOME_LABELS.get(outcome, outcome)


def _jobs_field(jobs: Iterable[RecordedJob]) -> list[dict[str, Any]]:
    return [{"job": j.job, "key": j.key, "created": j.created} for j in jobs]


def recorded_jobs(record: Occurrence) -> list[RecordedJob]:
    """The jobs of a record, tolerant of rows written by hand or by older releases."""
    return [
        RecordedJob(str(e.get("job", "")), str(e.get("key", "")), bool(e.get("created")))
        for e in record.jobs
        if isinstance(e, dict)
    ]


def fired(
    task: str,
    occurrence: datetime,
    *,
    catch_up: bool,
    jobs: Iterable[RecordedJob],
    at: datetime,
    node: str,
) -> dict[str, Any]:
    """The row of an occurrence a round fired (``_row`` of its one-occurrence span, made
    without the span: a round makes thousands)."""
    return {
        "task": task, "outcome": _FIRED, "occurrence": occurrence, "last_occurrence": occurrence,
        "count": 1, "catch_up": catch_up, "jobs": _jobs_field(jobs), "recorded_at": at,
        "node": node, "user": "", "detail": "",
    }  # fmt: skip


def decided(
    task: str, outcome: str, span: Span, *, detail: str, at: datetime, node: str
) -> dict[str, Any]:
    """The row of occurrences decided without firing: dropped, paused or overlapping."""
    detail += " (at least)" if span.at_least else ""
    return _row(task, outcome, span, at=at, node=node, detail=detail)


def last_fired(using: str) -> Subquery:
    """Per task row (``OuterRef("name")``), the occurrence it fired last: its newest fired
    record, one look along the index of its records, where a GROUP BY would read the whole
    history. Not the watermark, which also moves past dropped, paused and armed ones."""
    newest = (
        Occurrence.objects.using(using)
        .filter(task=OuterRef("name"), outcome=Outcome.FIRED)
        .order_by("-recorded_at", "-occurrence")
        .values("occurrence")[:1]
    )
    return Subquery(newest)


def pruned(cutoff: datetime, *, at: datetime, detail: str) -> dict[str, Any]:
    """The row of a prune that deleted what was older than ``cutoff``."""
    return _row(PRUNE_TASK, Outcome.PRUNED, Span(cutoff, cutoff, 1), at=at, detail=detail)


def _row(
    task: str,
    outcome: str,
    span: Span,
    *,
    at: datetime,
    node: str = "",
    user: str = "",
    detail: str = "",
    catch_up: bool = False,
    jobs: Iterable[RecordedJob] = (),
) -> dict[str, Any]:
    return {
        "task": task,
        "outcome": str(outcome),
        "occurrence": span.first,
        "last_occurrence": span.last,
        "count": span.count,
        "catch_up": catch_up,
        "jobs": _jobs_field(jobs),
        "recorded_at": at,
        "node": node,
        "user": user,
        "detail": detail,
    }


def fired_copy_row(
    task: str,
    occurrence: datetime,
    catch_up: bool,
    jobs: list[dict[str, Any]],
    *,
    at: datetime,
    node: str,
) -> tuple[Any, ...]:
    """``copy_row(fired(...))`` from jobs already in the shape of ``Occurrence.jobs``
    (``job``, ``key``, ``created``), made without the dict: a round makes thousands.

    In the column order of ``store.sql.COPY_OCCURRENCES``, as ``copy_row``."""
    return (task, _FIRED, occurrence, occurrence, 1, catch_up, jsonb_field(jobs), at, node, "", "")


def copy_row(r: dict[str, Any]) -> tuple[Any, ...]:
    """A record as a binary row of ``store.sql.COPY_OCCURRENCES`` (``db.copy_rows``)."""
    return (r["task"], r["outcome"], r["occurrence"], r["last_occurrence"], r["count"],
            r["catch_up"], jsonb_field(r["jobs"]), r["recorded_at"], r["node"], r["user"],
            r["detail"])  # fmt: skip


def manual(
    task: str, jobs: Iterable[RecordedJob], *, at: datetime, user: str, detail: str
) -> dict[str, Any]:
    """The row of a manual run of ``task`` by ``user``."""
    return _row(task, Outcome.MANUAL, Span(at, at, 1), at=at, user=user, detail=detail, jobs=jobs)


def backfill(
    task: str,
    span: Span,
    jobs: Iterable[RecordedJob],
    *,
    at: datetime,
    user: str,
    detail: str,
) -> dict[str, Any]:
    """The row of a backfill by ``user``: the occurrences it covered and every job it asked for."""
    return _row(task, Outcome.BACKFILL, span, at=at, user=user, detail=detail, jobs=jobs)
