"""How the admin prints instants, links and outcomes: shared by every admin page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import clock
from ..humanize import duration

UTC_ZONE = ZoneInfo("UTC")


def zone_label(local: datetime) -> str:
    name = local.tzname() or ""
    # Zones without an abbreviation (America/Bogota) report "-05"; say it as an offset.
    return f"UTC{name}" if name[:1] in "+-" else name


def stamp(at: datetime, zone: ZoneInfo, seconds: bool = False) -> str:
    fmt = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    local = at.astimezone(zone)
    return f"{local.strftime(fmt)} {zone_label(local)}"


def utc(at: datetime | None) -> str:
    """A stored instant as the admin prints every instant: ISO-like, in UTC."""
    return "-" if at is None else stamp(at, UTC_ZONE, seconds=True)


def last_round(at: datetime | None, age: timedelta | None) -> str:
    if at is None or age is None:
        return ""
    ago = "just now" if age < timedelta(seconds=1) else f"{duration(age)} ago"
    return f"{utc(at)} ({ago})"


def utc_column(field: str, description: str) -> Callable[[Any, Any], str]:
    """A list or detail column showing the instant in ``field`` the way ``_utc`` does."""

    @admin.display(description=description, ordering=field)
    def column(admin_: Any, obj: Any) -> str:
        return utc(getattr(obj, field))

    return column


def both_zones(
    at: datetime, zone: ZoneInfo, *, seconds: bool = False, note: str = ""
) -> SafeString:
    """An instant in the task's zone, with UTC and the distance from now under it."""
    now = clock.now()
    distance = f"in {duration(at - now)}" if at >= now else f"{duration(now - at)} ago"
    return format_html(
        '<span class="u3j-when">{}</span><span class="u3j-sub u3j-when">{}</span>'
        '<span class="u3j-sub">{}</span>{}',
        stamp(at, zone, seconds),
        stamp(at, UTC_ZONE, seconds),
        distance,
        format_html('<span class="u3j-sub u3j-note">{}</span>', note) if note else "",
    )


def job_link(job_id: int | None, text: str) -> SafeString:
    if job_id is None:
        return format_html("{}", text)
    url = reverse("admin:ultimat3_jobs_job_change", args=[job_id])
    return format_html('<a href="{}">{}</a>', url, text)


def fields_of(fieldsets: Sequence[tuple[Any, Any]], *, editable: tuple[str, ...] = ()) -> list[str]:
    """Every field a page's fieldsets show, but ``editable``: its read-only fields, in order."""
    return [f for _, options in fieldsets for f in options["fields"] if f not in editable]


def timeout_text(seconds: float | None) -> str:
    """A job's timeout as the admin shows it."""
    return "none" if seconds is None else f"{seconds:g} s"
