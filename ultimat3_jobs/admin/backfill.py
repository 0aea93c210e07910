"""Backfill from the task page: the range, the occurrences it would enqueue, then enqueue them.

The rules live in ``ultimat3_jobs.backfill``, shared with ``manage.py backfill_task``; this
renders the form and the confirmation and reports what was created.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import backfill
from ..errors import UltimateError
from ..registry import registry
from .display import UTC_ZONE, stamp


class BackfillForm(forms.Form):
    """The range of a backfill and its two choices, read as ``manage.py backfill_task`` reads
    them (``--again``, ``--include-paused``)."""

    start = forms.CharField(widget=forms.TextInput(attrs={"placeholder": "2026-03-01T00:00"}))
    end = forms.CharField(widget=forms.TextInput(attrs={"placeholder": "2026-03-07T23:59"}))
    again = forms.BooleanField(
        required=False,
        label="Fire already fired occurrences again",
        help_text="An occurrence that already fired (a job or a record of it) is left out, "
        "whatever its jobs' payload is now. Ticked, it is enqueued with the jobs its payload "
        "gives now; a job already there is still never enqueued twice.",
    )
    include_paused = forms.BooleanField(
        required=False,
        label="Backfill although the task is paused",
        help_text="The task is paused: the scheduler fires none of its occurrences, and a "
        "backfill does not either unless this is ticked. It stays paused.",
    )

    def __init__(self, *args: Any, zone: ZoneInfo, paused: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zone = zone
        for name in ("start", "end"):
            self.fields[name].help_text = (
                f"ISO 8601; without an offset it is read in the task's zone, {zone.key}. "
                "Both ends are included."
            )
        if not paused:
            # Offered where it means something: a task that is not paused is never refused.
            del self.fields["include_paused"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in ("start", "end"):
            if name in data:
                try:
                    data[f"{name}_at"] = backfill.parse_instant(data[name], self.zone, name)
                except UltimateError as error:
                    self.add_error(name, f"{error.message}. Fix: {error.fix}.")
        return data


class BackfillAdmin(admin.ModelAdmin):
    """The backfill page of the task admin: a form, a confirmation, then the POST that runs it.

    For staff with ``run_task``, as "Run now"; the URL is added by ``TaskAdmin.get_urls``.
    """

    def has_run_task_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.run_task")

    def backfill_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the range form, then the occurrences it would enqueue. POST: enqueue them."""
        if not self.has_run_task_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        task = self.get_object(request, object_id)
        if task is None:
            messages.warning(request, "No task to backfill: it may have been deleted.")
            return HttpResponseRedirect(reverse("admin:ultimat3_jobs_task_changelist"))
        change_url = reverse("admin:ultimat3_jobs_task_change", args=[task.pk])
        # Only a task still declared in code can say what its occurrences enqueue.
        handle = registry.get_task(task.name) if task.declared else None
        if handle is None:
            messages.error(
                request, f"Cannot backfill {task.name}: it is no longer declared in code."
            )
            return HttpResponseRedirect(change_url)
        posted = request.method == "POST"
        source = request.POST if posted else request.GET
        form = BackfillForm(
            source if "start" in source else None, zone=handle.zone, paused=task.paused
        )
        planned, problem = None, ""
        if form.is_bound and form.is_valid():
            start, end = form.cleaned_data["start_at"], form.cleaned_data["end_at"]
            choices = {
                "again": form.cleaned_data["again"],
                "include_paused": form.cleaned_data.get("include_paused", False),
            }
            try:
                if posted:
                    done = backfill.run(
                        handle,
                        start,
                        end,
                        user=request.user.get_username(),
                        via="the admin",
                        **choices,
                    )
                    messages.add_message(request, *_backfill_message(task.name, done))
                    return HttpResponseRedirect(change_url)
                planned = backfill.plan(handle, start, end, **choices)
            except UltimateError as error:
                problem = f"{error.message}. Fix: {error.fix}."
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": task,
            "title": f"Backfill {task.name}",
            "form": form,
            "problem": problem,
            "planned": planned,
            "rows": _backfill_rows(planned, handle.zone) if planned is not None else [],
            "counts": _counts(planned) if planned is not None else {},
            "range": "" if planned is None else _range(planned, handle.zone),
            "limit": backfill.DEFAULT_LIMIT,
            "change_url": change_url,
        }
        return TemplateResponse(request, "admin/ultimat3_jobs/task/backfill.html", context)


def _range(planned: backfill.BackfillPlan, zone: ZoneInfo) -> str:
    return f"{stamp(planned.start, zone, True)} to {stamp(planned.end, zone, True)}"


def _backfill_rows(planned: backfill.BackfillPlan, zone: ZoneInfo) -> list[dict[str, Any]]:
    return [
        {
            "local": stamp(o.occurrence, zone, seconds=True),
            "utc": stamp(o.occurrence, UTC_ZONE, seconds=True),
            "fired": o.occurrence in planned.fired,
            "ahead": planned.ahead(o) and not planned.withheld(o),
            "jobs": [
                {
                    "job": p.job.name,
                    "key": p.key,
                    "present_id": planned.present.get(p.key),
                    "left_out": planned.withheld(o) and p.key not in planned.present,
                }
                for p in o.jobs
            ],
        }
        for o in planned.occurrences
    ]


def _counts(planned: backfill.BackfillPlan) -> dict[str, int]:
    return {
        "new": planned.new,
        "present": planned.already_present,
        "fired": len(planned.already_fired),
        "left_out": planned.left_out,
        "ahead": sum(1 for o in planned.due if planned.ahead(o)),
    }


def _backfill_message(name: str, done: backfill.Backfill) -> tuple[int, SafeString]:
    if not done.plan.occurrences:
        return messages.WARNING, format_html(
            "{} has no occurrence in that range: nothing was enqueued.", name
        )
    jobs = reverse("admin:ultimat3_jobs_job_changelist") + "?" + urlencode({"task": name})
    level = messages.SUCCESS if done.created else messages.WARNING
    fired = len(done.plan.already_fired)
    note = ""
    if fired and done.plan.again:
        note += f" {fired} occurrence(s) already fired: fired again."
    elif fired:
        note += (
            f" {fired} occurrence(s) already fired: not fired again, {done.plan.left_out} job(s) "
            "of their payload now left out."
        )
    ahead = sum(1 for o in done.plan.due if done.plan.ahead(o))
    if ahead:
        note += f" {ahead} occurrence(s) still ahead: due at their own time."
    return level, format_html(
        'Backfilled {} occurrence(s) of {}: {} job(s) created, {} already present.{} <a href="{}">'
        "Its jobs</a>.",
        len(done.plan.occurrences),
        name,
        done.created,
        done.existing,
        note,
        jobs,
    )
