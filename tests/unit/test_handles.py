"""Handles reach the store and other engines' tasks only through what the app wires in."""

from __future__ import annotations

import os
import subprocess
import sys


def _run(code: str) -> list[str]:
    """The lines ``code`` prints in a fresh process without settings: nothing wired yet."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_job_handle__enqueue_before_the_app_is_ready_is_refused_with_a_fix() -> None:
    code = (
        "import sys\n"
        "from ultimat3_jobs import job\n"
        "from ultimat3_jobs.errors import AppNotReadyError\n"
        "@job(name='script.ping')\n"
        "def ping(n: int) -> None: ...\n"
        "try:\n"
        "    ping.enqueue({'n': 1})\n"
        "except AppNotReadyError as error:\n"
        "    print(error.code)\n"
        "    print(error.message)\n"
        "    print(error.fix)\n"
        "print('ultimat3_jobs.store' in sys.modules)\n"
    )
    code_line, message, fix, store_imported = _run(code)
    assert code_line == "jobs.app.not-ready"
    assert '"script.ping"' in message
    assert '"ultimat3_jobs" to INSTALLED_APPS' in fix
    assert "django.setup()" in fix
    assert store_imported == "False"


def test_job_handle__enqueue_writes_through_the_connected_store_once_checked() -> None:
    code = (
        "from ultimat3_jobs import job, handles\n"
        "from ultimat3_jobs.errors import InvalidJobInputError\n"
        "calls = []\n"
        "def store(handle, data, **fields):\n"
        "    calls.append((handle.name, data, sorted(fields.items())))\n"
        "    return handles.EnqueueResult(created=True, job_id=7, key=fields['key'])\n"
        "handles.connect_store(store)\n"
        "@job(name='script.ping')\n"
        "def ping(n: int) -> None: ...\n"
        "print(ping.enqueue({'n': 1}, key='k', queue='q'))\n"
        "try:\n"
        "    ping.enqueue({'m': 1})\n"
        "except InvalidJobInputError as error:\n"
        "    print(error.code)\n"
        "print(calls)\n"
    )
    result, refused, calls = _run(code)
    assert result == "EnqueueResult(created=True, job_id=7, key='k')"
    assert refused == "jobs.job.input-invalid"
    assert calls == (
        "[('script.ping', {'n': 1}, [('enqueued_by', 'code'), ('key', 'k'), ('queue', 'q'), "
        "('run_at', None), ('task', '')])]"
    )


def test_task_handle__entries_go_through_the_adapters_in_the_order_added() -> None:
    code = (
        "from ultimat3_jobs import job, task, handles\n"
        "from ultimat3_jobs.errors import TaskEntriesError\n"
        "class Foreign: ...\n"
        "foreign = Foreign()\n"
        "@job(name='script.ping')\n"
        "def ping(n: int) -> None: ...\n"
        "@job(name='script.pong')\n"
        "def pong(n: int) -> None: ...\n"
        "@task(cron='0 3 * * *', tz='UTC', name='script.nightly')\n"
        "def nightly(occurrence):\n"
        "    return [(foreign, {'n': 1}), (ping, {'n': 2})]\n"
        "try:\n"
        "    nightly.entries()\n"
        "except TaskEntriesError as error:\n"
        "    print(error.code)\n"
        "def first(value):\n"
        "    return ping if isinstance(value, Foreign) else None\n"
        "def second(value):\n"
        "    return pong\n"
        "for adapter in (first, second, first):\n"
        "    handles.add_entry_adapter(adapter)\n"
        "print([(h.name, data) for h, data in nightly.entries()])\n"
    )
    refused, entries = _run(code)
    assert refused == "jobs.task.entries-failed"
    # ``first`` knows Foreign and is tried first; an entry that is a handle is left as it is.
    assert entries == "[('script.ping', {'n': 1}), ('script.ping', {'n': 2})]"
