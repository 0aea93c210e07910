"""The jobs admin: filter, search, retry failed jobs and cancel queued ones."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import AdminSite
from django.db import connections, transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import smart_split, unescape_string_literal

from .. import checkins, clock
from ..attempts import timeout_of
from ..models import Job, Task
from ..status import relay_warning
from ..store import CANCELLABLE, FINISHED, JobStore, store_for
from .bulk import GuardedDelete, delete_selected
from .display import fields_of, timeout_text, utc_column
from .filters import EstimatedCountPaginator, RecentValuesFilter

#: The fields of a Django Task's row (``backends.JobsBackend``), on its page only.
DJANGO_TASK_FIELDS = [
    "backend",
    "priority",
    "args_column",
    "return_value_column",
    "task_error_column",
]
#: Characters of a return value the list shows.
RESULT_PREVIEW = 60


@admin.register(Job)
class JobAdmin(GuardedDelete):
    """Jobs: filter, search, and retry failed or cancel queued ones.

    Rows are written by the queue and the workers; the admin only moves a job between
    statuses, with conditional updates so a worker that claimed it meanwhile wins. It does so
    through ``store`` (default: the job store of the selected jobs' database).
    """

    refused_as = "queued or running jobs (cancel queued ones; running ones finish first)"
    delete_many_hint = (
        "; manage.py prune_jobs --days N deletes the finished jobs older than N days, in batches"
    )
    list_display = [
        "id",
        "name",
        "status_column",
        "queue",
        "task",
        "key_column",
        "attempts_column",
        "run_at_column",
        "finished_column",
        "enqueued_by",
        "result_column",
    ]
    list_display_links = ["id", "name"]
    list_filter = [
        "status",
        ("task", RecentValuesFilter),
        ("queue", RecentValuesFilter),
        ("relay", RecentValuesFilter),
        ("enqueued_by", RecentValuesFilter),
        "catch_up",
        ("backend", RecentValuesFilter),
    ]
    search_fields = ["key", "name", "task", "input", "last_error", "error_class", "engine_id"]
    # Django counts the whole table once more for "N total" beside a filtered count.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ["retry_failed", "cancel_queued", delete_selected]
    fieldsets = [
        (None, {"fields": ["name", "key", "status_column", "queue", "input_column"]}),
        (
            "Origin",
            {
                "fields": [
                    "task_column",
                    "occurrence_column",
                    "catch_up",
                    "enqueued_by",
                    "trace_context",
                ]
            },
        ),
        (
            "Runs",
            {
                "fields": [
                    "attempts_column",
                    "timeout_column",
                    "run_at_column",
                    "created_column",
                    "started_column",
                    "finished_column",
                    "worker",
                    "error_column",
                ]
            },
        ),
        (
            # Outbox rows only: run by Celery or another Tasks backend, handed over by run_relay.
            "Relayed",
            {
                "fields": ["relay", "relayed_column", "engine_id", "done_column"],
                "classes": ["u3j-relayed"],
            },
        ),
    ]
    readonly_fields = [*fields_of(fieldsets), *DJANGO_TASK_FIELDS]

    occurrence_column = utc_column("occurrence", "Occurrence")
    run_at_column = utc_column("run_at", "Run at")
    created_column = utc_column("created_at", "Created")
    started_column = utc_column("started_at", "Started")
    finished_column = utc_column("finished_at", "Finished")
    relayed_column = utc_column("relayed_at", "Relayed at")
    done_column = utc_column("done_at", "Done at")

    def __init__(
        self, model: type[Job], admin_site: AdminSite, store: JobStore | None = None
    ) -> None:
        super().__init__(model, admin_site)
        self.store = store

    def _store(self, jobs: QuerySet[Job]) -> JobStore:
        return self.store or store_for(jobs.db)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        stuck = relay_warning(clock.now(), self.model.objects.db)
        if stuck is not None:
            self.message_user(request, f"{stuck.message} Fix: {stuck.fix}", messages.WARNING)
        return super().changelist_view(
            request, extra_context={"title": "Jobs", **(extra_context or {})}
        )

    @admin.display(description="Key", ordering="key")
    def key_column(self, job: Job) -> SafeString:
        return format_html('<span class="u3j-key" title="{}">{}</span>', job.key, job.key)

    @admin.display(description="Status", ordering="status")
    def status_column(self, job: Job) -> SafeString:
        badge = format_html('<span class="u3j-badge u3j-{}">{}</span>', job.status, job.status)
        if job.relay:
            # Where it went, and the engine's id to look it up there (Flower, the backend).
            return format_html(
                '{} <span class="u3j-relay" title="engine id {}">via {}</span>',
                badge,
                job.engine_id or "-",
                job.relay,
            )
        return badge

    @admin.display(description="Attempts", ordering="attempts")
    def attempts_column(self, job: Job) -> str:
        return f"{job.attempts} / {job.max_attempts}"

    @admin.display(description="Timeout")
    def timeout_column(self, job: Job) -> str:
        # This code's declaration: the worker running this code enforces it.
        return timeout_text(timeout_of(job.name, backend=job.backend))

    @admin.display(description="Input")
    def input_column(self, job: Job) -> SafeString:
        return format_html('<pre class="u3j-pre">{}</pre>', json.dumps(job.input, indent=2))

    @admin.display(description="Last error")
    def error_column(self, job: Job) -> SafeString | str:
        if not job.last_error:
            return "-"
        return format_html('<pre class="u3j-pre">{}</pre>', job.last_error)

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        fieldsets: list[Any] = list(super().get_fieldsets(request, obj))
        if obj is None:
            return fieldsets
        if not obj.relay:
            fieldsets = [f for f in fieldsets if f[0] != "Relayed"]
        if obj.backend:
            # A Django Task's row: what the framework's TaskResult reads, shown in full.
            fieldsets.append(("Django Task", {"fields": DJANGO_TASK_FIELDS}))
        return fieldsets

    @admin.display(description="Result")
    def result_column(self, job: Job) -> SafeString | str:
        """A Django Task's return value or exception class; "-" for a @job or an unfinished one."""
        if job.error_class:
            return format_html('<span class="u3j-error">{}</span>', job.error_class)
        if not job.backend or job.status != "succeeded":
            return "-"
        text = json.dumps(job.return_value)
        short = text if len(text) <= RESULT_PREVIEW else text[: RESULT_PREVIEW - 1] + "…"
        return format_html('<code title="{}">{}</code>', text, short)

    @admin.display(description="Return value")
    def return_value_column(self, job: Job) -> SafeString | str:
        if job.status != "succeeded":
            return "-"
        return format_html('<pre class="u3j-pre">{}</pre>', json.dumps(job.return_value, indent=2))

    @admin.display(description="Positional arguments")
    def args_column(self, job: Job) -> SafeString:
        return format_html('<pre class="u3j-pre">{}</pre>', json.dumps(job.args or [], indent=2))

    @admin.display(description="Error")
    def task_error_column(self, job: Job) -> SafeString | str:
        if not job.error_class:
            return "-"
        return format_html(
            '<strong>{}</strong><pre class="u3j-pre">{}</pre>', job.error_class, job.traceback
        )

    @admin.display(description="Task")
    def task_column(self, job: Job) -> SafeString | str:
        if not job.task:
            return "-"
        pk = Task.objects.filter(name=job.task).values_list("pk", flat=True).first()
        if pk is None:
            return job.task
        url = reverse("admin:ultimat3_jobs_task_change", args=[pk])
        return format_html('<a href="{}">{}</a>', url, job.task)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # Jobs are enqueued by code, the scheduler or "Run now".

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # "change" gates the list's actions; a job's own page stays read-only, because saving
        # it would write back every column as loaded over what a worker wrote meanwhile.
        return obj is None and super().has_change_permission(request, obj)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        if search_term.isascii() or connections[queryset.db].vendor != "sqlite":
            return super().get_search_results(request, queryset, search_term)
        # SQLite keeps an input as Django's JSON text, non-ASCII escaped ("\u00fc"): Django's
        # search, each word also matched as that text writes it.
        for word in smart_split(search_term):
            if word[:1] in ('"', "'") and word[-1:] == word[0] and len(word) > 1:
                word = unescape_string_literal(word)
            found = Q()
            for field in self.search_fields:
                found |= Q(**{f"{field}__icontains": word})
            if not word.isascii():
                # SQLite's LIKE folds the case of ASCII letters only: each case of the others.
                for form in {word, word.lower(), word.upper()}:
                    found |= Q(input__icontains=json.dumps(form)[1:-1])
            queryset = queryset.filter(found)
        return queryset, False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # Only a finished job may be deleted (it frees its key, as pruning does). A queued one
        # would vanish unrun: cancel it. A running one would leave its worker writing to
        # nothing. Django asks this of every selected job, in the delete view and the action.
        if obj is not None and obj.status not in FINISHED:
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        # Finished only, re-checked in the statement: a worker may have claimed it since.
        jobs = self.model.objects.filter(pk=obj.pk)
        self._store(jobs).delete_finished(jobs)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._store(queryset).delete_finished(queryset)

    @admin.action(permissions=["change"], description="Retry selected failed jobs")
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Failed -> queued, due now, with a fresh set of attempts (``JobStore.retry_failed``)."""
        selected = queryset.count()  # Before: the selection may be filtered by the status.
        count = self._store(queryset).retry_failed(queryset)
        self._report(request, count, selected, "requeued", "failed")

    @admin.action(permissions=["change"], description="Cancel selected queued jobs")
    def cancel_queued(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Queued -> cancelled. A job a worker already claimed is running and is left alone.

        A monitored occurrence whose last jobs these were is closed in Sentry (``error``): no
        worker will end them, and Sentry would wait out its ``max_runtime``."""
        selected = queryset.count()  # Before: the selection may be filtered by the status.
        store = self._store(queryset)
        cancelling: list[int] = []
        if checkins.sending():
            cancelling = list(queryset.filter(status__in=CANCELLABLE).values_list("pk", flat=True))
        count = store.cancel_queued(queryset)
        if cancelling:
            closing = checkins.CheckIns(using=store.using, store=store, inline=True)
            transaction.on_commit(
                lambda: closing.ended((pk, None) for pk in cancelling), using=store.using
            )
        self._report(request, count, selected, "cancelled", "queued")

    def _report(
        self, request: HttpRequest, done: int, selected: int, verb: str, status: str
    ) -> None:
        plural = "job" if done == 1 else "jobs"
        text = f"{verb.capitalize()} {done} {status} {plural}."
        skipped = selected - done
        if skipped:
            text += f" Left {skipped} alone: not {status} (any more)."
        level = messages.SUCCESS if done and not skipped else messages.WARNING
        self.message_user(request, text, level)
