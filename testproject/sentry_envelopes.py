"""A Sentry transport that writes every envelope item to a file, one JSON line each: the tests
read the check-ins the processes sent, and nothing goes over the network.

The settings install it when ``ULTIMAT3_SENTRY_ENVELOPES`` names the file.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport


class EnvelopeFile(Transport):
    """Appends ``{"type", "pid", "payload"}`` per item to ``path``; several processes may share
    it (one ``write`` of one line each, in append mode)."""

    def __init__(self, path: str, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.path = path
        self._lock = threading.Lock()

    def capture_envelope(self, envelope: Envelope) -> None:
        lines = []
        for item in envelope.items:
            payload = item.get_bytes()
            lines.append(
                json.dumps({"type": item.type, "pid": os.getpid(), "payload": json.loads(payload)})
                + "\n"
            )
        with self._lock, open(self.path, "a") as file:
            for line in lines:
                file.write(line)
                file.flush()


def read(path: str) -> list[dict[str, Any]]:
    """The items written to ``path``, in the order they were."""
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]
