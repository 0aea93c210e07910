"""Tasks as a project declares them: ``@task`` on a function of its own each, in a loop.

The scheduler benchmark declares them in its own process (``declare``); ``run_scheduler``
run as a process of its own finds ``BENCH_DECLARED_TASKS`` of them here at setup, as it finds a
project's.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from ultimat3_jobs import task
from ultimat3_jobs.registry import registry


def declare(n: int) -> list[Any]:
    """N tasks due every minute (``bench.000000``...), each enqueueing one ``demo.ping``."""
    ping = registry.get_job("demo.ping")

    def one(i: int) -> Any:
        def entries(occurrence: datetime) -> list[Any]:
            return [(ping, {"label": occurrence.isoformat()})]

        return task(cron="* * * * *", tz="Europe/Paris", name=f"bench.{i:06d}", max_catch_up=10)(
            entries
        )

    return [one(i) for i in range(n)]


declare(int(os.environ.get("BENCH_DECLARED_TASKS", "0")))
