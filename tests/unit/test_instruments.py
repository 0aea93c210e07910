"""The instruments the roles record into, read without a database."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ultimat3_jobs.instruments import LATENESS_BUCKETS, CountedHistogram


def test_counted_histogram__exposes_what_a_prometheus_histogram_of_them_exposes() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram("late_seconds", "h", buckets=LATENESS_BUCKETS, registry=theirs)
    counted = CountedHistogram("late_seconds", "h", LATENESS_BUCKETS)
    ours.register(counted)
    # Values exact in binary, so that both sums add up to the same float.
    observations = [(0.0, 1), (0.0078125, 2), (0.5, 3), (1.0, 1), (59.75, 4), (7200.0, 2)]
    for value, count in observations:
        counted.observe(value, count)
        for _ in range(count):
            histogram.observe(value)

    def samples(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return [line for line in text.splitlines() if "_created" not in line]

    assert samples(ours) == samples(theirs)
    assert 'late_seconds_bucket{le="0.01"} 3.0' in samples(ours)
