"""The tasks admin: next runs, history, pausing, "Run now" and backfill.

Declarations are read-only here because code is their source of truth; the scheduler mirrors
them into the ``Task`` table when it starts. Pausing is the one edit, and it writes only the
pause columns so it can never put back a watermark the scheduler has moved since the page
was loaded.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString, mark_safe

from .. import clock, history
from ..attempts import timeout_of
from ..catchup import Span
from ..cron import (
    CronSchedule,
    DstGap,
    DstRepeat,
    OccurrenceKind,
    describe_occurrence,
    occurrences,
    parse,
)
from ..db import app_database
from ..errors import UltimateError, readable
from ..handles import TaskHandle
from ..humanize import OCCURRENCE_NOTES, describe_cron, dst_rule
from ..manual import ManualRun, preview, run_now, settle_pause
from ..models import RunToken, Task
from ..registry import registry
from ..status import scheduler_status
from ..store import store_for
from ..zones import resolve_zone
from .backfill import BackfillAdmin
from .bulk import GuardedDelete, delete_selected
from .display import (
    UTC_ZONE,
    both_zones,
    fields_of,
    job_link,
    last_round,
    stamp,
    timeout_text,
    utc_column,
)

#: How many upcoming runs the task page previews, how many past records it lists, and how
#: many jobs of one record (a backfill may have a thousand).
NEXT_RUNS = 10
HISTORY = 20
HISTORY_JOBS = 10


# -- what a Task row means now ----------------------------------------------------------------


@dataclass(frozen=True)
class _Schedule:
    """The schedule of a task: the live declaration, else the one stored when it was removed.

    A removed task's DST options are not stored, so its preview uses the defaults.
    """

    schedule: CronSchedule
    zone: ZoneInfo
    dst_gap: DstGap = "end-of-gap"
    dst_repeat: DstRepeat = "first"

    def next_runs(self, n: int, after: datetime | None = None) -> list[datetime]:
        found = occurrences(
            self.schedule,
            self.zone,
            after or clock.now(),
            dst_gap=self.dst_gap,
            dst_repeat=self.dst_repeat,
        )
        return list(islice(found, n))

    def kind(self, at: datetime) -> OccurrenceKind:
        return describe_occurrence(
            self.schedule, self.zone, at, dst_gap=self.dst_gap, dst_repeat=self.dst_repeat
        )

    def rule(self) -> str:
        return dst_rule(self.schedule, self.dst_gap, self.dst_repeat)


def _schedule_of(task: Task) -> _Schedule | None:
    handle = registry.get_task(task.name)
    if handle is not None:
        return _Schedule(handle.schedule, handle.zone, handle.dst_gap, handle.dst_repeat)
    try:
        return _Schedule(parse(task.cron), resolve_zone(task.tz, task.name))
    except (UltimateError, ValueError):
        # A removed task whose stored cron or zone this version no longer accepts.
        return None


def _live_handle(task: Task) -> TaskHandle | None:
    """The declaration "Run now" would call: none for a task removed from code."""
    return registry.get_task(task.name) if task.declared else None


# -- tasks --------------------------------------------------------------------------------------


class TaskPauseForm(forms.ModelForm):
    """The one edit: pause or resume, with a note saying why."""

    class Meta:
        model = Task
        fields = ["paused", "paused_note"]
        widgets = {"paused_note": forms.TextInput(attrs={"size": 80})}
        help_texts = {
            "paused": "While paused, the scheduler records each occurrence as skipped instead "
            "of enqueueing its jobs. Resuming does not replay them.",
            "paused_note": "Why it is paused, so the next person knows when to resume it.",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("paused") and not (data.get("paused_note") or "").strip():
            self.add_error("paused_note", "Say why the task is paused.")
        return data


@admin.register(Task)
class TaskAdmin(BackfillAdmin, GuardedDelete):
    """Tasks as declared in code, their next runs and history; pause and "Run now"."""

    refused_as = "tasks still declared in code (remove their @task first)"

    form = TaskPauseForm
    list_display = [
        "name",
        "schedule_column",
        "tz",
        "next_run_column",
        "last_fired_column",
        "catch_up_column",
        "jobs_column",
        "state_column",
    ]
    list_filter = ["paused", "declared", "catch_up", "overlap", "tz"]
    search_fields = ["name", "cron", "tz", "paused_note"]
    actions = ["run_selected", delete_selected]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "schedule_column",
                    "dst_column",
                    "tz",
                    "catch_up_column",
                    "overlap_column",
                    "jobs_column",
                    "declared_column",
                ]
            },
        ),
        (
            "Watermark",
            {
                "fields": [
                    "last_fired_column",
                    "watermark_column",
                    "first_seen_column",
                    "synced_column",
                ]
            },
        ),
        ("Pause", {"fields": ["paused", "paused_note", "paused_by", "paused_at_column"]}),
    ]
    readonly_fields = fields_of(fieldsets, editable=("paused", "paused_note"))

    first_seen_column = utc_column("first_seen_at", "First seen")
    synced_column = utc_column("synced_at", "Synced")
    paused_at_column = utc_column("paused_at", "Paused at")

    # -- columns --

    @admin.display(description="Schedule", ordering="cron")
    def schedule_column(self, task: Task) -> SafeString:
        words = describe_cron(task.cron)
        return format_html(
            '<code class="u3j-cron">{}</code>{}',
            task.cron,
            format_html('<span class="u3j-sub">{}</span>', words) if words else "",
        )

    @admin.display(description="DST")
    def dst_column(self, task: Task) -> str:
        schedule = _schedule_of(task)
        return schedule.rule() if schedule is not None else ""

    @admin.display(description="Next run")
    def next_run_column(self, task: Task) -> SafeString | str:
        schedule = _schedule_of(task)
        if schedule is None:
            return "-"
        at = schedule.next_runs(1)[0]
        if not task.declared:
            note = "removed from code: will not run"
        elif task.paused:
            note = "paused: will be skipped"
        else:
            note = ""
        return both_zones(at, schedule.zone, seconds=schedule.schedule.has_seconds, note=note)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        # The occurrence each task fired last, as jobs_status says it: the watermark also
        # moves past dropped, paused and skipped ones. One index look per row shown.
        tasks = super().get_queryset(request)
        return tasks.annotate(last_fired=history.last_fired(tasks.db))

    @admin.display(description="Last fired", ordering="last_fired")
    def last_fired_column(self, task: Task) -> SafeString | str:
        fired: datetime | None = getattr(task, "last_fired", None)
        if fired is None:
            return "never"  # Or its records are pruned: its last fired record stays.
        schedule = _schedule_of(task)
        zone = schedule.zone if schedule is not None else UTC_ZONE
        return both_zones(fired, zone, seconds=True)

    @admin.display(description="Dealt with up to")
    def watermark_column(self, task: Task) -> SafeString | str:
        # Arming sets the watermark just before the first occurrence, so a watermark still in
        # the future means nothing has been dealt with since the task was first seen.
        if task.last_fired_at is None or task.last_fired_at > clock.now():
            return "nothing yet"
        schedule = _schedule_of(task)
        zone = schedule.zone if schedule is not None else UTC_ZONE
        at = both_zones(task.last_fired_at, zone, seconds=True)
        return format_html("{} (fired, dropped or skipped)", at)

    @admin.display(description="Catch-up", ordering="catch_up")
    def catch_up_column(self, task: Task) -> str:
        if task.catch_up == "run-all":
            return f"run-all (at most {task.max_catch_up})"
        return task.catch_up

    @admin.display(description="Overlap", ordering="overlap")
    def overlap_column(self, task: Task) -> str:
        if task.overlap == "skip":
            return "skip: an occurrence is skipped while an earlier one is queued or running"
        return "allow: occurrences may run side by side"

    @admin.display(description="Jobs")
    def jobs_column(self, task: Task) -> SafeString | str:
        if not task.jobs:
            return "-"
        names = format_html_join(
            mark_safe("<br>"),
            "<code>{}</code>{}",
            ((name, _timeout_note(name)) for name in task.jobs),
        )
        return format_html('<span class="u3j-jobs">{}</span>', names)

    @admin.display(description="State", ordering="paused")
    def state_column(self, task: Task) -> SafeString:
        # One column for "paused" and "removed from code": two boolean columns of mostly
        # red crosses read as errors on a healthy list.
        if not task.declared:
            return mark_safe('<span class="u3j-badge u3j-dropped">removed from code</span>')
        if task.paused:
            return format_html(
                '<span class="u3j-badge u3j-paused" title="{}">paused</span>'
                '<span class="u3j-sub">{}</span>',
                task.paused_note,
                f"{task.paused_note} ({task.paused_by})" if task.paused_by else task.paused_note,
            )
        return mark_safe('<span class="u3j-badge u3j-fired">active</span>')

    @admin.display(description="In code", boolean=True, ordering="declared")
    def declared_column(self, task: Task) -> bool:
        return task.declared

    @admin.display(description="")
    def run_now_column(self, task: Task) -> SafeString | str:
        if _live_handle(task) is None:
            return ""
        url = reverse("admin:ultimat3_jobs_task_run_one", args=[task.pk])
        return format_html('<a class="button u3j-run" href="{}">Run now</a>', url)

    # -- permissions --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # Tasks are declared in code.

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        # Only a task removed from code may go: a declared one would come back at the next
        # scheduler start with no watermark.
        if obj is not None and obj.declared:
            return False
        return super().has_delete_permission(request, obj)

    def has_run_task_permission(self, request: HttpRequest) -> bool:
        """Staff with ``ultimat3_jobs.run_task`` may run tasks now (the admin checks staff)."""
        return request.user.has_perm(f"{self.opts.app_label}.run_task")

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        self.delete_queryset(request, self.model.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        store_for(queryset.db).delete_removed_tasks(queryset)

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        columns: list[Any] = list(super().get_list_display(request))
        if self.has_run_task_permission(request):
            columns.append("run_now_column")
        return columns

    # -- pausing --

    def save_model(
        self, request: HttpRequest, obj: Task, form: forms.ModelForm, change: bool
    ) -> None:
        settled = None
        with transaction.atomic(using=obj._state.db):
            if "paused" in form.changed_data:
                if obj.paused:
                    obj.paused_by, obj.paused_at = request.user.get_username(), clock.now()
                else:
                    settled = self._settle_pause(request, obj)
                    obj.paused_note, obj.paused_by, obj.paused_at = "", "", None
            # Only the pause columns: a full save would write back the watermark as it was
            # when the page loaded, and the scheduler may have advanced it since.
            obj.save(update_fields=["paused", "paused_note", "paused_by", "paused_at"])
        if settled is not None:
            self.message_user(
                request,
                f"{settled.count:,}{'+' if settled.at_least else ''} occurrence(s) of "
                f"{obj.name} came due while it was paused and no round recorded them: recorded "
                "as skipped, not replayed.",
                messages.INFO,
            )

    def _settle_pause(self, request: HttpRequest, obj: Task) -> Span | None:
        """Record as skipped what came due while paused and no round recorded it: a leading
        scheduler's rounds do, a dead one's do not (``manual.settle_pause``). Whether one
        leads is not asked: a SIGKILLed leader's node row says it does until it goes silent,
        and a live leader has left nothing older than its last round to settle."""
        handle = registry.get_task(obj.name)
        using = obj._state.db or app_database()
        if handle is None or obj.paused_at is None:
            return None
        return settle_pause(
            handle, obj.paused_at, user=request.user.get_username(), store=store_for(using)
        )

    # -- pages --

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        status = scheduler_status()
        age = status.last_round_age
        context = {
            "title": "Scheduled tasks",
            "scheduler_status": status,
            "scheduler_last_round": last_round(status.last_round_at, age),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        task = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if task is not None:
            context.update(
                next_runs=self._next_runs_preview(task),
                history=self._history(task),
                can_run_now=self.has_run_task_permission(request)
                and _live_handle(task) is not None,
                run_now_url=reverse("admin:ultimat3_jobs_task_run_one", args=[task.pk])
                + "?"
                + urlencode({"next": request.path}),
                backfill_url=reverse("admin:ultimat3_jobs_task_backfill", args=[task.pk]),
                jobs_url=reverse("admin:ultimat3_jobs_job_changelist")
                + "?"
                + urlencode({"task": task.name}),
                occurrences_url=reverse("admin:ultimat3_jobs_occurrence_changelist")
                + "?"
                + urlencode({"task": task.name}),
            )
        return super().change_view(request, object_id, form_url, extra_context=context)

    def _next_runs_preview(self, task: Task) -> list[dict[str, Any]]:
        schedule = _schedule_of(task)
        if schedule is None:
            return []
        rows = []
        utc = UTC_ZONE
        seconds = schedule.schedule.has_seconds
        for at in schedule.next_runs(NEXT_RUNS):
            kind = schedule.kind(at)
            rows.append(
                {
                    "local": stamp(at, schedule.zone, seconds),
                    "utc": stamp(at, utc, seconds),
                    "kind": kind,
                    "note": OCCURRENCE_NOTES[kind],
                }
            )
        return rows

    def _history(self, task: Task) -> list[dict[str, Any]]:
        schedule = _schedule_of(task)
        zone = schedule.zone if schedule is not None else UTC_ZONE
        rows = []
        store = store_for(self.model.objects.db)
        for entry in store.recent_records(task.name, HISTORY, jobs_per_record=HISTORY_JOBS):
            record = entry.record
            first, last = record.occurrence, record.last_occurrence
            rows.append(
                {
                    "recorded": stamp(record.recorded_at, UTC_ZONE, seconds=True),
                    "outcome": record.outcome,
                    "outcome_label": history.outcome_label(record.outcome),
                    # To the second: a task firing every ten seconds has rows a minute apart.
                    "first": stamp(first, zone, seconds=True) if first else "",
                    "last": stamp(last, zone, seconds=True) if last and last != first else "",
                    "count": record.count,
                    "catch_up": record.catch_up,
                    "jobs": [
                        {"job": job.job, "key": job.key, "created": job.created, "id": pk}
                        for job, pk in entry.jobs
                    ],
                    "more_jobs": len(record.jobs) - len(entry.jobs),
                    "by": record.user or record.node,
                    "detail": record.detail,
                }
            )
        return rows

    # -- "Run now" --

    def get_urls(self) -> list[URLPattern]:
        guarded = self.admin_site.admin_view(self.run_view)

        def view(request: HttpRequest, object_id: str | None = None) -> HttpResponse:
            # An action URL: anyone who may not run tasks gets 403, never a login page that
            # would replay the request after logging in.
            if not self.admin_site.has_permission(request):
                raise PermissionDenied
            return guarded(request, object_id=object_id)

        guarded_backfill = self.admin_site.admin_view(self.backfill_view)

        def backfill_view(request: HttpRequest, object_id: str) -> HttpResponse:
            if not self.admin_site.has_permission(request):
                raise PermissionDenied
            return guarded_backfill(request, object_id=object_id)

        # Ahead of the default patterns, whose "<path:object_id>/" would swallow "run/".
        return [
            path("run/", view, name="ultimat3_jobs_task_run"),
            path("<path:object_id>/run/", view, name="ultimat3_jobs_task_run_one"),
            path("<path:object_id>/backfill/", backfill_view, name="ultimat3_jobs_task_backfill"),
            *super().get_urls(),
        ]

    @admin.action(permissions=["run_task"], description="Run selected tasks now")
    def run_selected(self, request: HttpRequest, queryset: QuerySet[Task]) -> HttpResponse | None:
        # Actions are POSTs that act at once; this one only leads to the confirmation page.
        ids = list(queryset.values_list("pk", flat=True)[: RUN_SELECTED_MAX + 1])
        if len(ids) > RUN_SELECTED_MAX:
            # The confirmation previews every task (calling its function) and carries their
            # ids in its address and its form, which servers cap (gunicorn: 4 KB of address).
            self.message_user(
                request,
                f"Run now takes at most {RUN_SELECTED_MAX} tasks at a time; "
                f"{queryset.count():,} were selected: nothing was run. Filter the list or "
                "select fewer.",
                messages.WARNING,
            )
            return None
        query = urlencode([("ids", pk) for pk in ids])
        return HttpResponseRedirect(f"{reverse('admin:ultimat3_jobs_task_run')}?{query}")

    def run_view(self, request: HttpRequest, object_id: str | None = None) -> HttpResponse:
        """GET: what would be enqueued, and a confirm button. POST: run the tasks now.

        The form carries a one-time token: submitting it twice (a double click, a reload)
        runs the tasks once. Each task runs on its own, so one that fails is reported and
        the others still run.
        """
        if not self.has_run_task_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        changelist = reverse("admin:ultimat3_jobs_task_changelist")
        source = request.POST if request.method == "POST" else request.GET
        raw = [object_id] if object_id is not None else source.getlist("ids")
        ids = [_task_id(value) for value in raw]
        tasks = list(Task.objects.filter(pk__in=ids).order_by("name"))
        if not tasks:
            messages.warning(request, "No task to run: it may have been deleted.")
            return HttpResponseRedirect(changelist)
        next_url = source.get("next", "")
        if not url_has_allowed_host_and_scheme(
            next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            next_url = changelist
        if request.method == "POST":
            refused = _use_run_token(request, request.POST.get("run_token", ""), tasks)
            if refused is None:
                for task in tasks:
                    self._run_one(request, task)
                return HttpResponseRedirect(next_url)
            messages.warning(request, refused)
            if refused == ALREADY_SUBMITTED:
                # Back where a run leads, never to a fresh confirmation to click again.
                return HttpResponseRedirect(next_url)
        previews = [preview(_live_handle(task), task.name, paused=task.paused) for task in tasks]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Run tasks now?" if len(tasks) > 1 else f"Run {tasks[0].name} now?",
            "previews": previews,
            "runnable": any(p.runnable for p in previews),
            "ids": [task.pk for task in tasks],
            "run_token": _run_token(request, tasks),
            "next_url": next_url,
            "cancel_url": next_url,
        }
        return TemplateResponse(request, "admin/ultimat3_jobs/task/run_now.html", context)

    def _run_one(self, request: HttpRequest, task: Task) -> None:
        handle = _live_handle(task)
        if handle is None:
            messages.error(request, f"Could not run {task.name}: it is no longer declared in code.")
            return
        try:
            run = run_now(handle, user=request.user.get_username())
        except UltimateError as error:
            messages.error(
                request,
                format_html(
                    "Could not run {}: {}. Fix: {}. Nothing was enqueued.",
                    task.name,
                    error.message,
                    error.fix,
                ),
            )
            return
        except Exception as error:
            # Whatever else the task's code raised: its own writes rolled back, and the other
            # selected tasks still run. A page of per-task results beats a 500 for all.
            messages.error(
                request,
                format_html(
                    "Could not run {}: {}: {}. Nothing was enqueued for it.",
                    task.name,
                    type(error).__name__,
                    readable(error),
                ),
            )
            return
        level, text = _run_message(run)
        messages.add_message(request, level, text)


#: How long a "Run now" confirmation form stays valid.
RUN_TOKEN_MAX_AGE = timedelta(hours=12)
#: The most tasks "Run selected tasks now" takes at once.
RUN_SELECTED_MAX = 100
_RUN_TOKEN_SALT = "ultimat3_jobs.run-now"
ALREADY_SUBMITTED = "This confirmation was already submitted: nothing was run again."


def _timeout_note(name: str) -> str:
    """A job's timeout beside its name on the task page, when it has one."""
    seconds = timeout_of(name)
    return "" if seconds is None else f" (timeout {timeout_text(seconds)})"


