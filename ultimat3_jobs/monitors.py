"""A task as a Sentry Crons monitor: its ``monitor=`` option, slug, config and check-in ids.

Pure: nothing here imports ``sentry_sdk`` or reads a clock, so a declaration is checked at
import whether the ``sentry`` extra is installed or not. ``checkins.py`` sends what this builds.

Sentry's ``monitor_config`` counts its margin and maximum runtime in whole minutes and knows
five-field crontabs: a six-field cron is a monitor only when its seconds field is one number
(it fires at most once a minute), and is then given to Sentry without it.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from .cron import CronSchedule
from .errors import InvalidMonitorError

#: What ``@task(monitor=...)`` holds: None follows ``SENTRY_CRONS``; a dict is a monitor with
#: those options.
Monitor = bool | dict[str, Any] | None

#: The options a ``monitor=`` dict may set, in Sentry's own names and units: minutes for the
#: two durations, consecutive check-ins for the two thresholds.
MINUTE_OPTIONS = ("checkin_margin", "max_runtime")
COUNT_OPTIONS = ("failure_issue_threshold", "recovery_threshold")
TEXT_OPTIONS = ("owner", "slug")
OPTIONS = (*MINUTE_OPTIONS, *COUNT_OPTIONS, *TEXT_OPTIONS)

#: Sentry's monitor slugs: lowercase letters, digits, ``-`` and ``_``, at most 50 characters.
SLUG_LIMIT = 50
_SLUG = re.compile(r"^[a-z0-9_-]+$")
_NOT_SLUG = re.compile(r"[^a-z0-9_-]+")

#: Check-in ids are uuid5 of ``<deployment>|<task>:<occurrence_ms>`` in this namespace: the
#: scheduler that opens an occurrence's check-in and the worker that closes it compute the same
#: id, and another deployment (another Sentry project or environment) another one.
CHECK_IN_NAMESPACE = uuid.UUID("0b8e2a55-3c59-4f0e-a3c1-7d52c1f4e9b6")

#: What Sentry takes of a monitor's options (beyond them it refuses the monitor's config):
#: minutes for the two durations, consecutive check-ins for the two thresholds.
OPTION_LIMITS = {
    "checkin_margin": 40_320,
    "max_runtime": 40_320,
    "failure_issue_threshold": 720,
    "recovery_threshold": 720,
}
#: An owner is a user's e-mail or a team's slug, in Sentry's form.
OWNER_PREFIXES = ("user:", "team:")

_OPTIONS_FIX = (
    "pass monitor=True, monitor=False, or a dict of Sentry monitor options, e.g. "
    'monitor={"checkin_margin": 5, "max_runtime": 30} (minutes); the keys are ' + ", ".join(OPTIONS)
)


def check_monitor(value: object, schedule: CronSchedule, owner: str) -> Monitor:
    """``value`` as a task's ``monitor=``, or ``InvalidMonitorError`` naming what is wrong."""
    if value is None or value is False:
        return value
    if value is not True and not isinstance(value, Mapping):
        raise InvalidMonitorError(f"{owner} has monitor={value!r}", fix=_OPTIONS_FIX, cause=value)
    options = dict(value) if isinstance(value, Mapping) else {}
    for key, option in options.items():
        problem = _option_problem(key, option)
        if problem is not None:
            raise InvalidMonitorError(
                f"{owner} has monitor={{{key!r}: {option!r}}}: {problem}",
                fix=_OPTIONS_FIX,
                cause=value,
            )
    if crontab(schedule) is None:
        raise InvalidMonitorError(
            f'{owner} asks for a Sentry monitor, but its cron "{schedule.expr}" fires more than '
            "once a minute, which Sentry's schedules cannot express",
            fix="give a six-field cron a single seconds value (0 */5 * * * *), or pass "
            "monitor=False",
            cause=schedule.expr,
        )
    return options if isinstance(value, Mapping) else True


