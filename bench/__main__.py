"""``python -m bench``: every benchmark, one table each."""

from __future__ import annotations

import subprocess
import sys

from . import scheduler, setup


def main() -> None:
    print(setup.server_line())
    scheduler.main(sys.argv[1:] or None)
    try:
        from . import worker
    except ImportError:
        return
    worker.main([])
    # Its own process: it needs settings of its own (django-tasks-db installed beside us).
    subprocess.run([sys.executable, "-m", "bench.task_backends"], check=True)


main()
