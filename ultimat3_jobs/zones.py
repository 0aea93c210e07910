"""Time zones a task may name: the IANA zones tzdata ships, never a file of the host's directory.

A task's cron is read as wall-clock time in its zone, so a zone that differs per host (or a
name that is not a zone) is refused at declaration with a fix that names real zone ids.
"""

from __future__ import annotations

import difflib
import functools
import zoneinfo

from .errors import InvalidTimezoneError, MissingTimezoneError

#: Names a zone directory may hold that are not zones of the IANA database: "localtime" and
#: "posixrules" are host files (the schedule would differ per host), "Factory" means "no zone set".
NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def _zone_names() -> frozenset[str]:
    """The IANA zones as the tzdata package lists them, never what a host's directory adds."""
    try:
        from importlib import resources

        names = frozenset(resources.files("tzdata").joinpath("zones").read_text().split())
    except (ImportError, OSError):  # tzdata is a dependency; a stripped install falls back.
        names = frozenset(zoneinfo.available_timezones())
    return names - NOT_ZONES


def resolve_zone(tz: object, owner: str, *, given_to: str | None = None) -> zoneinfo.ZoneInfo:
    """The IANA zone ``tz`` names, or an error whose fix names real zone ids. The error speaks
    of task ``owner``, or of the function or flag ``given_to`` where it is not a task's."""
    has = f'task "{owner}" has' if given_to is None else f"{given_to} was given"
    if tz is None or tz == "":
        raise MissingTimezoneError(
            f"{has} no tz: a cron without a timezone is a bug waiting for March",
            fix=(f'add tz to @task for "{owner}"' if given_to is None else "pass a zone")
            + ', e.g. tz="UTC" or tz="Europe/Paris" '
            "(an unzoned cron drifts by an hour at every DST change)",
        )
    if not isinstance(tz, str):
        raise InvalidTimezoneError(
            f"{has} tz {tz!r}, not an IANA zone name",
            fix="pass the zone id as a string"
            + (f' on "{owner}"' if given_to is None else "")
            + ', e.g. tz="America/Bogota"',
            cause=tz,
        )
    if tz in _zone_names():
        return zoneinfo.ZoneInfo(tz)
    zones = _zone_names()
    same = [name for name in sorted(zones) if name.lower() == tz.lower()]
    close = difflib.get_close_matches(tz, zones, n=3, cutoff=0.5)
    suffix = [name for name in sorted(zones) if name.endswith("/" + tz)]
    found = [name for name in dict.fromkeys(same + suffix + close) if name in zones]
    examples = found[:3] or ["UTC", "America/Bogota", "Europe/Paris"]
    message = f'{has} tz "{tz}", which is not a zone in the IANA tz database'
    if tz in NOT_ZONES:
        message += (
            ": it is a file of the host's zone directory, so the schedule would follow "
            "whatever zone each host happens to run in"
        )
    raise InvalidTimezoneError(
        message,
        fix=f"use the full zone id, e.g. tz={examples[0]!r}"
        + (f" (or one of {', '.join(repr(e) for e in examples[1:])})" if len(examples) > 1 else "")
        + '; list them with: python -c "import importlib.resources as r; '
        "print(r.files('tzdata').joinpath('zones').read_text())\"",
        cause=tz,
    )
