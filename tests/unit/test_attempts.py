"""Start marks shared by the threads that take jobs at one moment (``attempts.StartMarks``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from ultimat3_jobs.attempts import StartMarks
from ultimat3_jobs.store import ClaimedJob, JobStore

T0 = datetime(2026, 6, 1, tzinfo=UTC)


def claimed(pk: int) -> ClaimedJob:
    return ClaimedJob(pk, "demo.ping", f"k{pk}", {}, "default", 1, 3, T0)


class SlowMarks:
    """A store whose first mark waits until every other thread has asked for its own."""

    def __init__(self, threads: int, gone: set[int] | None = None) -> None:
        self.calls: list[list[int]] = []
        self.gone = gone or set()
        self.others_asked = threading.Barrier(threads)
        self.first = True

    def mark_started(self, *, jobs: Sequence[ClaimedJob], worker: str, now: datetime) -> set[int]:
        self.calls.append(sorted(job.id for job in jobs))
        if self.first:
            self.first = False
            self.others_asked.wait(5)
        return {job.id for job in jobs if job.id not in self.gone}


def _mark_all(marks: StartMarks, store: SlowMarks, count: int) -> dict[int, Any]:
    answers: dict[int, Any] = {}

    def take(pk: int) -> None:
        if pk != 1:
            store.others_asked.wait(5)  # Ask while the first mark is being written.
        try:
            answers[pk] = marks.mark(claimed(pk))
        except Exception as error:
            answers[pk] = error

    threads = [threading.Thread(target=take, args=(pk,)) for pk in range(1, count + 1)]
    threads[0].start()
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(10)
    return answers


def test_mark__each_thread_gets_its_own_answer_whichever_thread_writes_it() -> None:
    store = SlowMarks(4, gone={3})
    marks = StartMarks(store=cast(JobStore, store), node_id="w1", clock=lambda: T0)
    answers = _mark_all(marks, store, 4)
    # When it was marked started, the instant its statement wrote; None: no longer ours.
    assert answers == {1: T0, 2: T0, 3: None, 4: T0}
    assert store.calls[0] == [1]
    # The three that asked meanwhile: one statement, or at worst one each, never more.
    assert sorted(pk for call in store.calls[1:] for pk in call) == [2, 3, 4]
    assert len(store.calls) <= 4


def test_mark__an_error_reaches_every_thread_whose_mark_it_carried() -> None:
    class Failing:
        def mark_started(self, **kwargs: Any) -> set[int]:
            raise RuntimeError("connection lost")

    marks = StartMarks(store=cast(JobStore, Failing()), node_id="w1", clock=lambda: T0)
    with pytest.raises(RuntimeError, match="connection lost"):
        marks.mark(claimed(1))
    # Nothing is left behind for the next one.
    with pytest.raises(RuntimeError):
        marks.mark(claimed(2))
