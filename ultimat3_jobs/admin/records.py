"""Read-only admins for what the scheduler writes: occurrence records and nodes."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..history import outcome_label, recorded_jobs
from ..models import Node, Occurrence
from .display import utc_column
from .filters import EstimatedCountPaginator, RecentValuesFilter


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the scheduler writes; the admin only shows them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Occurrence)
class OccurrenceAdmin(_ReadOnlyAdmin):
    """What the scheduler (or a person) did with each occurrence of each task."""

    list_display = [
        "recorded_column",
        "task",
        "outcome_column",
        "first_column",
        "last_column",
        "count",
        "catch_up",
        "jobs_column",
        "node",
        "user",
        "detail",
    ]
    list_filter = ["outcome", ("task", RecentValuesFilter), "catch_up"]
    search_fields = ["task", "detail", "user"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    recorded_column = utc_column("recorded_at", "Recorded")
    first_column = utc_column("occurrence", "Occurrence")
    last_column = utc_column("last_occurrence", "Last occurrence")

    @admin.display(description="Outcome", ordering="outcome")
    def outcome_column(self, record: Occurrence) -> SafeString:
        label = outcome_label(record.outcome)
        return format_html('<span class="u3j-badge u3j-{}">{}</span>', record.outcome, label)

    @admin.display(description="Jobs")
    def jobs_column(self, record: Occurrence) -> SafeString | str:
        if not record.jobs:
            return "-"
        return format_html_join(
            mark_safe("<br>"),
            "{} [{}] {}",
            (
                (job.job, job.key, "created" if job.created else "present")
                for job in recorded_jobs(record)
            ),
        )


@admin.register(Node)
class NodeAdmin(_ReadOnlyAdmin):
    """Scheduler and worker processes, as their heartbeats last described them."""

    list_display = [
        "node_id",
        "role",
        "host",
        "pid",
        "leader",
        "is_leader",
        "last_seen_at",
        "last_round_at",
        "clock_skew_ms",
        "stopped_at",
    ]
    list_filter = ["role", "is_leader"]
