"""A Django Tasks backend that runs nothing but answers ``get_result``: the tests finish its
tasks by hand and watch the relay notice."""

from __future__ import annotations

from django_tasks.backends.dummy import DummyBackend


class ReportingBackend(DummyBackend):
    """``DummyBackend`` (results in memory, in this process) that can be asked about them."""

    supports_get_result = True
