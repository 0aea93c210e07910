"""List filters and paging that stay cheap on tables of millions of rows and lists of thousands
of tasks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Field, Model, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.functional import cached_property

#: The rows a filter reads its values from: the latest ones.
RECENT_ROWS = 10_000
#: The values a filter lists at most; the others are found with the search box.
LISTED = 50
#: From this many rows, PostgreSQL's estimate stands for the count of a whole table.
ESTIMATE_FROM = 1_000_000


class RecentValuesFilter(admin.AllValuesFieldListFilter):
    """A column's values among the latest ``RECENT_ROWS`` rows, at most ``LISTED`` of them.

    Django's own filter lists every distinct value in the whole table: at every load of the
    list, a scan of the job table for each filter, and a link for each task. A selected value
    is listed whatever its age; the query string still filters by any value.
    """

    def __init__(
        self,
        field: Field[Any, Any],
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: admin.ModelAdmin[Any],
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        rows = model_admin.get_queryset(request)
        # The id RECENT_ROWS from the newest, read once (an InitPlan), then a range of the
        # primary key: PostgreSQL planned "id IN (the latest ids)" as a scan of the table.
        oldest = rows.order_by("-pk").values("pk")[RECENT_ROWS - 1 : RECENT_ROWS]
        values = (
            rows.filter(pk__gte=Coalesce(Subquery(oldest), 0))
            .distinct()
            .order_by(field_path)
            .values_list(field_path, flat=True)
        )
        found = list(values[: LISTED + 1])
        self.more = len(found) > LISTED
        listed = found[:LISTED]
        listed.extend(value for value in self.lookup_val or () if value not in listed)
        # A list where Django keeps a lazy query: read once here, not again per facet.
        self.lookup_choices = listed  # type: ignore[assignment]

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        yield from super().choices(changelist)
        if self.more:
            yield {
                "selected": False,
                "query_string": changelist.get_query_string(),
                "display": f"… more: search for {self.title}",
            }


class EstimatedCountPaginator(Paginator):
    """Django's paginator, except that a whole PostgreSQL table of ``ESTIMATE_FROM`` rows or
    more counts as the planner's estimate (``pg_class.reltuples``, which autovacuum keeps).

    An exact count reads every row at every load of the list (README, "Figures"), and a
    per-minute task per tenant makes hundreds of millions of rows within the retention. A
    filtered or searched list is counted exactly.
    """

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet) and not rows.query.where:
            connection = connections[rows.db]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                        [connection.ops.quote_name(rows.model._meta.db_table)],
                    )
                    row = cursor.fetchone()
                # -1 (or nothing) until the table was first analyzed.
                if row is not None and row[0] >= ESTIMATE_FROM:
                    return int(row[0])
        return int(super().count)
