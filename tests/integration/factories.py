"""Task handles built without registering them, for rounds over many tasks."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.db import connections

from ultimat3_jobs.cron import parse
from ultimat3_jobs.handles import JobHandle, TaskHandle
from ultimat3_jobs.registry import registry
from ultimat3_jobs.zones import resolve_zone


def demo_ping() -> JobHandle:
    handle = registry.get_job("demo.ping")
    assert handle is not None
    return handle


def make_tasks(
    count: int,
    cron: str = "* * * * *",
    tz: str = "UTC",
    catch_up: str = "skip",
    prefix: str = "n",
    overlap: str = "allow",
) -> list[TaskHandle]:
    ping = demo_ping()

    def entries(occurrence: datetime) -> list[tuple[JobHandle, dict[str, Any]]]:
        return [(ping, {"label": occurrence.isoformat()})]

    return [
        TaskHandle(
            entries,
            name=f"{prefix}.{i:05d}",
            schedule=parse(cron),
            zone=resolve_zone(tz, "bench"),
            catch_up=catch_up,  # type: ignore[arg-type]
            max_catch_up=10,
            overlap=overlap,  # type: ignore[arg-type]
        )
        for i in range(count)
    ]


def task_of(
    entries: Callable[[datetime], list[tuple[JobHandle, dict[str, Any]]]],
    name: str,
    cron: str = "* * * * *",
) -> TaskHandle:
    """One task of its own function, in UTC, not registered."""
    return TaskHandle(
        entries,
        name=name,
        schedule=parse(cron),
        zone=resolve_zone("UTC", "test"),
        catch_up="skip",
        max_catch_up=10,
    )


@contextlib.contextmanager
def running(role: Any) -> Iterator[None]:
    """``role.run()`` (a worker's, a relay's) in a thread of its own whose connections close
    as it ends; stopped and joined on leaving the block."""

    def run() -> None:
        try:
            role.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        role.stop("test")
        thread.join(10)
