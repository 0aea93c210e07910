"""``run_scheduler`` and ``run_relay`` as an operator runs them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import ROOT, Process, process_database_url, processes, spawn, wait_for

__all__ = ["processes"]

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *argv],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": process_database_url(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.postgres
def test_run_scheduler__once_json_prints_one_event_object_per_line() -> None:
    result = run("run_scheduler", "--once", "--log-format", "json")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    names = [e["event"] for e in events]
    assert names[0] == "jobs.scheduler.started"
    assert "jobs.scheduler.leadership-acquired" in names
    assert names[-2:] == ["jobs.scheduler.draining", "jobs.scheduler.stopped"]
    started = events[0]
    assert started["leader"] == "advisory" and started["tasks"] >= 2


def test_run_scheduler__bad_flag_value_is_refused_with_a_clear_message() -> None:
    result = run("run_scheduler", "--once", "--tick-interval", "-1")
    assert result.returncode != 0
    assert "must be more than 0 seconds" in result.stderr


@pytest.mark.postgres
def test_run_scheduler__bad_setting_is_refused_with_the_fix_as_hint() -> None:
    result = run("run_scheduler", "--once", ULTIMAT3_JOBS='{"LEADER": "raft"}')
    assert result.returncode != 0
    assert "ultimat3_jobs.E002" in result.stderr
    assert 'HINT: set ULTIMAT3_JOBS["LEADER"] to "advisory"' in result.stderr


@pytest.mark.parametrize("command", ["run_scheduler", "run_worker", "run_jobs", "jobs_status"])
def test_long_running_commands__refuse_an_unmigrated_database_with_the_fix(
    tmp_path: Path, command: str
) -> None:
    result = run(command, DATABASE_URL=f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    assert result.returncode != 0
    assert "fix: run: python manage.py migrate" in result.stderr


def test_run_relay__on_sqlite_polls_without_trying_to_listen(
    tmp_path: Path, processes: list[Process]
) -> None:
    database = f"sqlite:///{tmp_path / 'relay.sqlite3'}"
    migrated = run("migrate", "--no-input", DATABASE_URL=database)
    assert migrated.returncode == 0, migrated.stderr
    relay = spawn(
        tmp_path, "relay", "run_relay", "--poll-interval", "0.2", env={"DATABASE_URL": database}
    )
    processes.append(relay)
    [started] = wait_for(lambda: relay.named("jobs.relay.started"), 30, "the relay to start")
    time.sleep(3)  # Fifteen polls: a LISTEN tried and lost would have been logged by now.
    relay.signal(signal.SIGTERM)
    assert relay.wait(15) == 0
    names = [event["event"] for event in relay.events()]
    assert not [name for name in names if "listen" in name], names
    assert "jobs.relay.stopped" in names
    assert "Traceback" not in relay.log_path.read_text()
    assert started["listen"] is False


def test_jobs_status__right_after_the_only_scheduler_stopped_cleanly__is_not_healthy() -> None:
    assert run("run_scheduler", "--once").returncode == 0

    result = run("jobs_status", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["healthy"], report["schedulers"], report["leader"]) == (False, 0, None)
    [warning] = report["warnings"]
    assert warning["message"].startswith("No scheduler is running (the last one stopped ")


def _project(tmp_path: Path, settings: str, tasks: str = "") -> dict[str, str]:
    """A project of its own in ``tmp_path``: the example's settings plus ``settings``, and an
    app ``probed`` whose ``tasks.py`` is ``tasks``; the environment that runs it."""
    (tmp_path / "probed").mkdir()
    (tmp_path / "probed" / "__init__.py").write_text("")
    (tmp_path / "probed" / "tasks.py").write_text(tasks)
    (tmp_path / "own_settings.py").write_text(
        "from testproject.settings import *  # noqa: F403\n"
        'INSTALLED_APPS = [*INSTALLED_APPS, "probed"]  # noqa: F405\n' + settings
    )
    return {"PYTHONPATH": f"{tmp_path}:{ROOT}", "DJANGO_SETTINGS_MODULE": "own_settings"}


@pytest.mark.postgres
def test_checks__judge_the_leader_on_the_database_the_command_runs_on(tmp_path: Path) -> None:
    # The job tables on PostgreSQL under "jobs", Django's own on SQLite: the advisory leader
    # is right for the scheduler that runs with --database jobs, wrong for "default".
    env = _project(
        tmp_path,
        "import environ\n"
        f'DATABASES["jobs"] = environ.Env.db_url_config("{process_database_url()}")\n',
    )
    env |= {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'default.sqlite3'}",
        "ULTIMAT3_JOBS": '{"LEADER": "advisory"}',
    }

    on_default = run("check", **env)
    on_jobs = run("check", "--database", "jobs", **env)
    scheduler = run("run_scheduler", "--database", "jobs", "--once", **env)

    assert on_default.returncode != 0
    assert 'but the database is sqlite (DATABASES["default"])' in on_default.stderr
    assert on_jobs.returncode == 0, on_jobs.stderr
    assert scheduler.returncode == 0, scheduler.stderr
    assert "E001" not in scheduler.stderr


def test_jobs_status__the_probe_calls_no_task_function(tmp_path: Path) -> None:
    # An exec probe runs every few seconds: it reads the node rows and nothing more, never the
    # project's task functions (the system checks call each once), however slow they are.
    calls = tmp_path / "calls"
    env = _project(
        tmp_path,
        "",
        "from ultimat3_jobs import task\n\n\n"
        '@task(cron="0 3 * * *", tz="UTC", name="probed.nightly")\n'
        "def nightly(occurrence):\n"
        f"    with open({str(calls)!r}, 'a') as out:\n"
        "        out.write('called\\n')\n"
        "    return []\n",
    )
    assert run("run_scheduler", "--once", **env).returncode == 0
    calls.unlink(missing_ok=True)  # the scheduler's own checks called it

    probe = run("jobs_status", "--check", "--role", "scheduler", **env)
    status = run("jobs_status", **env)

    assert probe.returncode == 1  # the --once scheduler has stopped
    assert "scheduler: FAILED" in probe.stdout
    assert status.returncode == 0, status.stderr
    assert "probed.nightly" in status.stdout
    assert not calls.exists()


def test_jobs_status__a_bad_setting_is_refused_with_its_fix_not_a_traceback() -> None:
    result = run("jobs_status", "--check", ULTIMAT3_JOBS='{"ADVISORY_LOCK_KEY": "abc"}')
    assert result.returncode == 1
    assert "[jobs.config-invalid]" in result.stderr
    assert 'fix: set ULTIMAT3_JOBS["ADVISORY_LOCK_KEY"] to an integer' in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("role", "flags", "slow"),
    [
        ("scheduler", (), "checks"),
        ("scheduler", ("--once",), "checks"),
        ("worker", (), "checks"),
        ("scheduler", (), "import"),
        ("worker", (), "import"),
        ("relay", (), "import"),
    ],
    ids=["scheduler", "scheduler_once", "worker", "scheduler_setup", "worker_setup", "relay_setup"],
)
def test_run_role__a_sigterm_while_it_starts_drains_it_at_once_and_exits_0(
    tmp_path: Path, processes: list[Process], role: str, flags: tuple[str, ...], slow: str
) -> None:
    # The system checks call each task's function, and Django's setup imports each tasks.py:
    # one of them takes seconds, and the signal comes meanwhile, before the role could hook it.
    called = tmp_path / "called"
    sleep = f"    open({str(called)!r}, 'w').close()\n    time.sleep(4)\n"
    env = _project(
        tmp_path,
        "",
        "import time\n\nfrom ultimat3_jobs import task\n\n"
        + ("if True:\n" + sleep if slow == "import" else "")
        + "\n"
        '@task(cron="0 3 * * *", tz="UTC", name="probed.slow")\n'
        "def slow(occurrence):\n" + (sleep if slow == "checks" else "") + "    return []\n",
    )
    process = spawn(tmp_path, role, f"run_{role}", *flags, env=env)
    processes.append(process)
    wait_for(called.exists, 60, "the checks to call the task function")
    started = time.monotonic()

    process.signal(signal.SIGTERM)

    assert process.wait(30) == 0, process.log_path.read_text()
    assert time.monotonic() - started < 20
    [draining] = process.named(f"jobs.{role}.draining")
    assert draining["reason"] == "SIGTERM"
    assert process.named(f"jobs.{role}.stopped")
    assert not process.named("jobs.scheduler.not-leader")  # it asked no election


#: A tasks.py whose one declaration names a zone no database has.
BAD_ZONE_TASKS = (
    "from ultimat3_jobs import task\n\n\n"
    '@task(cron="0 3 * * *", tz="Europe/Nowhere", name="probed.lost")\n'
    "def lost(occurrence):\n"
    "    return []\n"
)


@pytest.mark.parametrize(
    "argv", [["check"], ["run_scheduler", "--once"], ["run_worker", "--burst"]]
)
def test_a_bad_declaration__stops_each_command_with_its_code_fix_and_place_not_a_traceback(
    tmp_path: Path, argv: list[str]
) -> None:
    env = _project(tmp_path, "", BAD_ZONE_TASKS)

    result = run(*argv, **env)
    shown = run(*argv, "--traceback", **env)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "[jobs.task.tz-invalid]" in result.stderr
    assert f"{tmp_path / 'probed' / 'tasks.py'}, line 4" in result.stderr
    assert "\nfix: " in result.stderr
    # Asked for, the traceback is there as before.
    assert shown.returncode == 1
    assert "Traceback" in shown.stderr


def test_a_bad_cron__is_placed_at_its_line_in_tasks_py_not_in_code_made_at_run_time(
    tmp_path: Path,
) -> None:
    # The parser's error is raised in a dataclass's generated __init__ ("<string>").
    bad_cron = BAD_ZONE_TASKS.replace('"0 3 * * *"', '"61 * * * *"').replace("Nowhere", "Paris")
    env = _project(tmp_path, "", bad_cron)

    result = run("check", **env)

    assert result.returncode == 1
    assert "[jobs.task.cron-invalid]" in result.stderr
    assert f"{tmp_path / 'probed' / 'tasks.py'}, line 4" in result.stderr, result.stderr


def test_a_bad_declaration__is_raised_as_it_is_outside_a_command_and_kept_by_runserver(
    tmp_path: Path,
) -> None:
    import os

    env = {
        **os.environ,
        "DATABASE_URL": process_database_url(),
        **_project(tmp_path, "", BAD_ZONE_TASKS),
    }
    # A process of its own setting Django up (a web server's, a script's): the exception.
    setup = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert setup.returncode == 1
    assert "Traceback" in setup.stderr
    assert "InvalidTimezoneError" in setup.stderr
    # runserver's reloader shows the traceback and waits for the file to be fixed.
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runserver", "127.0.0.1:0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(8)
    finally:
        server.terminate()
        _, errors = server.communicate(timeout=30)
    assert "InvalidTimezoneError" in errors


@pytest.mark.postgres
def test_run_scheduler_once__on_a_node_that_does_not_lead_says_so_and_exits_0() -> None:
    import psycopg

    from ultimat3_jobs.conf import get_settings

    url = process_database_url().replace("postgres://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as leader:
        leader.execute("SELECT pg_advisory_lock(%s)", [get_settings().advisory_lock_key])
        result = run("run_scheduler", "--once", "--leader", "advisory", "--log-format", "json")

    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    [said] = [event for event in events if event["event"] == "jobs.scheduler.not-leader"]
    assert said["leader"] == "advisory"
    assert not [event for event in events if event["event"] == "jobs.scheduler.dispatched"]
