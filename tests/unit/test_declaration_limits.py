"""Declarations refused at import when the tables could not hold them; factories; IANA zones."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import FunctionType
from typing import Any

import pytest

from ultimat3_jobs import JobNameTakenError, job, task
from ultimat3_jobs.errors import (
    InvalidCatchUpError,
    InvalidDeclarationError,
    InvalidJobKeyError,
    InvalidTimezoneError,
)
from ultimat3_jobs.handles import TaskHandle
from ultimat3_jobs.inputs import CRON_LIMIT, INT_LIMIT, KEY_LIMIT, NAME_LIMIT, QUEUE_LIMIT
from ultimat3_jobs.registry import Registry
from ultimat3_jobs.zones import NOT_ZONES

pytestmark = pytest.mark.usefixtures("fresh_registry")


def _nothing(occurrence: datetime) -> list[Any]:
    return []


# -- item 2: every limit the tables enforce, at declaration ---------------------------------------


def test_limits__equal_the_columns_of_the_tables() -> None:
    from ultimat3_jobs.models import Job, Task

    def length(model: Any, field: str) -> int:
        return int(model._meta.get_field(field).max_length)

    assert NAME_LIMIT == length(Task, "name") == length(Job, "name") == length(Job, "task")
    assert length(Job, "enqueued_by") == NAME_LIMIT
    assert length(Job, "queue") == QUEUE_LIMIT
    assert length(Job, "key") == KEY_LIMIT
    assert length(Task, "cron") == CRON_LIMIT
    assert INT_LIMIT == 2**31 - 1


def test_task__name_over_the_column_is_refused_and_one_at_the_limit_is_accepted() -> None:
    with pytest.raises(InvalidDeclarationError) as caught:
        task(cron="0 3 * * *", tz="UTC", name="t" * (NAME_LIMIT + 1))(_nothing)
    assert caught.value.code == "jobs.declaration-invalid"
    assert f"over {NAME_LIMIT}" in caught.value.message
    assert f"at most {NAME_LIMIT} characters" in caught.value.fix

    handle = task(cron="0 3 * * *", tz="UTC", name="t" * NAME_LIMIT)(_nothing)
    assert len(handle.name) == NAME_LIMIT


@pytest.mark.parametrize("value", [2**31, 10**12, True])
def test_task__max_catch_up_outside_the_column_is_refused(value: object) -> None:
    with pytest.raises(InvalidCatchUpError) as caught:
        task(cron="0 3 * * *", tz="UTC", name="t.catch", max_catch_up=value)(_nothing)  # type: ignore[arg-type]
    assert caught.value.code == "jobs.task.catch-up-invalid"
    assert str(INT_LIMIT) in caught.value.fix


def test_task__max_catch_up_at_the_column_limit_is_accepted() -> None:
    handle = task(cron="0 3 * * *", tz="UTC", name="t.catch", max_catch_up=INT_LIMIT)(_nothing)
    assert handle.max_catch_up == INT_LIMIT


def test_task__cron_longer_than_the_column_is_refused() -> None:
    minutes = ",".join(str(n) for n in range(60))
    hours = ",".join(str(n) for n in range(24))
    days = ",".join(str(n) for n in range(1, 32))
    cron = f"{minutes} {hours} {days} * *"
    assert len(cron) > CRON_LIMIT
    with pytest.raises(InvalidDeclarationError) as caught:
        task(cron=cron, tz="UTC", name="t.long_cron")(_nothing)
    assert f"over the {CRON_LIMIT}" in caught.value.message


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"max_attempts": True}, "max_attempts=True"),
        ({"max_attempts": False}, "max_attempts=False"),
        ({"max_attempts": 2**31}, "outside 1.."),
        ({"max_attempts": 0}, "outside 1.."),
        ({"queue": "q" * (QUEUE_LIMIT + 1)}, f"over {QUEUE_LIMIT}"),
        ({"queue": ""}, "not a queue name"),
        ({"queue": 5}, "not a queue name"),
        ({"name": "j" * (NAME_LIMIT + 1)}, f"over {NAME_LIMIT}"),
        ({"name": "bad\x00name"}, "NUL"),
    ],
    ids=[
        "attempts_true",
        "attempts_false",
        "attempts_2_31",
        "attempts_zero",
        "queue_long",
        "queue_empty",
        "queue_int",
        "name_long",
        "name_nul",
    ],
)
def test_job__values_the_table_refuses_are_refused_at_declaration(
    options: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InvalidDeclarationError) as caught:

        @job(**options)
        def send() -> None: ...

    assert caught.value.code == "jobs.declaration-invalid"
    assert needle in caught.value.message
    assert caught.value.fix


def test_job__limits_themselves_are_accepted() -> None:
    @job(name="j" * NAME_LIMIT, max_attempts=INT_LIMIT, queue="q" * QUEUE_LIMIT)
    def send() -> None: ...

    assert (len(send.name), send.max_attempts, len(send.queue or "")) == (
        NAME_LIMIT,
        INT_LIMIT,
        QUEUE_LIMIT,
    )


# -- item 5 (declaration side): keys that could never be built are refused at import ---------------


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("bad:{region!z}", 'conversion "!z"'),
        ("bad:{day}", 'names "day"'),
        ("bad:{}", "positional field"),
        ("bad:{0}", "positional field"),
        ("bad:{", "does not parse"),
        ("bad:{region:{width}}", 'names "width"'),
        ("k" * (KEY_LIMIT + 1), f"over {KEY_LIMIT} characters"),
    ],
    ids=["conversion", "unknown_field", "positional", "index", "unclosed", "nested", "long"],
)
def test_job__key_template_is_checked_against_the_signature(key: str, needle: str) -> None:
    with pytest.raises(InvalidJobKeyError) as caught:

        @job(name="k.sync", key=key)
        def sync(region: str) -> None: ...

    assert caught.value.code == "jobs.job.key-invalid"
    assert needle in caught.value.message
    assert "region" in caught.value.fix  # names the arguments it may use


@pytest.mark.parametrize("key", [5, 2.5, b"bytes", ["a"]])
def test_job__key_that_is_neither_template_nor_callable_is_refused(key: object) -> None:
    with pytest.raises(InvalidJobKeyError) as caught:

        @job(name="k.other", key=key)  # type: ignore[call-overload]
        def other(region: str) -> None: ...

    assert "neither a template nor a callable" in caught.value.message


def test_job__good_key_templates_are_accepted_with_attributes_specs_and_kwargs() -> None:
    @job(name="k.good", key="sync:{region!s}:{n:03d}:{region[0]}")
    def good(region: str, n: int = 7) -> None: ...

    @job(name="k.any", key="any:{whatever}")
    def anything(**options: Any) -> None: ...

    # The template sees the function's defaults under the input.
    assert good.declared_key({"region": "eu"}) == "sync:eu:007:e"
    assert anything.declared_key({"whatever": "x"}) == "any:x"


# -- item 3: one factory, many pinned names -------------------------------------------------------


def _factory(region: str, *, name: str | None = None) -> TaskHandle:
    def sync(occurrence: datetime) -> list[Any]:
        return []

    return task(cron="0 3 * * *", tz="UTC", name=name or f"regions.{region}")(sync)


def test_task__a_factory_declares_a_task_per_name() -> None:
    handles = [_factory(f"r{n:04d}") for n in range(1000)]
    assert len({h.name for h in handles}) == 1000
    from ultimat3_jobs.registry import registry

    assert {t.name for t in registry.tasks()} >= {h.name for h in handles}


def test_task__a_factory_giving_one_name_twice_is_refused() -> None:
    _factory("eu")
    with pytest.raises(JobNameTakenError) as caught:
        _factory("eu-again", name="regions.eu")
    assert caught.value.code == "jobs.name-taken"


def test_task__one_function_under_two_names_stays_refused() -> None:
    def nightly(occurrence: datetime) -> list[Any]:
        return []

    task(cron="0 3 * * *", tz="UTC", name="a.nightly")(nightly)
    with pytest.raises(JobNameTakenError) as caught:
        task(cron="0 3 * * *", tz="UTC", name="b.nightly")(nightly)
    assert '"a.nightly"' in caught.value.message


def _reimport(func: Callable[..., Any]) -> Callable[..., Any]:
    """The function a second import of its module would define: same code, new globals."""
    assert isinstance(func, FunctionType)
    return FunctionType(func.__code__, dict(func.__globals__), func.__name__, func.__defaults__)


def _nightly(func: Callable[..., Any], name: str) -> TaskHandle:
    """A handle for ``Registry.register`` directly, past the module-wide registry."""
    from ultimat3_jobs.cron import parse
    from ultimat3_jobs.zones import resolve_zone

    return TaskHandle(
        func,
        name=name,
        schedule=parse("0 3 * * *"),
        zone=resolve_zone("UTC", name),
        catch_up="skip",
        max_catch_up=10,
    )


def test_registry__a_module_imported_twice_is_still_one_registration() -> None:
    registry = Registry()

    registry.register(_nightly(_nothing, "mod.nightly"))
    again = _reimport(_nothing)
    registry.register(_nightly(again, "mod.nightly"))  # the second import, same name
    assert [t.func for t in registry.tasks()] == [again]
    # The second import under another module name would derive another name: refused.
    with pytest.raises(JobNameTakenError):
        registry.register(_nightly(_reimport(_nothing), "othermod.nightly"))


def test_registry__a_site_forgets_a_declaration_once_unregistered() -> None:
    registry = Registry()

    first = _nightly(_nothing, "mod.nightly")
    registry.register(first)
    registry.unregister(first)
    # Nothing is left of it: another import of the module may name the site anew.
    other = _reimport(_nothing)
    registry.register(_nightly(other, "othermod.nightly"))
    assert [t.name for t in registry.tasks()] == ["othermod.nightly"]
    # A second name at that site from the same module instance (a factory), then another
    # import of the module: it may take those names again, and only those.
    assert isinstance(other, FunctionType)
    twin = FunctionType(other.__code__, other.__globals__, other.__name__)
    registry.register(_nightly(twin, "othermod.second"))
    with pytest.raises(JobNameTakenError):
        registry.register(_nightly(_reimport(_nothing), "thirdmod.nightly"))
    registry.register(_nightly(_reimport(_nothing), "othermod.second"))
    assert [t.name for t in registry.tasks()] == ["othermod.nightly", "othermod.second"]


# -- item 4: zones of the IANA database only ------------------------------------------------------


@pytest.mark.parametrize("tz", sorted(NOT_ZONES))
def test_task__host_files_of_the_zone_directory_are_refused(tz: str) -> None:
    with pytest.raises(InvalidTimezoneError) as caught:
        task(cron="0 3 * * *", tz=tz, name="z.host")(_nothing)
    assert caught.value.code == "jobs.task.tz-invalid"
    for name in NOT_ZONES:
        assert repr(name) not in caught.value.fix


@pytest.mark.parametrize("tz", ["local", "Local", "LOCALTIME", "posix", "factory", "utc"])
def test_task__the_fix_never_suggests_a_name_that_is_refused(tz: str) -> None:
    with pytest.raises(InvalidTimezoneError) as caught:
        task(cron="0 3 * * *", tz=tz, name="z.fix")(_nothing)
    fix = caught.value.fix
    assert "tz=" in fix
    for name in NOT_ZONES:
        assert repr(name) not in fix
    suggested = fix.split("tz=", 1)[1].split(" ", 1)[0].strip("'\";")
    # The first suggestion is itself accepted.
    handle = task(cron="0 3 * * *", tz=suggested, name="z.suggested")(_nothing)
    assert handle.tz == suggested


def test_task__utc_in_lower_case_suggests_utc() -> None:
    with pytest.raises(InvalidTimezoneError) as caught:
        task(cron="0 3 * * *", tz="utc", name="z.utc")(_nothing)
    assert caught.value.fix.startswith("use the full zone id, e.g. tz='UTC'")


def test_task__iana_zones_including_links_are_accepted() -> None:
    for tz in ["UTC", "Europe/Paris", "US/Eastern", "Etc/GMT+5", "America/Argentina/Salta"]:

        def nightly(occurrence: datetime) -> list[Any]:
            return []

        handle = task(cron="0 3 * * *", tz=tz, name=f"z.{tz.replace('/', '_')}")(nightly)
        assert handle.next_runs(1, datetime(2026, 1, 1, tzinfo=UTC))


# -- the settings feed the same columns: MAX_ATTEMPTS, DEFAULT_QUEUE, and the intervals -----------


@pytest.mark.parametrize(
    "options",
    [
        {"MAX_ATTEMPTS": 2**31},
        {"MAX_ATTEMPTS": True},
        {"DEFAULT_QUEUE": "q" * (QUEUE_LIMIT + 1)},
        {"TICK_INTERVAL": float("inf")},
        {"WORKER_POLL_INTERVAL": 1e308},
        # A timedelta is held to the same bounds: a negative tick would loop without a pause.
        {"TICK_INTERVAL": timedelta(seconds=-1)},
        {"LEASE_TTL": timedelta(days=100_000)},
        # The cutoff date a million days back is before year 1: prune_jobs would overflow.
        {"RETENTION_DAYS": 1_000_000},
        # pg_try_advisory_lock takes a bigint: these would fail at every round instead.
        {"ADVISORY_LOCK_KEY": "abc"},
        {"ADVISORY_LOCK_KEY": None},
        {"ADVISORY_LOCK_KEY": 1.9},
        {"ADVISORY_LOCK_KEY": True},
        {"ADVISORY_LOCK_KEY": 2**63},
        # NaN is below no bound: every retry waited RETRY_BACKOFF_MAX.
        {"RETRY_BACKOFF_BASE": float("nan")},
        {"RETRY_BACKOFF_BASE": float("inf")},
        # Past Sentry's 40,320 minutes, it refuses the monitor's config.
        {"SENTRY_MAX_RUNTIME": 40_320 * 60 + 1},
        {"SENTRY_CHECKIN_MARGIN": timedelta(days=30)},
    ],
    ids=[
        "attempts_2_31",
        "attempts_true",
        "queue_long",
        "tick_inf",
        "poll_1e308",
        "tick_negative_timedelta",
        "lease_a_hundred_thousand_days",
        "retention_a_million_days",
        "lock_key_text",
        "lock_key_none",
        "lock_key_float",
        "lock_key_true",
        "lock_key_2_63",
        "backoff_base_nan",
        "backoff_base_inf",
        "sentry_runtime_past_sentry",
        "sentry_margin_past_sentry",
    ],
)
def test_settings__values_a_column_or_a_timedelta_cannot_hold_are_refused(
    options: dict[str, Any],
) -> None:
    from django.test import override_settings

    from ultimat3_jobs.checks import check_settings
    from ultimat3_jobs.conf import get_settings
    from ultimat3_jobs.errors import ConfigurationError

    with override_settings(ULTIMAT3_JOBS=options):
        with pytest.raises(ConfigurationError) as caught:
            get_settings()
        [message] = check_settings()
    assert caught.value.code == "jobs.config-invalid"
    assert message.id == "ultimat3_jobs.E002"
    assert message.hint == caught.value.fix


def test_settings__the_widest_lock_key_and_retention_are_taken() -> None:
    from django.test import override_settings

    from ultimat3_jobs.conf import MAX_RETENTION_DAYS, get_settings

    with override_settings(ULTIMAT3_JOBS={"ADVISORY_LOCK_KEY": -(2**63)}):
        assert get_settings().advisory_lock_key == -(2**63)
    with override_settings(
        ULTIMAT3_JOBS={"ADVISORY_LOCK_KEY": 2**63 - 1, "RETENTION_DAYS": MAX_RETENTION_DAYS}
    ):
        assert get_settings().advisory_lock_key == 2**63 - 1
        assert get_settings().retention_days == MAX_RETENTION_DAYS
