"""A task as a Sentry monitor: its option, slug, config and check-in ids, with no Sentry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ultimat3_jobs.cron import parse
from ultimat3_jobs.declarations import task
from ultimat3_jobs.errors import InvalidMonitorError
from ultimat3_jobs.handles import Entry
from ultimat3_jobs.monitors import (
    check_in_id,
    check_monitor,
    crontab,
    is_monitored,
    monitor_config,
    slug,
)
from ultimat3_jobs.registry import Registry

EVERY_MINUTE = parse("* * * * *")
DEFAULTS = {"checkin_margin": timedelta(seconds=60), "max_runtime": timedelta(seconds=1800)}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, None, id="follows_the_setting"),
        pytest.param(False, False, id="off"),
        pytest.param(True, True, id="on"),
        pytest.param({"checkin_margin": 5}, {"checkin_margin": 5}, id="options"),
        pytest.param({}, {}, id="empty_options_are_on"),
    ],
)
def test_check_monitor__takes_a_flag_or_options(value: object, expected: object) -> None:
    assert check_monitor(value, EVERY_MINUTE, 'task "t"') == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        pytest.param("yes", "monitor='yes'", id="a_string"),
        pytest.param(1, "monitor=1", id="a_number"),
        pytest.param({"margin": 5}, "not an option of a Sentry monitor", id="unknown_key"),
        pytest.param({"checkin_margin": 0}, "whole number of minutes from 1", id="zero"),
        pytest.param({"max_runtime": 1.5}, "whole number of minutes from 1", id="fraction"),
        pytest.param({"max_runtime": True}, "whole number of minutes from 1", id="a_bool"),
        pytest.param({"recovery_threshold": -1}, "of check-ins", id="negative_threshold"),
        # Sentry's own bounds, past which it refuses the monitor's config.
        pytest.param({"max_runtime": 40_321}, "from 1 to 40,320", id="runtime_past_sentry"),
        pytest.param({"checkin_margin": 50_000}, "from 1 to 40,320", id="margin_past_sentry"),
        pytest.param({"failure_issue_threshold": 721}, "from 1 to 720", id="threshold_past"),
        pytest.param({"owner": ""}, "non-empty string", id="empty_owner"),
        pytest.param({"owner": "nobody"}, '"user:<email>" or "team:<slug>"', id="owner_form"),
        pytest.param({"owner": "user:"}, '"user:<email>" or "team:<slug>"', id="owner_empty"),
        pytest.param({"slug": "Has Spaces"}, "a slug is at most 50", id="slug_chars"),
        pytest.param({"slug": "x" * 51}, "a slug is at most 50", id="slug_length"),
    ],
)
def test_check_monitor__refuses_what_sentry_cannot_take(value: object, says: str) -> None:
    with pytest.raises(InvalidMonitorError) as raised:
        check_monitor(value, EVERY_MINUTE, 'task "t"')
    assert raised.value.code == "jobs.task.monitor-invalid"
    assert says in raised.value.message
    assert "monitor=" in raised.value.fix


def test_check_monitor__refuses_a_schedule_faster_than_a_minute() -> None:
    with pytest.raises(InvalidMonitorError) as raised:
        check_monitor(True, parse("*/10 * * * * *"), 'task "t"')
    assert "more than once a minute" in raised.value.message
    assert check_monitor(False, parse("*/10 * * * * *"), 'task "t"') is False


def test_task__monitor_is_checked_at_declaration(fresh_registry: Registry) -> None:
    with pytest.raises(InvalidMonitorError):

        @task(cron="* * * * * *", tz="UTC", name="unit.per_second_monitor", monitor=True)
        def per_second(occurrence: datetime) -> list[Entry]:
            return []

    owner = {"owner": "team:ops"}

    @task(cron="0 3 * * *", tz="Europe/Paris", name="unit.nightly_monitor", monitor=owner)
    def nightly(occurrence: datetime) -> list[Entry]:
        return []

    assert nightly.monitor == owner


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        pytest.param("0 3 * * *", "0 3 * * *", id="five_fields"),
        pytest.param("0  */5 * * *", "0 */5 * * *", id="spacing_normalised"),
        pytest.param("0 */5 * * * *", "*/5 * * * *", id="one_second_value_dropped"),
        pytest.param("*/10 * * * * *", None, id="several_seconds"),
        pytest.param("* * * * * *", None, id="every_second"),
    ],
)
def test_crontab__is_sentrys_five_fields(cron: str, expected: str | None) -> None:
    assert crontab(parse(cron)) == expected


def test_is_monitored__the_option_wins_over_the_setting() -> None:
    assert is_monitored(None, default=True) and not is_monitored(None, default=False)
    assert is_monitored(True, default=False) and is_monitored({}, default=False)
    assert not is_monitored(False, default=True)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("demo.nightly_digest", "demo-nightly_digest", id="dots_become_dashes"),
        pytest.param("billing", "billing", id="already_a_slug"),
    ],
)
def test_slug__reads_as_the_task_name(name: str, expected: str) -> None:
    assert slug(name) == expected


def test_slug__a_changed_or_long_name_keeps_a_digest_so_names_never_share_one() -> None:
    assert slug("Billing.Nightly") != slug("billing.nightly")
    long_a, long_b = "a" * 60 + ".one", "a" * 60 + ".two"
    assert slug(long_a) != slug(long_b)
    assert all(len(slug(name)) <= 50 for name in (long_a, long_b, "Billing.Nightly"))
    assert slug("anything", {"slug": "pinned"}) == "pinned"
    # A name with dashes of its own keeps its slug (a monitor's history goes with it) unless
    # told it reads alike another's: then it keeps a digest.
    assert slug("billing-sync.nightly") == "billing-sync-nightly"
    assert slug("billing-sync.nightly", alike=True).startswith("billing-sync-nightly-")
    assert slug("a.b.c", {"slug": "pinned"}, alike=True) == "pinned"


def test_monitor_config__crontab_zone_and_minutes_from_the_settings() -> None:
    config = monitor_config(parse("30 2 * * *"), "America/New_York", True, **DEFAULTS)
    assert config == {
        "schedule": {"type": "crontab", "value": "30 2 * * *"},
        "timezone": "America/New_York",
        "checkin_margin": 1,
        "max_runtime": 30,
    }


def test_monitor_config__options_override_in_sentrys_units_and_seconds_round_up() -> None:
    config = monitor_config(
        parse("0 */5 * * * *"),
        "UTC",
        {"max_runtime": 5, "failure_issue_threshold": 2, "owner": "team:ops"},
        checkin_margin=timedelta(seconds=61),
        max_runtime=timedelta(hours=1),
    )
    assert config == {
        "schedule": {"type": "crontab", "value": "*/5 * * * *"},
        "timezone": "UTC",
        "checkin_margin": 2,
        "max_runtime": 5,
        "failure_issue_threshold": 2,
        "owner": "team:ops",
    }
    assert monitor_config(parse("* * * * * *"), "UTC", True, **DEFAULTS) is None


def test_check_in_id__one_per_occurrence_whoever_computes_it() -> None:
    at = datetime(2026, 6, 1, 3, tzinfo=UTC)
    same = at.astimezone(datetime(2026, 1, 1).astimezone().tzinfo)
    here = "https://key@o1.ingest.sentry.io/1|production"
    assert check_in_id("t", at, here) == check_in_id("t", same, here)
    assert len(check_in_id("t", at, here)) == 32
    assert check_in_id("t", at, here) != check_in_id("t", at + timedelta(minutes=1), here)
    assert check_in_id("t", at, here) != check_in_id("u", at, here)
    # Sentry looks ids up across its projects: another project's, another environment's.
    assert check_in_id("t", at, here) != check_in_id("t", at, "https://key@o1/2|production")
    assert check_in_id("t", at, here) != check_in_id("t", at, here.replace("production", "staging"))
