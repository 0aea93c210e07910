"""Query plans, to check a statement reads by an index rather than the whole table."""

from __future__ import annotations

from django.db import connection, transaction


def plans_of(statements: list[str]) -> list[str]:
    """Each statement's plan as PostgreSQL would run it with every index at hand (sequential
    scans priced out, as on a table of millions of rows)."""
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in statements:
            cursor.execute(f"EXPLAIN {sql}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return plans
