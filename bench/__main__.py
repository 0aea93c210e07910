"""``python -m bench``: every benchmark, one table each."""

from __future__ import annotations

import sys

from . import scheduler


def main() -> None:
    scheduler.main(sys.argv[1:] or None)
    try:
        from . import worker
    except ImportError:
        return
    worker.main([])


main()
