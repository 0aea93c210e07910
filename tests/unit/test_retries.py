"""Retry timing and the stored error text: pure functions, no database."""

from __future__ import annotations

from datetime import timedelta

from ultimat3_jobs.retries import (
    ERROR_LIMIT,
    MAX_LOOP_BACKOFF,
    bounded,
    format_error,
    loop_backoff,
    retry_delay,
)


def test_retry_delay__grows_as_base_to_the_attempts_up_to_the_cap() -> None:
    cap = timedelta(seconds=60)
    delays = [retry_delay(n, base=2, cap=cap, rand=lambda: 1.0) for n in (1, 2, 3, 6, 7, 500)]
    assert [d.total_seconds() for d in delays] == [2, 4, 8, 60, 60, 60]


def test_retry_delay__full_jitter_spans_zero_to_the_ceiling() -> None:
    cap = timedelta(hours=1)
    assert retry_delay(3, base=2, cap=cap, rand=lambda: 0.0) == timedelta(0)
    assert retry_delay(3, base=2, cap=cap, rand=lambda: 0.25) == timedelta(seconds=2)
    spread = {retry_delay(4, base=2, cap=cap) for _ in range(50)}
    assert len(spread) > 1
    assert all(timedelta(0) <= d <= timedelta(seconds=16) for d in spread)


def test_format_error__keeps_the_raise_site_and_drops_nul_bytes() -> None:
    try:
        raise ValueError("bad\x00value")
    except ValueError as error:
        text = format_error(error)
    assert "ValueError: bad\\x00value" in text
    assert "\x00" not in text
    assert "test_format_error__keeps_the_raise_site" in text


def test_loop_backoff__doubles_from_the_interval_up_to_the_cap() -> None:
    second = timedelta(seconds=1)
    waits = [loop_backoff(second, n).total_seconds() for n in (0, 1, 2, 3, 5, 50)]
    assert waits == [1, 2, 4, 8, 30, 30]
    assert timedelta(seconds=30) == MAX_LOOP_BACKOFF


def test_loop_backoff__an_interval_longer_than_the_cap_is_never_shortened() -> None:
    slow = timedelta(minutes=2)
    assert loop_backoff(slow, 0) == slow
    assert loop_backoff(slow, 4) == slow


def test_format_error__a_message_of_megabytes_keeps_the_last_error_limit_characters() -> None:
    try:
        raise ValueError("x" * 5_000_000)
    except ValueError as error:
        text = format_error(error)
    assert len(text) == ERROR_LIMIT + len("...\n")
    assert text.startswith("...\n")


def test_bounded__a_django_tasks_traceback_is_cut_as_last_error_is() -> None:
    short = "Traceback ...\nValueError: no"
    assert bounded(short) == short
    long = "Traceback ...\n" + "x" * 100_000 + "\nValueError: at the end"
    assert bounded(long).endswith("ValueError: at the end")
    assert len(bounded(long)) == ERROR_LIMIT + len("...\n")
