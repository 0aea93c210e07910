"""Shared fixtures. Tests marked ``postgres`` fail, never skip, when the database is not one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from ultimat3_jobs.registry import Registry, registry

from .redis_server import RedisServer


@pytest.fixture(autouse=True)
def _require_postgres(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.fail(
            "this test needs PostgreSQL: run `make test` (it starts a throwaway cluster) "
            "or set DATABASE_URL=postgres://...",
            pytrace=False,
        )


@pytest.fixture
def fresh_registry() -> Iterator[Registry]:
    """The global registry, restored afterwards, so a test's declarations do not leak."""
    saved = registry.snapshot()
    try:
        yield registry
    finally:
        registry.restore(saved)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A throwaway Redis for the Celery tests, started on first use, removed at the end."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()
