"""The cyclic garbage collector, paused where a process only builds what it keeps."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused(pause: bool = True) -> Iterator[None]:
    """The collector off meanwhile, when ``pause``, and back as it was, also on an error.

    Declaring tasks, or a round over thousands of them, makes objects by the million that all
    live on: the collections their growth sets off would walk them, and now and then every
    object of the process, again and again for nothing to free. A collector the project turned
    off stays off.
    """
    if not (pause and gc.isenabled()):
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
