"""The roles as django-health-check checks (the ``health`` extra): ``Scheduler``, ``Worker``,
``Relay``, each ready or not as the database says (``health.database_health``).

Mount them on an endpoint of their own, apart from the web servers' load-balancer probe: a
stopped worker should page someone, not take the web servers out of rotation::

    path("health/jobs/", HealthCheckView.as_view(checks=[
        "ultimat3_jobs.health_checks.Scheduler",
        "ultimat3_jobs.health_checks.Worker",
    ])),
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from .db import app_database
from .health import RoleHealth, database_health
from .logs import failure_fields


@dataclasses.dataclass
class _Role(HealthCheck):
    """One role, ready or ``ServiceUnavailable`` with what is wrong and what to do."""

    role: ClassVar[str]
    #: The database alias whose node table is read: the app's (``db.app_database``) unless
    #: given; its name is in the check's.
    database: str = dataclasses.field(default_factory=app_database)

    async def run(self) -> None:
        # In the request's own thread, where Django opens and closes its connection.
        found = await sync_to_async(self._read)()
        if not found.ready:
            raise ServiceUnavailable(f"{found.detail}; fix: {found.fix}")

    def _read(self) -> RoleHealth:
        try:
            return database_health(self.database, roles=[self.role])[0]
        except DatabaseError as error:
            fields = failure_fields(error)
            raise ServiceUnavailable(
                f"the database could not be read ({type(error).__name__}) [{fields['code']}]; "
                f"fix: {fields['fix']}"
            ) from error


@dataclasses.dataclass
class Scheduler(_Role):
    """A live scheduler leads, its last round is recent, the database grants its leadership."""

    role: ClassVar[str] = "scheduler"


@dataclasses.dataclass
class Worker(_Role):
    """A worker was heard from within ``HEALTH_TICKS`` heartbeats, without an error."""

    role: ClassVar[str] = "worker"


@dataclasses.dataclass
class Relay(_Role):
    """A relay was heard from, and its engine (a Celery broker, a Tasks backend) takes rows."""

    role: ClassVar[str] = "relay"


__all__ = ["Relay", "Scheduler", "Worker"]
