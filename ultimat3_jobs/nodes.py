"""The node table: one heartbeat writer for schedulers and workers, on the database clock.

A worker's jobs are recovered when its heartbeat goes stale and the admin judges a scheduler
by its last round; both compare against the database clock, so every heartbeat is written
with it (``Now()``) rather than with whichever clock the writing node keeps.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime
from typing import Any, Literal

from django.db.models.functions import Now

from .models import Node

Role = Literal["scheduler", "worker", "relay"]
#: Where a scheduler or a worker is in its life: running, draining, stopped.
RunStatus = Literal["idle", "running", "draining", "stopped"]


def new_node_id() -> str:
    """A node id that tells an operator where the process runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def heartbeat(*, using: str, node_id: str, role: Role, started_at: datetime, **fields: Any) -> None:
    """Record that ``node_id`` is alive now, with ``fields`` (``last_error``, ``is_leader``...).

    One UPDATE once the row exists; the first heartbeat of a process creates it.
    """
    rows = Node.objects.using(using)
    if rows.filter(node_id=node_id).update(last_seen_at=Now(), stopped_at=None, **fields):
        return
    rows.create(
        node_id=node_id,
        role=role,
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=started_at,
        last_seen_at=Now(),
        **fields,
    )


def stopped(*, using: str, node_id: str, **fields: Any) -> None:
    """Mark ``node_id`` stopped: its row stays for the admin, never counted live again."""
    Node.objects.using(using).filter(node_id=node_id).update(stopped_at=Now(), **fields)
