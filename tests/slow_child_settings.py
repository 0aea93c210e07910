"""The test project's settings, a minute slow to import in a worker's child process (and any
other process ``multiprocessing`` started): a child set up with them is still starting when
its start is given up. The worker itself imports them at once."""

import multiprocessing
import time

if multiprocessing.parent_process() is not None:
    time.sleep(60)

from testproject.settings import *  # noqa: F403