def _task_id(value: str) -> int:
    """A task id from the URL or the form; anything else is a page that does not exist."""
    # isdigit() alone takes "²"; the range is the id column's (a bigint).
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise Http404(f"no task with id {value[:30]!r}")
    return int(value)


def _run_token(request: HttpRequest, tasks: Sequence[Task]) -> str:
    """A signed, one-time token for this user's confirmation of exactly these tasks."""
    payload = {"n": uuid.uuid4().hex, "u": request.user.pk, "ids": sorted(t.pk for t in tasks)}
    return signing.dumps(payload, salt=_RUN_TOKEN_SALT)


def _use_run_token(request: HttpRequest, token: str, tasks: Sequence[Task]) -> str | None:
    """Spend ``token``; None if it was good, else why nothing runs."""
    try:
        payload = signing.loads(token, salt=_RUN_TOKEN_SALT, max_age=RUN_TOKEN_MAX_AGE)
    except signing.BadSignature:
        return "This confirmation is missing or has expired: nothing was run. Confirm again."
    if payload.get("u") != request.user.pk or payload.get("ids") != sorted(t.pk for t in tasks):
        return "This confirmation was for other tasks: nothing was run. Confirm again."
    now = clock.now()
    try:
        # Its own transaction, committed before the run: a concurrent second submit of the
        # same form fails to insert the same nonce and runs nothing.
        with transaction.atomic(using=app_database()):
            RunToken.objects.create(nonce=payload["n"], used_at=now)
    except IntegrityError:
        return ALREADY_SUBMITTED
    RunToken.objects.filter(used_at__lt=now - RUN_TOKEN_MAX_AGE).delete()
    return None


def _run_message(run: ManualRun) -> tuple[int, SafeString]:
    """The message after "Run now": each job, linked, as created or already present."""
    if not run.results:
        return messages.WARNING, format_html(
            "Ran {} now, but it returned no jobs: nothing was enqueued.", run.task
        )
    parts = format_html_join(
        "; ",
        "{} {} (key {}) {}",
        (
            (
                r.job,
                job_link(r.result.job_id, f"#{r.result.job_id}"),
                r.result.key,
                "created" if r.result.created else "already present, not enqueued again",
            )
            for r in run.results
        ),
    )
    if run.created:
        return messages.SUCCESS, format_html("Ran {} now: {}.", run.task, parts)
    return messages.WARNING, format_html("Ran {} now, nothing new: {}.", run.task, parts)
