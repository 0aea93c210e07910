"""``db.Ahead``: rows made in a thread of their own, read in order, failures passed on."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest

from ultimat3_jobs.db import (
    AHEAD_BUFFERED,
    AHEAD_CHUNK,
    AHEAD_SWITCH_INTERVAL,
    AHEAD_WAIT_CHECK,
    Ahead,
)


def test_ahead__reads_each_source_whole_and_in_order() -> None:
    count = 2 * AHEAD_CHUNK + 7  # Two whole chunks and a part.
    ahead: Ahead[int] = Ahead(range(count), (-n for n in range(3)), ())
    try:
        assert list(ahead.rows(0)) == list(range(count))
        assert list(ahead.rows(1)) == [0, -1, -2]
        assert list(ahead.rows(2)) == []
    finally:
        ahead.close()


def test_ahead__makes_rows_in_another_thread_before_they_are_read() -> None:
    made_in: list[str] = []
    made = threading.Event()

    def rows() -> Iterator[int]:
        made_in.append(threading.current_thread().name)
        yield 1
        made.set()

    ahead: Ahead[int] = Ahead(rows())
    try:
        assert made.wait(5)  # Nobody has read a row yet.
        assert list(ahead.rows(0)) == [1]
        assert made_in == ["ultimat3-rows-ahead"]
    finally:
        ahead.close()


def test_ahead__an_error_is_raised_to_the_reader_of_its_source_and_of_the_later_ones() -> None:
    def failing() -> Iterator[int]:
        yield from range(AHEAD_CHUNK + 1)
        raise ValueError("row 501 cannot be made")

    ahead: Ahead[int] = Ahead(failing(), range(3))
    read: list[int] = []
    with pytest.raises(ValueError, match="row 501"):
        read.extend(ahead.rows(0))
    assert read == list(range(AHEAD_CHUNK))  # The whole chunk made before the error.
    with pytest.raises(ValueError, match="row 501"):
        list(ahead.rows(1))
    ahead.close()


def test_ahead__a_reader_that_lags_holds_a_bounded_number_of_rows_and_close_stops_it() -> None:
    made: list[int] = []

    def endless() -> Iterator[int]:
        n = 0
        while True:
            made.append(n)
            yield n
            n += 1

    ahead: Ahead[int] = Ahead(endless())
    assert next(iter(ahead.rows(0))) == 0
    time.sleep(0.3)  # Long enough to make millions of rows, were there no bound.
    assert len(made) <= (AHEAD_BUFFERED + 2) * AHEAD_CHUNK
    closing = threading.Thread(target=ahead.close)
    closing.start()
    closing.join(5)
    assert not closing.is_alive(), "close() waits on a thread that never stops"
    assert not ahead._thread.is_alive()


def test_ahead__switches_threads_often_while_rows_are_made_and_sets_it_back() -> None:
    before = sys.getswitchinterval()
    seen: list[float] = []
    second_done = threading.Event()

    def first() -> Iterator[int]:
        seen.append(sys.getswitchinterval())
        assert second_done.wait(5)
        # The other one ended first: rows are still made here, so the interval stays short.
        seen.append(sys.getswitchinterval())
        yield 1

    def second() -> Iterator[int]:
        seen.append(sys.getswitchinterval())
        yield 2

    one: Ahead[int] = Ahead(first())
    two: Ahead[int] = Ahead(second())
    try:
        assert list(two.rows(0)) == [2]
        two.close()
        second_done.set()
        assert list(one.rows(0)) == [1]
    finally:
        one.close()
        two.close()
    assert seen == [AHEAD_SWITCH_INTERVAL] * 3
    assert sys.getswitchinterval() == before


def test_ahead__leaves_a_shorter_interval_alone() -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(AHEAD_SWITCH_INTERVAL / 5)
    try:
        shorter = sys.getswitchinterval()
        seen: list[float] = []

        def rows() -> Iterator[int]:
            seen.append(sys.getswitchinterval())
            yield 1

        ahead: Ahead[int] = Ahead(rows())
        try:
            assert list(ahead.rows(0)) == [1]
        finally:
            ahead.close()
        assert seen == [shorter]
        assert sys.getswitchinterval() == shorter
    finally:
        sys.setswitchinterval(before)


def test_ahead__on_wait_is_called_while_the_reader_waits_for_rows_and_only_then() -> None:
    gate = threading.Event()
    waits: list[float] = []

    def slow() -> Iterator[int]:
        yield 1
        gate.wait(10)
        yield 2

    def waited() -> None:
        waits.append(time.monotonic())
        if len(waits) == 2:
            gate.set()

    ahead: Ahead[int] = Ahead(slow(), on_wait=waited)
    try:
        start = time.monotonic()
        assert list(ahead.rows(0)) == [1, 2]
    finally:
        ahead.close()
    # The first chunk, [1], is handed over only with the second: the waits come before it.
    assert len(waits) >= 2
    assert waits[0] - start >= AHEAD_WAIT_CHECK * 0.9
    waits.clear()
    ready: Ahead[int] = Ahead(range(3), on_wait=waited)
    try:
        assert list(ready.rows(0)) == [0, 1, 2]
    finally:
        ready.close()
    assert waits == []
