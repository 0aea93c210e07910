"""@job / @task declarations: validation at import, naming rules, entries, describe."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ultimat3_jobs import Entry, JobNameTakenError, UltimateError, job, task
from ultimat3_jobs.attempts import timeout_of
from ultimat3_jobs.conf import get_settings
from ultimat3_jobs.errors import (
    ConfigurationError,
    InvalidCatchUpError,
    InvalidCronError,
    InvalidDeclarationError,
    InvalidJobInputError,
    InvalidOverlapError,
    InvalidTimeoutError,
    InvalidTimezoneError,
    MissingTimezoneError,
    TaskEntriesError,
)
from ultimat3_jobs.handles import TaskHandle
from ultimat3_jobs.inputs import TIMEOUT_FIX
from ultimat3_jobs.registry import Registry

pytestmark = pytest.mark.usefixtures("fresh_registry")


def test_task__bogota_is_refused_with_a_fix_naming_full_zone_ids() -> None:
    with pytest.raises(InvalidTimezoneError) as caught:

        @task(cron="0 3 * * *", tz="Bogota")
        def nightly(occurrence: datetime) -> list[Entry]:
            return []

    error = caught.value
    assert isinstance(error, UltimateError)
    assert error.code == "jobs.task.tz-invalid"
    assert "Bogota" in error.message
    assert "America/Bogota" in error.fix
    assert "tzdata" in error.fix


def test_task__full_zone_id_is_accepted() -> None:
    @task(cron="0 3 * * *", tz="America/Bogota")
    def nightly(occurrence: datetime) -> list[Entry]:
        return []

    assert nightly.tz == "America/Bogota"


@pytest.mark.parametrize("tz", [None, ""])
def test_task__missing_tz_fails_with_a_fix(tz: str | None) -> None:
    with pytest.raises(MissingTimezoneError) as caught:

        @task(cron="0 3 * * *", tz=tz)
        def nightly(occurrence: datetime) -> list[Entry]:
            return []

    assert caught.value.code == "jobs.task.tz-missing"
    assert 'tz="UTC"' in caught.value.fix


def test_task__bad_cron_fails_at_declaration() -> None:
    with pytest.raises(InvalidCronError) as caught:

        @task(cron="61 * * * *", tz="UTC")
        def broken(occurrence: datetime) -> list[Entry]:
            return []

    assert "minute" in caught.value.message
    assert caught.value.fix


@pytest.mark.parametrize(
    ("options", "needle"),
    [({"catch_up": "always"}, "catch_up"), ({"max_catch_up": 0}, "max_catch_up")],
)
def test_task__bad_catch_up_fails_at_declaration(options: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidCatchUpError) as caught:

        @task(cron="0 3 * * *", tz="UTC", **options)  # type: ignore[arg-type]
        def nightly(occurrence: datetime) -> list[Entry]:
            return []

    assert needle in caught.value.message
    assert caught.value.code == "jobs.task.catch-up-invalid"


def test_task__bad_overlap_fails_at_declaration_with_a_fix() -> None:
    with pytest.raises(InvalidOverlapError) as caught:

        @task(cron="0 3 * * *", tz="UTC", overlap="never")  # type: ignore[arg-type]
        def nightly(occurrence: datetime) -> list[Entry]:
            return []

    assert caught.value.code == "jobs.task.overlap-invalid"
    assert "'never'" in caught.value.message
    assert '"skip"' in caught.value.fix


def test_task__overlap_skip_is_kept_and_described() -> None:
    @task(cron="0 3 * * *", tz="UTC", name="unit.exclusive", overlap="skip")
    def exclusive(occurrence: datetime) -> list[Entry]:
        return []

    assert exclusive.overlap == "skip"
    assert exclusive.describe()["overlap"] == "skip"


def test_registry__different_task_under_a_taken_name_raises() -> None:
    @task(cron="0 3 * * *", tz="UTC", name="shared.name")
    def first(occurrence: datetime) -> list[Entry]:
        return []

    with pytest.raises(JobNameTakenError) as caught:

        @task(cron="0 4 * * *", tz="UTC", name="shared.name")
        def second(occurrence: datetime) -> list[Entry]:
            return []

    assert caught.value.code == "jobs.name-taken"
    assert "shared.name" in caught.value.message


def test_registry__same_declaration_twice_is_one_registration() -> None:
    registry = Registry()

    def nightly(occurrence: datetime) -> list[Entry]:
        return []

    from ultimat3_jobs.cron import parse
    from ultimat3_jobs.zones import resolve_zone

    def build() -> TaskHandle:
        return TaskHandle(
            nightly,
            name="x.nightly",
            schedule=parse("0 3 * * *"),
            zone=resolve_zone("UTC", "x"),
            catch_up="skip",
            max_catch_up=10,
        )

    registry.register(build())
    registry.register(build())  # a module imported twice
    assert [t.name for t in registry.tasks()] == ["x.nightly"]


def test_registry__one_declaration_under_two_names_is_refused() -> None:
    def nightly(occurrence: datetime) -> list[Entry]:
        return []

    task(cron="0 3 * * *", tz="UTC", name="a.nightly")(nightly)
    with pytest.raises(JobNameTakenError):
        task(cron="0 3 * * *", tz="UTC", name="b.nightly")(nightly)


def test_job__names_follow_the_same_rules() -> None:
    @job(name="dup.job")
    def one() -> None: ...

    with pytest.raises(JobNameTakenError):

        @job(name="dup.job")
        def two() -> None: ...


def test_job__input_must_be_a_json_dict_of_its_arguments() -> None:
    @job
    def send(day: str) -> None: ...

    assert send.check_input({"day": "2026-03-08"}) == {"day": "2026-03-08"}
    with pytest.raises(InvalidJobInputError) as not_dict:
        send.check_input(["2026-03-08"])
    assert not_dict.value.code == "jobs.job.input-invalid"
    with pytest.raises(InvalidJobInputError) as not_json:
        send.check_input({"day": datetime(2026, 3, 8, tzinfo=UTC)})
    assert "isoformat" in not_json.value.fix
    with pytest.raises(InvalidJobInputError) as wrong_args:
        send.check_input({"date": "2026-03-08"})
    assert "day" in wrong_args.value.fix


def test_job__declared_key_template_and_plain_keys() -> None:
    @job(key="digest:{day}")
    def digest(day: str) -> None: ...

    @job
    def free(n: int) -> None: ...

    assert digest.plain_key({"day": "2026-03-08"}) == "digest:2026-03-08"
    assert free.plain_key({"n": 1}) != free.plain_key({"n": 1})  # no declared key: never dedupes
    assert free.occurrence_part({"n": 1}) == free.occurrence_part({"n": 1})
    assert free.occurrence_part({"n": 1}) != free.occurrence_part({"n": 2})


def test_task__entries_get_the_occurrence_in_the_task_zone() -> None:
    @job
    def send(day: str) -> None: ...

    @task(cron="0 20 * * *", tz="America/Los_Angeles")
    def evening(occurrence: datetime) -> list[Entry]:
        return [(send, {"day": occurrence.date().isoformat()})]

    # 2026-03-09T03:00Z is 20:00 on the 8th in Los Angeles: the payload is for the 8th.
    entries = evening.entries(datetime(2026, 3, 9, 3, 0, tzinfo=UTC))
    assert entries == [(send, {"day": "2026-03-08"})]


def test_task__entries_that_raise_become_a_task_error_with_a_fix() -> None:
    @task(cron="0 3 * * *", tz="UTC")
    def broken(occurrence: datetime) -> list[Entry]:
        raise RuntimeError("boom")

    with pytest.raises(TaskEntriesError) as caught:
        broken.entries(datetime(2026, 1, 1, 3, tzinfo=UTC))
    assert "boom" in caught.value.message
    assert caught.value.code == "jobs.task.entries-failed"
    assert isinstance(caught.value.cause, RuntimeError)
    assert "retries this occurrence every round" in caught.value.fix

    # Run now (no occurrence): nothing retries it, and the instant is the click's.
    with pytest.raises(TaskEntriesError) as caught:
        broken.entries()
    assert "raised when run at" in caught.value.message
    assert caught.value.fix.endswith("then run it again")
    assert "retries" not in caught.value.fix


def test_task__put_on_a_function_without_its_arguments_is_refused_at_import(
    fresh_registry: Registry,
) -> None:
    before = [handle.name for handle in fresh_registry.tasks()]

    with pytest.raises(InvalidDeclarationError) as caught:

        @task  # type: ignore[arg-type]
        def forgot(occurrence: datetime) -> list[Entry]:
            return []

    assert caught.value.code == "jobs.declaration-invalid"
    assert "without its arguments" in caught.value.message
    assert '@task(cron="0 3 * * *", tz=' in caught.value.fix
    assert [handle.name for handle in fresh_registry.tasks()] == before


def test_task__describe_is_json_safe_with_jobs_in_declaration_order() -> None:
    import json

    @job(name="unit.b_second")
    def b_second() -> None: ...

    @job(name="unit.a_first")
    def a_first() -> None: ...

    @task(
        cron="0 3 * * *", tz="Europe/Paris", catch_up="run-all", max_catch_up=5, name="unit.nightly"
    )
    def nightly(occurrence: datetime) -> list[Entry]:
        return [(b_second, {}), (a_first, {})]

    described = nightly.describe()
    assert json.loads(json.dumps(described)) == {
        "kind": "task",
        "name": "unit.nightly",
        "cron": "0 3 * * *",
        "tz": "Europe/Paris",
        "catch_up": "run-all",
        "max_catch_up": 5,
        "dst_gap": "end-of-gap",
        "dst_repeat": "first",
        "overlap": "allow",
        "jobs": ["unit.b_second", "unit.a_first"],
    }


def test_task__next_runs_follow_the_zone() -> None:
    @task(cron="30 2 * * *", tz="America/New_York")
    def early(occurrence: datetime) -> list[Entry]:
        return []

    runs = early.next_runs(2, after=datetime(2026, 3, 7, 12, tzinfo=UTC))
    assert [r.isoformat() for r in runs] == [
        "2026-03-08T07:00:00+00:00",
        "2026-03-09T06:30:00+00:00",
    ]


def test_autodiscovery__demo_tasks_are_registered_under_app_label_names() -> None:
    from ultimat3_jobs import registry

    names = {t.name for t in registry.tasks()}
    assert {"demo.nightly_digest", "demo.quarter_hour_ping"} <= names
    assert registry.get_job("demo.send_digest") is not None


def test_task__dst_options_are_checked_at_declaration_and_drive_its_runs() -> None:
    from ultimat3_jobs.errors import InvalidDstOptionError

    with pytest.raises(InvalidDstOptionError) as caught:

        @task(cron="30 1 * * *", tz="America/New_York", dst_repeat="twice")  # type: ignore[arg-type]
        def bad(occurrence: datetime) -> list[Entry]:
            return []

    assert caught.value.code == "jobs.task.dst-option-invalid"
    assert '"both"' in caught.value.fix

    @task(cron="30 1 * * *", tz="America/New_York", name="unit.both", dst_repeat="both")
    def both(occurrence: datetime) -> list[Entry]:
        return []

    after = datetime(2026, 10, 31, 12, 0, tzinfo=UTC)
    assert [at.isoformat() for at in both.next_runs(3, after)] == [
        "2026-11-01T05:30:00+00:00",
        "2026-11-01T06:30:00+00:00",
        "2026-11-02T06:30:00+00:00",
    ]
    assert both.describe()["dst_repeat"] == "both"


def test_task__its_doc_is_its_functions_and_the_class_keeps_its_own() -> None:
    @task(cron="0 3 * * *", tz="UTC", name="t.documented")
    def nightly(occurrence: datetime) -> list[Entry]:
        """Mail the nightly digest."""
        return []

    assert nightly.__doc__ == "Mail the nightly digest."
    assert TaskHandle.__doc__ is not None and TaskHandle.__doc__.startswith("A named cron")


@pytest.mark.parametrize(
    "timeout",
    [0, -1, True, False, "30", float("nan"), float("inf"), 86_401, [5]],
    ids=["zero", "negative", "true", "false", "text", "nan", "inf", "over_a_day", "list"],
)
def test_job__a_timeout_that_is_not_seconds_is_refused_with_its_code(timeout: object) -> None:
    with pytest.raises(InvalidTimeoutError) as caught:

        @job(timeout=timeout)  # type: ignore[call-overload]
        def hangs() -> None: ...

    assert caught.value.code == "jobs.job.timeout-invalid"
    assert f"timeout={timeout!r}" in caught.value.message
    assert caught.value.fix == f"make timeout {TIMEOUT_FIX}"


def test_job__a_timeout_is_seconds_and_described() -> None:
    @job(name="unit.bounded", timeout=30)
    def bounded() -> None: ...

    @job(name="unit.unbounded")
    def unbounded() -> None: ...

    assert bounded.timeout == 30.0
    assert bounded.describe() == {
        "kind": "job",
        "name": "unit.bounded",
        "queue": None,
        "max_attempts": None,
        "timeout": 30.0,
    }
    assert unbounded.describe()["timeout"] is None


@pytest.mark.parametrize("value", [0, "5", True, 10**6])
def test_settings__a_bad_job_timeout_is_refused_with_the_declarations_wording(
    value: object, settings: Any
) -> None:
    settings.ULTIMAT3_JOBS = {"JOB_TIMEOUT": value}
    with pytest.raises(ConfigurationError) as caught:
        get_settings()
    assert caught.value.fix == f'set ULTIMAT3_JOBS["JOB_TIMEOUT"] to {TIMEOUT_FIX}'


def test_settings__job_timeout_defaults_to_no_limit_and_takes_seconds(settings: Any) -> None:
    settings.ULTIMAT3_JOBS = {}
    assert get_settings().job_timeout is None
    assert get_settings().max_abandoned_threads == 8
    settings.ULTIMAT3_JOBS = {"JOB_TIMEOUT": 90, "MAX_ABANDONED_THREADS": 3}
    assert (get_settings().job_timeout, get_settings().max_abandoned_threads) == (90.0, 3)


def test_timeout_of__the_jobs_own_else_the_setting_a_django_tasks_always_the_setting(
    settings: Any,
) -> None:
    @job(name="unit.own", timeout=5)
    def own() -> None: ...

    @job(name="unit.defaulted")
    def defaulted() -> None: ...

    settings.ULTIMAT3_JOBS = {"JOB_TIMEOUT": 60}
    assert timeout_of("unit.own") == 5.0
    assert timeout_of("unit.defaulted") == 60.0
    assert timeout_of("unit.own", backend="default") == 60.0


def test_task__next_runs_refuses_a_count_it_cannot_take() -> None:
    @task(cron="0 9 * * *", tz="Europe/Paris", name="unit.counted")
    def counted(occurrence: datetime) -> list[Entry]:
        return []

    after = datetime(2026, 6, 1, tzinfo=UTC)
    assert counted.next_runs(0, after) == []
    with pytest.raises(ValueError, match="n must not be negative, got -1"):
        counted.next_runs(-1, after)
    for wrong in (2.0, "3", True):
        with pytest.raises(TypeError, match="n must be an int"):
            counted.next_runs(wrong, after)  # type: ignore[arg-type]
    last = counted.next_runs(5, datetime(9999, 12, 30, tzinfo=UTC))
    assert [at.isoformat() for at in last] == [
        "9999-12-30T08:00:00+00:00",
        "9999-12-31T08:00:00+00:00",
    ]
