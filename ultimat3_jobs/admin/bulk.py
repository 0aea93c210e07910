"""Deleting from the admin: Django's bulk delete for lists whose "select all" takes thousands
of rows, and a delete page that says why some rows may not go."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

#: The most rows one bulk delete takes: Django's confirmation loads, lists and logs each one,
#: and a million of them would take the web process with it.
DELETE_SELECTED_MAX = 10_000


@admin.action(permissions=["delete"], description="Delete selected %(verbose_name_plural)s")
def delete_selected(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Model]
) -> Any:
    """Django's action, up to ``DELETE_SELECTED_MAX`` rows; its confirmation keeps a "select
    all" as one field (``admin/ultimat3_jobs/delete_selected_confirmation.html``)."""
    if queryset[: DELETE_SELECTED_MAX + 1].count() > DELETE_SELECTED_MAX:
        modeladmin.message_user(
            request,
            f"Delete takes at most {DELETE_SELECTED_MAX:,} "
            f"{queryset.model._meta.verbose_name_plural} at a time: nothing was deleted. "
            f"Filter the list to fewer{getattr(modeladmin, 'delete_many_hint', '')}.",
            messages.WARNING,
        )
        return None
    response = django_delete_selected(modeladmin, request, queryset)
    if isinstance(response, TemplateResponse) and response.context_data is not None:
        response.context_data["select_across"] = request.POST.get("select_across") == "1"
    return response


class GuardedDelete(admin.ModelAdmin):
    """An admin whose ``has_delete_permission`` refuses some rows: its delete page names them
    as ``refused_as`` rather than as the model Django lacks a permission for."""

    refused_as = ""
    #: Said, after "Filter the list to fewer", when a bulk delete selects too many rows.
    delete_many_hint = ""

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # Django asks has_delete_permission of every selected row, in the delete view and the
        # bulk action alike: a selection holding one refused row deletes nothing.
        deleted, counts, refused, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, {self.refused_as} if refused else refused, protected
