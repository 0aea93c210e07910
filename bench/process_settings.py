"""The example project's settings plus an app declaring ``BENCH_DECLARED_TASKS`` tasks in its
``tasks.py``: ``run_scheduler`` as a project runs it, for the scheduler benchmark only."""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.declared"]
