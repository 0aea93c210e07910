"""procrastinate's worker on the same no-op job, for ``bench.worker`` to compare with ours.

``main([CONNINFO, "schema" | "defer", N | "work", CONCURRENCY])``: ``bench.worker`` runs each
step in a process of its own, as a deployment would. Needs the ``bench`` extra.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import procrastinate

QUEUE = "ultimat3-bench"


def make_app(conninfo: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop", queue=QUEUE)
    def noop() -> None:
        """The same no-op as ours, a sync task."""

    return app


def main(argv: list[str]) -> None:
    conninfo, step, *rest = argv
    app = make_app(conninfo)
    logging.basicConfig(level=logging.WARNING)
    if step == "schema":
        with app.open():
            app.schema_manager.apply_schema()
    elif step == "defer":
        n = int(rest[0])

        async def defer() -> None:
            async with app.open_async():
                await app.tasks["noop"].batch_defer_async(*([{}] * n))

        asyncio.run(defer())
    elif step == "work":
        # wait=False: run what is queued, then return, like ``run_worker --burst``.
        app.run_worker(queues=[QUEUE], concurrency=int(rest[0]), wait=False)
    else:
        raise SystemExit(f"unknown step {step!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
