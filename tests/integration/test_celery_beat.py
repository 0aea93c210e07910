"""``manage.py celery_beat_tasks`` against django-celery-beat tables made with plain SQL."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from testproject.demo import celery_tasks
from ultimat3_jobs.celery_beat import interval_cron
from ultimat3_jobs.outbox import CeleryTaskHandle
from ultimat3_jobs.registry import Registry

pytestmark = pytest.mark.django_db

#: The columns the command reads, as django-celery-beat 2.x creates them (others left out).
SCHEMA = [
    """CREATE TABLE django_celery_beat_crontabschedule (
        id integer PRIMARY KEY, minute varchar(240), hour varchar(96),
        day_of_week varchar(64), day_of_month varchar(124), month_of_year varchar(64),
        timezone varchar(63))""",
    """CREATE TABLE django_celery_beat_intervalschedule (
        id integer PRIMARY KEY, every integer, period varchar(24))""",
    """CREATE TABLE django_celery_beat_periodictask (
        id integer PRIMARY KEY, name varchar(200) UNIQUE, task varchar(200), args text,
        kwargs text, queue varchar(200), enabled boolean, one_off boolean,
        crontab_id integer, interval_id integer, solar_id integer, clocked_id integer,
        last_run_at timestamp, total_run_count integer, description text)""",
]
ROWS = [
    "INSERT INTO django_celery_beat_crontabschedule VALUES (1, '0', '3', '*', '*', '*', "
    "'Europe/Paris')",
    "INSERT INTO django_celery_beat_crontabschedule VALUES (2, '30', '8', 'mon-fri', '*', '*', "
    "'UTC')",
    "INSERT INTO django_celery_beat_intervalschedule VALUES (1, 15, 'minutes')",
    "INSERT INTO django_celery_beat_intervalschedule VALUES (2, 7, 'minutes')",
    "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, enabled, "
    "one_off, crontab_id) VALUES (1, 'Nightly report', 'demo.plain_row', '[]', "
    '\'{"label": "nightly"}\', NULL, TRUE, FALSE, 1)',
    "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, enabled, "
    "one_off, interval_id) VALUES (2, 'quarter hour', 'demo.plain_row', '[]', "
    "'{\"label\": \"q\"}', '', TRUE, FALSE, 1)",
    "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, enabled, "
    "one_off, interval_id) VALUES (3, 'every 7', 'demo.plain_row', '[]', '{}', '', TRUE, "
    "FALSE, 2)",
    "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, enabled, "
    "one_off, crontab_id) VALUES (4, 'weekday digest', 'demo.write_row', '[1, 2]', '{}', "
    "'reports', FALSE, FALSE, 2)",
    "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, enabled, "
    "one_off, solar_id) VALUES (5, 'sunrise', 'demo.plain_row', '[]', '{}', '', TRUE, FALSE, 9)",
]
#: Rows whose names, arguments or schedules need more than a copy.
ODD_ROWS = [
    "INSERT INTO django_celery_beat_crontabschedule VALUES (3, '0', '0', '5', '13', '*', 'UTC')",
    # Celery reads a day by its first three letters; a minute of 61 it refuses, not the table.
    "INSERT INTO django_celery_beat_crontabschedule VALUES (4, '0', '9', 'Monday,FRIDAY', '*', "
    "'*', 'UTC')",
    "INSERT INTO django_celery_beat_crontabschedule VALUES (5, '61', '9', '*', '*', '*', 'UTC')",
    # Spaces Celery reads past; a zone written around django-celery-beat's own checks.
    "INSERT INTO django_celery_beat_crontabschedule VALUES (6, '0', '9, 17', '*', '*', '*', 'UTC')",
    "INSERT INTO django_celery_beat_crontabschedule VALUES (7, '0', '9', '*', '*', '*', 'Bogota')",
    *(
        "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, "
        f"enabled, one_off, crontab_id) VALUES ({pk}, '{name}', 'demo.plain_row', {args}, "
        f"{kwargs}, '', TRUE, FALSE, {crontab})"
        for pk, name, args, kwargs, crontab in [
            (6, "task", "'[]'", """'{"label": "t"}'""", 1),
            (7, "named", "'[]'", """'{"label": "n"}'""", 1),
            (8, "x" * 200, "'[]'", """'{"label": "long"}'""", 1),
            (9, "null args", "'null'", """'{"label": "a"}'""", 1),
            (10, "bad kwargs", "'[]'", """'{''label'': 1}'""", 1),
            (11, "not finite", "'[]'", """'{"label": NaN}'""", 1),
            (12, "friday 13th", "'[]'", """'{"label": "f"}'""", 3),
            (13, "day names", "'[]'", """'{"label": "d"}'""", 4),
            (14, "minute 61", "'[]'", """'{"label": "m"}'""", 5),
            (15, "spaced hours", "'[]'", """'{"label": "s"}'""", 6),
            (16, "no such zone", "'[]'", """'{"label": "z"}'""", 7),
        ]
    ),
    # Text from the table that would be code, were it printed as it is in a comment.
    (
        "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, "
        "enabled, one_off, crontab_id) VALUES (17, 'queued oddly', 'demo.plain_row', '[]', "
        """'{"label": "q"}', %s, TRUE, FALSE, 1)""",
        ["q\nraise SystemExit('injected')  #"],
    ),
    "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, enabled, "
    "one_off, crontab_id) VALUES (18, 'once only', 'demo.plain_row', '[]', "
    """'{"label": "o"}', '', FALSE, TRUE, 1)""",
]


@pytest.fixture
def beat_tables() -> None:
    with connection.cursor() as cursor:
        for statement in SCHEMA + ROWS:
            cursor.execute(statement)


@pytest.fixture
def odd_beat_tables(beat_tables: None) -> None:
    with connection.cursor() as cursor:
        for row in ODD_ROWS:
            statement, params = row if isinstance(row, tuple) else (row, None)
            cursor.execute(statement, params)


def test_celery_beat_tasks__odd_rows_print_a_module_that_imports_and_runs(
    odd_beat_tables: None, fresh_registry: Registry
) -> None:
    source = converted()
    namespace: dict[str, Any] = {}
    exec(compile(source, "converted.py", "exec"), namespace)

    at = datetime(2026, 3, 9, 2, tzinfo=UTC)
    for name, label in [("beat.task_task", "t"), ("beat.task_named", "n")]:
        handle = fresh_registry.get_task(name)
        assert handle is not None, source
        [(_, data)] = handle.entries(at)  # named() is still the import's
        assert data == {"label": label}
    [long] = [t for t in fresh_registry.tasks() if t.name.startswith("beat.xxx")]
    assert len(long.name) <= 200
    null_args = fresh_registry.get_task("beat.null_args")
    assert null_args is not None and null_args.entries(at)[0][1] == {"label": "a"}
    assert "# NOTE: args 'null' is not a JSON list: left out" in source
    # What beat would not have run as the declaration would: left as comments, saying why.
    for name in ("beat.bad_kwargs", "beat.not_finite", "beat.friday_13th"):
        assert fresh_registry.get_task(name) is None
    assert "is not a JSON object (beat could not run it)" in source
    assert "# NOTE: kwargs hold NaN or Infinity" in source
    assert 'both day of month "13" and day of week "5"' in source
    days = fresh_registry.get_task("beat.day_names")
    assert days is not None and days.cron == "0 9 * * mon,fri"
    assert fresh_registry.get_task("beat.minute_61") is None
    assert re.search(r"# NOTE: .*61.*: write the cron by hand", source), source
    spaced = fresh_registry.get_task("beat.spaced_hours")
    assert spaced is not None and spaced.cron == "0 9,17 * * *"
    assert fresh_registry.get_task("beat.no_such_zone") is None
    assert fresh_registry.get_task("beat.once_only") is None  # one_off: run it from the admin
    assert fresh_registry.get_task("beat.queued_oddly") is not None  # and nothing injected ran
    assert all(line.startswith("#") for line in source.splitlines() if "injected" in line)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--tz", "Bogota"], "[jobs.task.tz-invalid]"),
        (["--prefix", "a:b"], "[jobs.declaration-invalid]"),
        (["--prefix", " "], "[jobs.declaration-invalid]"),
    ],
    ids=["zone", "colon", "blank"],
)
def test_celery_beat_tasks__a_zone_or_prefix_no_task_takes_is_refused_first(
    beat_tables: None, argv: list[str], says: str
) -> None:
    with pytest.raises(CommandError, match=re.escape(says)):
        converted(*argv)


def converted(*args: str) -> str:
    out = io.StringIO()
    call_command("celery_beat_tasks", *args, stdout=out)
    return out.getvalue()


def test_celery_beat_tasks__prints_declarations_that_run(
    beat_tables: None, fresh_registry: Registry
) -> None:
    source = converted()
    assert "# PeriodicTask 'Nightly report' (id 1): demo.plain_row, crontab 0 3 * * * " in source
    namespace: dict[str, Any] = {}
    exec(compile(source, "converted.py", "exec"), namespace)

    nightly = fresh_registry.get_task("beat.nightly_report")
    assert nightly is not None
    assert (nightly.cron, nightly.tz) == ("0 3 * * *", "Europe/Paris")
    [(handle, data)] = nightly.entries(datetime(2026, 3, 9, 2, tzinfo=UTC))
    assert isinstance(handle, CeleryTaskHandle)
    assert handle.name == celery_tasks.plain_row.name == "demo.plain_row"
    assert data == {"label": "nightly"}

    quarter = fresh_registry.get_task("beat.quarter_hour")
    assert quarter is not None and quarter.cron == "*/15 * * * *"
    # Beat would call it with positional arguments no entry takes: a comment, saying why.
    assert fresh_registry.get_task("beat.weekday_digest") is None
    assert "# @task(cron='30 8 * * mon-fri', tz='UTC', name='beat.weekday_digest')" in source
    # No cron for these: written out as comments, with the reason.
    assert fresh_registry.get_task("beat.every_7") is None
    assert fresh_registry.get_task("beat.sunrise") is None
    assert "# NOTE: no cron fires every 7 minutes" in source
    assert "# NOTE: a solar schedule has no cron equivalent" in source
    assert "# NOTE: positional args [1, 2]" in source
    assert "# NOTE: disabled in beat" in source
    assert '# NOTE: queue "reports"' in source


def test_celery_beat_tasks__a_disabled_row_is_a_commented_out_declaration(
    beat_tables: None, fresh_registry: Registry
) -> None:
    # Declared, with a note to pause it after deploying, it ran from its next occurrence on.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_celery_beat_periodictask (id, name, task, args, kwargs, queue, "
            "enabled, one_off, crontab_id) VALUES (30, 'paused nightly', 'demo.plain_row', '[]', "
            "'{}', '', FALSE, FALSE, 1)"
        )
    source = converted()
    exec(compile(source, "beat_tasks.py", "exec"), {})
    assert fresh_registry.get_task("beat.paused_nightly") is None
    assert "# @task(cron='0 3 * * *', tz='Europe/Paris', name='beat.paused_nightly')" in source
    assert "# NOTE: disabled in beat: uncomment it to schedule it" in source
    assert fresh_registry.get_task("beat.nightly_report") is not None


def test_celery_beat_tasks__skip_disabled_leaves_them_out(beat_tables: None) -> None:
    source = converted("--skip-disabled")
    assert "weekday digest" not in source
    assert "Nightly report" in source


def test_celery_beat_tasks__without_the_tables_says_which_database_to_name() -> None:
    with pytest.raises(CommandError, match="no django_celery_beat_periodictask table") as raised:
        converted()
    assert "--database" in str(raised.value)


@pytest.mark.parametrize(
    ("every", "period", "cron"),
    [
        (1, "seconds", "* * * * * *"),
        (10, "seconds", "*/10 * * * * *"),
        (7, "seconds", None),
        (5, "minutes", "*/5 * * * *"),
        (6, "hours", "0 */6 * * *"),
        (5, "hours", None),
        (1, "days", "0 0 * * *"),
        (2, "days", None),
        (3, "microseconds", None),
    ],
)
def test_interval_cron__only_intervals_that_divide_the_next_unit(
    every: int, period: str, cron: str | None
) -> None:
    assert interval_cron(every, period) == cron
