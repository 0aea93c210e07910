"""``make run`` as a newcomer runs it: the admin answers, the printed login works, a demo job
succeeds, ``/metrics`` answers, and Ctrl-C leaves nothing running."""

from __future__ import annotations

import http.cookiejar
import re
import sqlite3
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .demo import Demo, pid_running, start_demo
from .helpers import ROOT, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = start_demo(tmp_path)
    yield running
    if running.popen.poll() is None:
        running.stop()


def get(opener: urllib.request.OpenerDirector, url: str, data: bytes | None = None) -> str:
    with opener.open(url, data=data, timeout=15) as response:
        return str(response.read().decode())


def log_in(base_url: str, username: str, password: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    page = get(opener, f"{base_url}/admin/login/?next=/admin/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, page[:500]
    form = {
        "csrfmiddlewaretoken": token.group(1),
        "username": username,
        "password": password,
        "next": "/admin/",
    }
    home = get(opener, f"{base_url}/admin/login/", urllib.parse.urlencode(form).encode())
    assert "Site administration" in home and "Log out" in home, home[:500]
    return opener


def succeeded_demo_jobs(database: Path) -> int:
    with sqlite3.connect(database, timeout=20) as db:
        try:
            row = db.execute(
                "SELECT count(*) FROM ultimat3_jobs_job "
                "WHERE name = 'demo.record_beat' AND status = 'succeeded'"
            ).fetchone()
        except sqlite3.OperationalError:  # not migrated yet
            return 0
    return int(row[0])


def test_make_run__is_the_demo_launcher() -> None:
    dry = subprocess.run(
        ["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    assert "manage.py run_demo" in dry.stdout


def test_run_demo__shows_the_whole_product_and_ctrl_c_leaves_nothing_behind(demo: Demo) -> None:
    children = demo.child_pids()
    username, password = demo.login(timeout=60)
    assert (username, password) == ("admin", "admin")

    opener = log_in(demo.base_url, username, password)
    tasks = get(opener, f"{demo.base_url}/admin/ultimat3_jobs/task/")
    assert "demo.every_ten_seconds" in tasks and "demo.nightly_digest" in tasks

    wait_for(lambda: succeeded_demo_jobs(demo.database), 60, "a demo job to succeed")
    beats = get(opener, f"{demo.base_url}/admin/demo/beat/")
    assert re.search(r"\d+ beats?", beats), beats[:500]

    web_metrics = get(opener, f"{demo.base_url}/metrics")
    assert re.search(
        r'^ultimat3_jobs_jobs\{queue="default",status="succeeded"\} [1-9]', web_metrics, re.M
    )
    own = get(opener, f"http://127.0.0.1:{demo.metrics_port}/metrics")
    assert 'ultimat3_jobs_worker_jobs_processed_total{name="demo.record_beat"' in own
    dispatched = "ultimat3_jobs_scheduler_occurrences_dispatched_total"
    assert f'{dispatched}{{task="demo.every_ten_seconds"}}' in own

    assert all(pid_running(pid) for pid in children)
    assert demo.stop() == 0, demo.output()[-3000:]
    assert [pid for pid in children if pid_running(pid)] == []
    output = demo.output()
    assert 'jobs.worker.stopped reason="SIGTERM" exit_code=0' in output
    assert 'jobs.scheduler.stopped reason="SIGTERM"' in output
    assert "Stopped: the web server and run_jobs have exited." in output


def test_run_demo__a_database_it_cannot_open_is_a_code_and_a_fix_not_a_traceback(
    tmp_path: Path,
) -> None:
    import os
    import sys

    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'no-such-dir' / 'db.sqlite3'}"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "run_demo", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "[jobs.database-unavailable]" in result.stderr
    assert "\nfix: " in result.stderr
