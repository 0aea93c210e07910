"""``JobsBackend`` is built while apps load: importing and constructing it needs no database."""

from __future__ import annotations

import os
import subprocess
import sys


def test_jobs_backend__imports_and_constructs_without_models_or_a_database() -> None:
    code = (
        "import sys\n"
        "from ultimat3_jobs.backends import JobsBackend\n"
        "backend = JobsBackend('default', {'QUEUES': ['default'], 'OPTIONS': {'DATABASE': 'x'}})\n"
        "print(backend.database, sorted(backend.queues))\n"
        "print('ultimat3_jobs.models' in sys.modules, 'ultimat3_jobs.store' in sys.modules)\n"
        "print(backend.supports_defer and backend.supports_priority\n"
        "      and backend.supports_get_result and backend.supports_async_task)\n"
    )
    # No settings at all: a backend that read them, or a model, would raise here.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["x", "['default']", "False", "False", "True"]
