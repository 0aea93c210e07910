"""LISTEN for NOTIFY: the PostgreSQL job store notifies a channel as it writes new rows
(``store.postgres``), idle workers and relays listen on it.

PostgreSQL only; elsewhere nothing is notified and workers poll. Polling stays the fallback
everywhere: a lost LISTEN connection is logged and retried, never fatal.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from .db import dedicated_connection
from .logs import emit, failure_fields
from .retries import loop_backoff

#: The channel workers LISTEN on; the payload is the queue name.
NOTIFY_CHANNEL = "ultimat3_jobs"
#: The payload that wakes relays (an outbox row); no queue of ours is named so.
RELAY_PAYLOAD = ":relay"


class Listener:
    """LISTEN for enqueues on a connection of its own; call ``wake`` for one of our queues.

    ``role`` names what listens (a worker, a relay) in its log lines (``jobs.<role>.listening``,
    ``jobs.<role>.listen-lost``) and its connection's ``application_name``.
    """

    #: Seconds of silence after which the connection is checked with a query.
    CHECK_AFTER = 30.0

    def __init__(
        self,
        *,
        role: str,
        using: str,
        queues: frozenset[str] | None,
        wake: Callable[[], None],
        retry_after: float,
    ) -> None:
        self.role = role
        self.using = using
        self.queues = queues
        self.wake = wake
        self.retry_after = retry_after
        self.listening = threading.Event()
        self._stop = threading.Event()
        # Written to on stop, so the select() below returns at once instead of at a timeout.
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._logger = logging.getLogger(f"ultimat3_jobs.{role}")

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"ultimat3-{self.role}-listen", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _connect(self) -> psycopg.Connection[Any]:
        return dedicated_connection(self.using, f"ultimat3_jobs {self.role} listen")

    def _run(self) -> None:
        lost = False
        # Attempts that failed in a row: the wait before the next doubles from retry_after,
        # capped, so a database that is away is not asked for a connection every second.
        failures = 0
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                self.listening.set()
                failures = 0
                emit(self._logger, f"jobs.{self.role}.listening", regained=lost)
                # Whatever was enqueued while we were not listening is due now.
                self.wake()
                self._listen(conn)
            except (psycopg.Error, OSError) as error:
                self.listening.clear()
                if self._stop.is_set():
                    break
                lost = True
                failures += 1
                interval = timedelta(seconds=self.retry_after)
                retry_in = loop_backoff(interval, failures - 1).total_seconds()
                emit(
                    self._logger,
                    f"jobs.{self.role}.listen-lost",
                    logging.WARNING,
                    failures=failures,
                    retry_in=retry_in,
                    **failure_fields(error),
                )
                self._stop.wait(retry_in)
            finally:
                self.listening.clear()
                if conn is not None:
                    conn.close()

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([conn.fileno(), self._stop_r], [], [], self.CHECK_AFTER)
            if self._stop_r in ready:
                return
            if not ready:
                conn.execute("SELECT 1")  # Long silence: make sure the connection still works.
                continue
            for note in conn.notifies(timeout=0):
                if self.queues is None or note.payload in self.queues:
                    self.wake()