def _option_problem(key: object, value: object) -> str | None:
    if key not in OPTIONS:
        return "not an option of a Sentry monitor"
    if key in TEXT_OPTIONS:
        if not isinstance(value, str) or not value:
            return "not a non-empty string"
        if key == "slug" and (len(value) > SLUG_LIMIT or not _SLUG.match(value)):
            return f"a slug is at most {SLUG_LIMIT} of a-z, 0-9, - and _"
        if key == "owner" and not (
            value.startswith(OWNER_PREFIXES) and value.partition(":")[2].strip()
        ):
            return 'an owner is "user:<email>" or "team:<slug>"'
        return None
    unit = "minutes" if key in MINUTE_OPTIONS else "check-ins"
    limit = OPTION_LIMITS[str(key)]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        return f"not a whole number of {unit} from 1 to {limit:,} (Sentry's bounds)"
    return None


def is_monitored(monitor: Monitor, *, default: bool) -> bool:
    """Whether a task with this ``monitor=`` is a monitor; ``default`` is ``SENTRY_CRONS``."""
    return default if monitor is None else monitor is not False


def crontab(schedule: CronSchedule) -> str | None:
    """The five-field crontab Sentry is given, or None when the schedule has no such form."""
    fields = schedule.expr.split()
    if not schedule.has_seconds:
        return " ".join(fields)
    return " ".join(fields[1:]) if fields[0].isdigit() else None


def slug(task: str, monitor: Monitor = None, *, alike: bool = False) -> str:
    """The monitor's slug: ``monitor={"slug": ...}``, else the task name made a slug.

    A name that has to be shortened keeps a digest of itself at the end, so two long names
    that share their first 40 characters stay two monitors; so does one that reads ``alike``
    another task's (its own dashes read as their dots: "a-b.c" and "a.b-c").
    """
    if isinstance(monitor, dict) and monitor.get("slug"):
        return str(monitor["slug"])
    made = _NOT_SLUG.sub("-", task.lower()).strip("-") or "task"
    # Only the dots of "app.function" made dashes: kept as it reads. A name changed otherwise,
    # or cut, keeps a digest of itself, so two names never share a monitor.
    if len(made) <= SLUG_LIMIT and made == task.replace(".", "-") and not alike:
        return made
    digest = hashlib.sha256(task.encode()).hexdigest()[:8]
    return f"{made[: SLUG_LIMIT - 9].rstrip('-')}-{digest}"


def _minutes(value: timedelta) -> int:
    return max(1, math.ceil(value.total_seconds() / 60))


def monitor_config(
    schedule: CronSchedule,
    tz: str,
    monitor: Monitor,
    *,
    checkin_margin: timedelta,
    max_runtime: timedelta,
) -> dict[str, Any] | None:
    """The ``monitor_config`` a task's ``in_progress`` check-in carries (Sentry upserts the
    monitor from it), or None when Sentry cannot express the schedule.

    ``checkin_margin`` and ``max_runtime`` are the settings' defaults; a ``monitor=`` dict
    overrides them in minutes.
    """
    cron = crontab(schedule)
    if cron is None:
        return None
    options = monitor if isinstance(monitor, dict) else {}
    config: dict[str, Any] = {
        "schedule": {"type": "crontab", "value": cron},
        "timezone": tz,
        "checkin_margin": options.get("checkin_margin", _minutes(checkin_margin)),
        "max_runtime": options.get("max_runtime", _minutes(max_runtime)),
    }
    for key in (*COUNT_OPTIONS, "owner"):
        if key in options:
            config[key] = options[key]
    return config


def check_in_id(task: str, occurrence: datetime, deployment: str) -> str:
    """The check-in id of ``task``'s ``occurrence``: the same from every process of one
    ``deployment`` (its Sentry DSN and environment, ``checkins.deployment``). Sentry looks a
    check-in id up across all its projects: one shared by two deployments (staging and
    production, two projects that both run this app's nightly prune) is refused to the
    second."""
    ms = int(occurrence.timestamp() * 1000)
    return uuid.uuid5(CHECK_IN_NAMESPACE, f"{deployment}|{task}:{ms}").hex


__all__ = [
    "OPTIONS",
    "Monitor",
    "check_in_id",
    "check_monitor",
    "crontab",
    "is_monitored",
    "monitor_config",
    "slug",
]
