"""Benchmarks, run by ``make bench``. They print tables; they assert nothing about time."""
