"""Read a django-celery-beat database and write its periodic tasks as ``@task`` declarations.

``manage.py celery_beat_tasks`` prints them. The tables are read with plain SQL, so neither
django-celery-beat nor Celery needs to be installed; nothing is written. Each ``PeriodicTask``
becomes one ``@task`` whose entry is its Celery task (by name, through
``ultimat3_jobs.celery.named``) with its keyword arguments. What has no equivalent (positional
args, solar and clocked schedules, one-off tasks, intervals that do not divide a minute, an
hour or a day) is said in a comment above the declaration rather than guessed.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections

from . import cron
from .errors import CeleryBeatReadError, InvalidCronError, UltimateError
from .inputs import NAME_LIMIT
from .zones import resolve_zone

TASKS_TABLE = "django_celery_beat_periodictask"
CRONTAB_TABLE = "django_celery_beat_crontabschedule"
INTERVAL_TABLE = "django_celery_beat_intervalschedule"
#: Celery's own housekeeping task, which beat schedules by itself.
BACKEND_CLEANUP = "celery.backend_cleanup"


@dataclass
class BeatTask:
    """One ``PeriodicTask`` row, with its schedule converted (or why it could not be)."""

    id: int
    name: str
    task: str
    kwargs: dict[str, Any]
    args: list[Any]
    enabled: bool
    queue: str | None
    one_off: bool
    cron: str | None
    tz: str
    schedule: str
    notes: list[str] = field(default_factory=list)
    #: Written out as a comment however its schedule converts: what beat would run is not
    #: what the declaration would (``notes`` say why).
    blocked: bool = False


def _columns(using: str, table: str) -> set[str]:
    connection = connections[using]
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


#: What ``_json`` returns for text that is not JSON.
_NOT_JSON = object()
#: The names the printed module imports: a task's function must not hide one.
_IMPORTED = {"annotations", "datetime", "Entry", "task", "named"}


def _json(text: Any, default: Any) -> Any:
    if text in (None, ""):
        return default
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return _NOT_JSON


def _restricted(field: str) -> bool:
    return field.strip() not in ("*", "*/1")


def interval_cron(every: int, period: str) -> str | None:
    """The cron of "every ``every`` ``period``" when one exists, else None.

    Beat counts an interval from the last run; cron fires on the clock. They agree when the
    interval divides the next unit up, which is the only case converted.
    """
    if every < 1:
        return None
    if period == "seconds":
        if every == 1:
            return "* * * * * *"
        return f"*/{every} * * * * *" if 60 % every == 0 else None
    if period == "minutes":
        if every == 1:
            return "* * * * *"
        return f"*/{every} * * * *" if 60 % every == 0 else None
    if period == "hours":
        if every == 1:
            return "0 * * * *"
        return f"0 */{every} * * *" if 24 % every == 0 else None
    if period == "days":
        return "0 0 * * *" if every == 1 else None
    return None


def read_beat_tasks(using: str, *, default_tz: str) -> list[BeatTask]:
    """Every ``PeriodicTask`` row, oldest first, with its schedule converted where it can be."""
    connection = connections[using]
    try:
        tables = set(connection.introspection.table_names())
    except DatabaseError as error:
        raise CeleryBeatReadError(
            f'database "{using}" cannot be read: {error}',
            fix="check DATABASES and run the command with --database naming the database "
            "django-celery-beat used",
            cause=error,
        ) from error
    if TASKS_TABLE not in tables:
        raise CeleryBeatReadError(
            f'database "{using}" has no {TASKS_TABLE} table',
            fix="run the command against the database django-celery-beat kept its schedule in "
            "(--database ALIAS)",
            cause=using,
        )
    task_columns = _columns(using, TASKS_TABLE)
    crontabs: dict[int, tuple[str, str]] = {}
    if CRONTAB_TABLE in tables:
        has_tz = "timezone" in _columns(using, CRONTAB_TABLE)
        tz_column = "timezone" if has_tz else "NULL"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, minute, hour, day_of_month, month_of_year, day_of_week, {tz_column} "
                f"FROM {CRONTAB_TABLE}"
            )
            for pk, minute, hour, dom, month, dow, tz in cursor.fetchall():
                # Celery reads a field with spaces in it ("9, 17") as without them.
                fields = [re.sub(r"\s+", "", str(f)) for f in (minute, hour, dom, month, dow)]
                # Celery reads a day by its first three letters, in any case: "Monday", "TUE".
                fields[4] = re.sub(r"[A-Za-z]+", lambda name: name[0][:3].lower(), fields[4])
                crontabs[pk] = (" ".join(fields), str(tz or default_tz))
    intervals: dict[int, tuple[int, str]] = {}
    if INTERVAL_TABLE in tables:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, every, period FROM {INTERVAL_TABLE}")
            intervals = {pk: (int(every), str(period)) for pk, every, period in cursor.fetchall()}

    wanted = ["id", "name", "task", "args", "kwargs", "enabled", "queue", "one_off"]
    wanted += [
        c for c in ("crontab_id", "interval_id", "solar_id", "clocked_id") if c in task_columns
    ]
    select = ", ".join(c if c in task_columns else f"NULL AS {c}" for c in wanted)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {select} FROM {TASKS_TABLE} ORDER BY id")
        names = [c[0] for c in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    found = []
    for row in rows:
        kwargs = _json(row["kwargs"], {})
        args = _json(row["args"], [])
        beat = BeatTask(
            id=int(row["id"]),
            name=str(row["name"]),
            task=str(row["task"]),
            kwargs=kwargs if isinstance(kwargs, dict) else {},
            args=args if isinstance(args, list) else [],
            enabled=bool(row["enabled"]) if row["enabled"] is not None else True,
            queue=row["queue"] or None,
            one_off=bool(row["one_off"]),
            cron=None,
            tz=default_tz,
            schedule="none",
        )
        if row.get("crontab_id") in crontabs:
            beat.cron, beat.tz = crontabs[row["crontab_id"]]
            beat.schedule = f"crontab {beat.cron} ({beat.tz})"
            try:
                cron.parse(beat.cron)
            except InvalidCronError as error:
                beat.blocked = True
                beat.notes.append(f"{error.message}: write the cron by hand")
            try:
                resolve_zone(beat.tz, beat.name)
            except UltimateError as error:
                beat.blocked = True  # Declared, it would fail the import of the whole module.
                beat.notes.append(f"{error.message}: {error.fix}")
            _, _, dom, _, dow = beat.cron.split(" ")
            if _restricted(dom) and _restricted(dow):
                beat.blocked = True
                beat.notes.append(
                    f'beat runs it on the days that are both day of month "{dom}" and day of '
                    f'week "{dow}"; a cron runs on the days that are either: declare the day of '
                    "week in the cron and return no entries on the other days"
                )
        elif row.get("interval_id") in intervals:
            every, period = intervals[row["interval_id"]]
            beat.schedule = f"every {every} {period}"
            beat.cron = interval_cron(every, period)
            if beat.cron is None:
                beat.notes.append(
                    f"no cron fires every {every} {period}: pick the nearest schedule by hand"
                )
            else:
                beat.notes.append(
                    "beat counted this interval from the last run; cron keeps to the clock"
                )
        elif row.get("solar_id") is not None:
            beat.schedule = "solar"
            beat.notes.append("a solar schedule has no cron equivalent: write one by hand")
        elif row.get("clocked_id") is not None:
            beat.schedule = "clocked"
            beat.notes.append("a clocked (one-time) schedule: enqueue it once instead")
        if not isinstance(kwargs, dict):
            beat.blocked = True
            beat.notes.append(
                f"kwargs {row['kwargs']!r} is not a JSON object (beat could not run it): "
                "give the entry its keyword arguments by hand"
            )
        elif not _finite(kwargs):
            beat.blocked = True
            beat.notes.append(
                "kwargs hold NaN or Infinity, which no job input keeps: pass them another way"
            )
        if not isinstance(args, list):
            beat.notes.append(f"args {row['args']!r} is not a JSON list: left out")
        if beat.args:
            beat.blocked = True  # Declared, it would call the task without them every time.
            beat.notes.append(
                f"positional args {beat.args!r}: entries take keyword arguments only; name them"
            )
        if beat.one_off:
            beat.blocked = True  # Declared, it would run on every occurrence of its schedule.
            beat.notes.append("one_off: it ran once in beat; run it now from the admin instead")
        if beat.queue:
            beat.notes.append(
                f'queue "{beat.queue}": route the Celery task there (task_routes or its queue '
                "option); the relay publishes where Celery routes it"
            )
        if not beat.enabled:
            beat.blocked = True  # Declared, it would run from its next occurrence on.
            beat.notes.append(
                "disabled in beat: uncomment it to schedule it (declared, it runs from its next "
                "occurrence)"
            )
        found.append(beat)
    return found


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _identifier(name: str, taken: set[str], longest: int) -> str:
    base = re.sub(r"\W+", "_", name.strip().lower()).strip("_") or "periodic_task"
    if base[0].isdigit() or keyword.iskeyword(base) or base in _IMPORTED:
        base = f"task_{base}"
    base = base[: max(longest - 6, 1)].rstrip("_") or "task"  # Room for a "_<n>" suffix.
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}_{n}", n + 1
    taken.add(candidate)
    return candidate


def render(tasks: list[BeatTask], *, prefix: str = "beat", include_disabled: bool = True) -> str:
    """Python source declaring one ``@task`` per row; rows without a cron are comments only."""
    lines = [
        '"""Schedules converted from django-celery-beat by `manage.py celery_beat_tasks`."""',
        "",
        "from __future__ import annotations",
        "",
        "from datetime import datetime",
        "",
        "from ultimat3_jobs import Entry, task",
        "from ultimat3_jobs.celery import named",
    ]
    taken: set[str] = set(_IMPORTED)
    for beat in tasks:
        if not beat.enabled and not include_disabled:
            continue
        # The task's name, prefix and all, fits the task table's column.
        function = _identifier(beat.name, taken, NAME_LIMIT - len(prefix) - 1)
        lines += ["", ""]
        # Text read from the database, a line break in it included, stays in its comment.
        lines.append(
            _comment(f"PeriodicTask {beat.name!r} (id {beat.id}): {beat.task}, {beat.schedule}")
        )
        lines += [_comment(f"NOTE: {note}") for note in beat.notes]
        if beat.task == BACKEND_CLEANUP:
            lines.append(
                "# NOTE: Celery's result cleanup; keep it only if you keep a result backend"
            )
        body = [
            f"@task(cron={beat.cron!r}, tz={beat.tz!r}, name={f'{prefix}.{function}'!r})",
            f"def {function}(occurrence: datetime) -> list[Entry]:",
            f"    return [(named({beat.task!r}), {beat.kwargs!r})]",
        ]
        active = beat.cron is not None and not beat.blocked
        lines += body if active else [f"# {line}" for line in body]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    """``text`` as one comment line, whatever line breaks it holds."""
    return "# " + " ".join(text.splitlines())


__all__ = ["BeatTask", "interval_cron", "read_beat_tasks", "render"]
