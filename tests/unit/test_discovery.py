"""``tasks.py`` discovery at startup: every app's declarations, the collector off meanwhile."""

from __future__ import annotations

import gc

import pytest

from ultimat3_jobs import apps
from ultimat3_jobs.apps import discover_tasks


def test_discover_tasks__imports_with_the_collector_off_then_puts_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        apps, "autodiscover_modules", lambda name: seen.append((name, gc.isenabled()))
    )
    assert gc.isenabled()
    discover_tasks()
    assert seen == [("tasks", False)]
    assert gc.isenabled()


def test_discover_tasks__a_failing_declaration_puts_the_collector_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(name: str) -> None:
        raise ValueError("a bad declaration")

    monkeypatch.setattr(apps, "autodiscover_modules", fail)
    with pytest.raises(ValueError, match="a bad declaration"):
        discover_tasks()
    assert gc.isenabled()


def test_discover_tasks__leaves_a_collector_the_project_turned_off_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(apps, "autodiscover_modules", lambda name: None)
    gc.disable()
    try:
        discover_tasks()
        assert not gc.isenabled()
    finally:
        gc.enable()
