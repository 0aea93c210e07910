"""An app whose ``tasks.py`` declares ``BENCH_DECLARED_TASKS`` tasks, for
``bench.process_settings``."""
