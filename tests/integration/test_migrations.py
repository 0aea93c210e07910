"""Migrations on a database that already holds tasks, records and jobs: every row stays."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

AT = datetime(2026, 6, 1, 3, tzinfo=UTC)


def migrate_to(target: str) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("ultimat3_jobs", target)])
    return executor


@pytest.fixture
def leave_at_latest() -> Iterator[None]:
    yield
    # Leave the schema as the rest of the suite expects it.
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.usefixtures("leave_at_latest")
def test_0002__keeps_every_row_and_defaults_overlap_to_allow() -> None:
    before, after = "0001_initial", "0002_overlap_and_backfill"
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps
    old.get_model("ultimat3_jobs", "Task").objects.create(
        name="m.nightly", cron="0 3 * * *", tz="UTC", last_fired_at=AT
    )
    for outcome in ("fired", "dropped", "paused", "manual"):
        old.get_model("ultimat3_jobs", "Occurrence").objects.create(
            task="m.nightly", outcome=outcome, occurrence=AT, recorded_at=AT
        )
    old.get_model("ultimat3_jobs", "Job").objects.create(
        name="m.job", key="m.nightly:1:k", run_at=AT, created_at=AT, task="m.nightly"
    )

    executor = migrate_to(after)

    new = executor.loader.project_state([("ultimat3_jobs", after)]).apps
    task = new.get_model("ultimat3_jobs", "Task").objects.get()
    assert (task.name, task.last_fired_at, task.overlap) == ("m.nightly", AT, "allow")
    outcomes = new.get_model("ultimat3_jobs", "Occurrence").objects.values_list(
        "outcome", flat=True
    )
    assert sorted(outcomes) == ["dropped", "fired", "manual", "paused"]
    assert new.get_model("ultimat3_jobs", "Job").objects.get().key == "m.nightly:1:k"
    field = new.get_model("ultimat3_jobs", "Occurrence")._meta.get_field("outcome")
    assert {"overlap", "backfill"} <= {value for value, _ in field.choices}


@pytest.mark.usefixtures("leave_at_latest")
def test_0004__keeps_every_job_as_a_plain_job_of_priority_0() -> None:
    before, after = "0003_run_token", "0004_django_tasks"
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    old.objects.create(name="demo.ping", key="k1", input={"label": "x"}, run_at=AT, created_at=AT)
    old.objects.create(
        name="demo.ping", key="k2", status="failed", last_error="boom", run_at=AT, created_at=AT
    )

    executor = migrate_to(after)

    new = executor.loader.project_state([("ultimat3_jobs", after)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    rows = list(
        new.objects.order_by("key").values_list(
            "key",
            "status",
            "priority",
            "backend",
            "args",
            "return_value",
            "error_class",
            "traceback",
            "last_error",
        )
    )
    assert rows == [
        ("k1", "queued", 0, "", None, None, "", "", ""),
        ("k2", "failed", 0, "", None, None, "", "", "boom"),
    ]


@pytest.mark.usefixtures("leave_at_latest")
def test_0005_0006__keep_every_job_as_a_job_of_our_own_worker() -> None:
    before, after = "0004_django_tasks", "0006_drop_claim_index"
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    old.objects.create(name="demo.ping", key="r1", input={"label": "x"}, run_at=AT, created_at=AT)
    old.objects.create(
        name="demo.ping", key="r2", status="succeeded", finished_at=AT, run_at=AT, created_at=AT
    )

    executor = migrate_to(after)

    new = executor.loader.project_state([("ultimat3_jobs", after)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    rows = list(
        new.objects.order_by("key").values_list(
            "key", "status", "relay", "engine_id", "relayed_at", "done_at", "finished_at"
        )
    )
    assert rows == [
        ("r1", "queued", "", "", None, None, None),
        ("r2", "succeeded", "", "", None, None, AT),
    ]


@pytest.mark.usefixtures("leave_at_latest")
def test_0007__keeps_every_job_and_task_and_their_names_stay_unique() -> None:
    before, after = "0006_drop_claim_index", "0007_lean_job_indexes"
    executor = migrate_to(before)
    old_apps = executor.loader.project_state([("ultimat3_jobs", before)]).apps
    old = old_apps.get_model("ultimat3_jobs", "Job")
    old_apps.get_model("ultimat3_jobs", "Task").objects.create(
        name="t.a", cron="0 * * * *", tz="UTC", last_fired_at=AT
    )
    old.objects.create(name="demo.ping", key="q1", task="t.a", run_at=AT, created_at=AT)
    old.objects.create(
        name="demo.ping", key="r1", status="running", worker="w1", run_at=AT, created_at=AT
    )

    executor = migrate_to(after)

    new_apps = executor.loader.project_state([("ultimat3_jobs", after)]).apps
    new = new_apps.get_model("ultimat3_jobs", "Job")
    rows = list(new.objects.order_by("key").values_list("key", "status", "task", "worker"))
    assert rows == [("q1", "queued", "t.a", ""), ("r1", "running", "", "w1")]
    with pytest.raises(IntegrityError), transaction.atomic():
        new.objects.create(name="demo.ping", key="q1", run_at=AT, created_at=AT)
    tasks = new_apps.get_model("ultimat3_jobs", "Task").objects
    assert list(tasks.values_list("name", "last_fired_at")) == [("t.a", AT)]
    with pytest.raises(IntegrityError), transaction.atomic():
        tasks.create(name="t.a", cron="0 * * * *", tz="UTC")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indexname FROM pg_indexes "
                "WHERE tablename IN ('ultimat3_jobs_job', 'ultimat3_jobs_task')"
            )
            indexes = {name for (name,) in cursor.fetchall()}
        assert not [name for name in indexes if name.endswith("_like")]
        assert {"u3j_job_key", "u3j_job_running", "u3j_job_task", "u3j_job_ready"} <= indexes
        assert "u3j_task_name" in indexes


@pytest.mark.usefixtures("leave_at_latest")
def test_0008__keeps_every_job_and_reads_it_untraced() -> None:
    before, after = "0007_lean_job_indexes", "0008_trace_context"
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    old.objects.create(name="demo.ping", key="t1", input={"label": "x"}, run_at=AT, created_at=AT)
    old.objects.create(
        name="demo.ping", key="t2", status="outbox", relay="celery", run_at=AT, created_at=AT
    )

    executor = migrate_to(after)

    new = executor.loader.project_state([("ultimat3_jobs", after)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    rows = list(new.objects.order_by("key").values_list("key", "status", "trace_context"))
    assert rows == [("t1", "queued", ""), ("t2", "outbox", "")]
    # A row inserted by SQL of the previous release, which names no such column.
    table = new._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, key, input, status, queue, attempts, max_attempts, "
            "run_at, created_at, last_error, task, catch_up, enqueued_by, worker) "
            "VALUES ('demo.ping', 't3', '{}', 'queued', 'default', 0, 3, %s, %s, '', '', "
            "false, 'code', '')",
            [AT, AT],
        )
    assert new.objects.get(key="t3").trace_context == ""


@pytest.mark.usefixtures("leave_at_latest")
def test_0009__keeps_every_task_with_nothing_backfilled_ahead() -> None:
    before, after = "0008_trace_context", "0009_task_backfilled_to"
    executor = migrate_to(before)
    old_apps = executor.loader.project_state([("ultimat3_jobs", before)]).apps
    old_apps.get_model("ultimat3_jobs", "Task").objects.create(
        name="t.a", cron="0 * * * *", tz="UTC", last_fired_at=AT, paused=True
    )

    executor = migrate_to(after)

    new_apps = executor.loader.project_state([("ultimat3_jobs", after)]).apps
    tasks = new_apps.get_model("ultimat3_jobs", "Task").objects
    assert list(tasks.values_list("name", "last_fired_at", "paused", "backfilled_to")) == [
        ("t.a", AT, True, None)
    ]


@pytest.mark.usefixtures("leave_at_latest")
def test_0010__keeps_every_job_and_no_row_has_waited_for_its_target() -> None:
    before, after = "0009_task_backfilled_to", "0010_relay_target_unknown_since"
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    old.objects.create(
        name="demo.write_row", key="o1", status="outbox", relay="celery", run_at=AT, created_at=AT
    )
    old.objects.create(name="demo.ping", key="q1", run_at=AT, created_at=AT)

    executor = migrate_to(after)

    new = executor.loader.project_state([("ultimat3_jobs", after)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    rows = list(
        new.objects.order_by("key").values_list("key", "status", "relay", "target_unknown_since")
    )
    assert rows == [("o1", "outbox", "celery", None), ("q1", "queued", "", None)]


@pytest.mark.usefixtures("leave_at_latest")
def test_0011__keeps_every_job_and_no_occurrence_is_closed_yet() -> None:
    before, after = "0010_relay_target_unknown_since", "0011_monitor_checkins"
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps.get_model(
        "ultimat3_jobs", "Job"
    )
    old.objects.create(
        name="demo.ping", key="s1", task="demo.t", occurrence=AT, run_at=AT, created_at=AT
    )
    old.objects.create(name="demo.ping", key="s2", status="succeeded", run_at=AT, created_at=AT)

    executor = migrate_to(after)

    new_apps = executor.loader.project_state([("ultimat3_jobs", after)]).apps
    jobs = new_apps.get_model("ultimat3_jobs", "Job").objects
    assert list(jobs.order_by("key").values_list("key", "status", "task", "occurrence")) == [
        ("s1", "queued", "demo.t", AT),
        ("s2", "succeeded", "", None),
    ]
    assert new_apps.get_model("ultimat3_jobs", "CheckIn").objects.count() == 0


def _task_table_options() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = 'ultimat3_jobs_task'"
        )
        [(options,)] = cursor.fetchall()
    return list(options)


@pytest.mark.postgres
@pytest.mark.usefixtures("leave_at_latest")
def test_0012__keeps_every_task_and_leaves_room_for_its_watermark_updates() -> None:
    before, after = "0011_monitor_checkins", "0012_task_fillfactor"
    executor = migrate_to(before)
    old_apps = executor.loader.project_state([("ultimat3_jobs", before)]).apps
    old_apps.get_model("ultimat3_jobs", "Task").objects.create(
        name="t.a", cron="0 * * * *", tz="UTC", last_fired_at=AT
    )
    assert _task_table_options() == []

    executor = migrate_to(after)

    assert _task_table_options() == ["fillfactor=70"]
    tasks = executor.loader.project_state([("ultimat3_jobs", after)]).apps.get_model(
        "ultimat3_jobs", "Task"
    )
    assert list(tasks.objects.values_list("name", "last_fired_at")) == [("t.a", AT)]
    # Back again: the pages fill as before.
    migrate_to(before)
    assert _task_table_options() == []


def _indexes(table: str) -> set[str]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return {name for name, found in constraints.items() if found["index"]}


#: An occurrence record of every outcome.
RECORDS = [
    {"task": "t.a", "outcome": outcome, "occurrence": AT, "recorded_at": AT}
    for outcome in ("fired", "dropped", "paused", "manual", "overlap", "backfill")
]

#: The migrations that add an index: the one before each, its model, its index, and rows of
#: every kind that must all stay.
INDEXING = {
    "0013_occurrence_recorded_index": (
        "0012_task_fillfactor",
        "Occurrence",
        "u3j_occ_recorded",
        RECORDS,
    ),
    "0015_occurrence_unfired_index": (
        "0014_job_failed_index",
        "Occurrence",
        "u3j_occ_unfired",
        RECORDS,
    ),
    "0014_job_failed_index": (
        "0013_occurrence_recorded_index",
        "Job",
        "u3j_job_failed",
        [
            {"key": f"k:{status}", "status": status, "name": "j", "run_at": AT, "created_at": AT}
            for status in ("queued", "running", "succeeded", "failed", "cancelled", "outbox")
        ],
    ),
    "0016_job_queue_ready_index": (
        "0015_occurrence_unfired_index",
        "Job",
        "u3j_job_queue_ready",
        [
            {
                "key": f"k:{status}:{queue}",
                "status": status,
                "queue": queue,
                "name": "j",
                "run_at": AT,
                "created_at": AT,
            }
            for status in ("queued", "running", "succeeded", "failed", "cancelled", "outbox")
            for queue in ("default", "emails")
        ],
    ),
}


@pytest.mark.usefixtures("leave_at_latest")
@pytest.mark.parametrize("after", list(INDEXING))
def test_0013_to_0016__keep_every_row_and_add_their_index(after: str) -> None:
    before, model, index, rows = INDEXING[after]
    executor = migrate_to(before)
    old = executor.loader.project_state([("ultimat3_jobs", before)]).apps
    made = old.get_model("ultimat3_jobs", model)
    for row in rows:
        made.objects.create(**row)
    table = made._meta.db_table
    assert index not in _indexes(table)

    executor = migrate_to(after)

    assert index in _indexes(table)
    kept = executor.loader.project_state([("ultimat3_jobs", after)]).apps.get_model(
        "ultimat3_jobs", model
    )
    fields = list(rows[0])
    assert sorted(kept.objects.values_list(*fields)) == sorted(tuple(r.values()) for r in rows)
    migrate_to(before)
    assert index not in _indexes(table)


@pytest.mark.parametrize(
    ("migration", "index"),
    [
        ("0013", "u3j_occ_recorded"),
        ("0014", "u3j_job_failed"),
        ("0015", "u3j_occ_unfired"),
        ("0016", "u3j_job_queue_ready"),
    ],
)
def test_0013_to_0016__build_their_index_without_locking_the_table_on_postgresql(
    migration: str, index: str
) -> None:
    out = StringIO()
    call_command("sqlmigrate", "ultimat3_jobs", migration, stdout=out)
    concurrently = connection.vendor == "postgresql"
    assert ("CREATE INDEX CONCURRENTLY" in out.getvalue()) is concurrently
    assert f'"{index}"' in out.getvalue()


@pytest.mark.postgres
@pytest.mark.usefixtures("leave_at_latest")
def test_0013__builds_again_over_an_index_a_killed_build_left_invalid() -> None:
    migrate_to("0013_occurrence_recorded_index")
    with connection.cursor() as cursor:
        # What CREATE INDEX CONCURRENTLY leaves when it is killed halfway.
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'u3j_occ_recorded'::regclass"
        )
    executor = MigrationExecutor(connection)
    executor.recorder.record_unapplied("ultimat3_jobs", "0013_occurrence_recorded_index")

    migrate_to("0013_occurrence_recorded_index")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'u3j_occ_recorded'::regclass"
        )
        assert cursor.fetchall() == [(True,)]


@pytest.mark.postgres
@pytest.mark.usefixtures("leave_at_latest")
def test_0013__run_again_keeps_the_index_a_killed_run_had_finished() -> None:
    migrate_to("0013_occurrence_recorded_index")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'u3j_occ_recorded'::regclass::oid")
        [(built,)] = cursor.fetchall()
    # Killed after its index was built, before it was recorded as applied.
    MigrationExecutor(connection).recorder.record_unapplied(
        "ultimat3_jobs", "0013_occurrence_recorded_index"
    )

    migrate_to("0013_occurrence_recorded_index")

    with connection.cursor() as cursor:
        cursor.execute("SELECT 'u3j_occ_recorded'::regclass::oid")
        assert cursor.fetchall() == [(built,)]
