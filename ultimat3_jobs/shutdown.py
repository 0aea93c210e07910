"""Process-wide drain on SIGTERM/SIGINT: the first signal drains, the second exits at once.

Each role (scheduler, worker, relay) registers a callback while it runs and hands it back when
it stops (``lifecycle.Lifecycle``), so a stopped one never runs again on the next signal and
start/stop/start holds one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_lock = threading.Lock()
_callbacks: dict[int, tuple[str, Callable[[str], None]]] = {}
_previous: dict[int, Any] = {}
_signalled = threading.Event()
#: The signal that came before any role registered (``catch_early``).
_early: list[str] = []
_next_id = 0

#: Exit status of a forced exit on the second signal.
FORCED_EXIT = 1
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _handle(signum: int, frame: FrameType | None) -> None:
    with _lock:
        callbacks = list(_callbacks.values())
        if not callbacks:
            # Everything that registered has stopped (and could not restore the handlers from
            # its own thread): behave as if we had never been installed.
            signal.signal(signum, _previous.get(signum, signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
    if _signalled.is_set():
        os._exit(FORCED_EXIT)
    _signalled.set()
    reason = signal.Signals(signum).name
    # Never drain inside the handler: it interrupts the main thread, which may be the one the
    # drain has to wait for.
    for name, callback in callbacks:
        threading.Thread(target=callback, args=(reason,), name=f"drain-{name}", daemon=True).start()


def _handle_early(signum: int, frame: FrameType | None) -> None:
    if _early:
        os._exit(FORCED_EXIT)
    _early.append(signal.Signals(signum).name)


def catch_early() -> None:
    """Keep a SIGTERM/SIGINT that comes before any role registered: a role's process spends
    seconds in Django's setup and the checks, which call every task's function. Each role
    that registers afterwards drains at once, as if the signal had come just then; a second
    signal exits at once, as ever."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, _handle_early)


#: The commands that run a role until signalled (``JobsCommand.runs_until_signalled``).
ROLE_COMMANDS = frozenset({"run_scheduler", "run_worker", "run_relay", "run_jobs"})


def catch_early_in(argv: list[str]) -> None:
    """``catch_early`` in a process that runs a role from the command line, called from the
    app's ``ready()``: before the project's ``tasks.py`` modules import, seconds before the
    command itself runs. Never in a process-pool child, which multiprocessing starts with its
    parent's ``argv``: its signals are its own."""
    process = sys.modules.get("multiprocessing.process")
    if process is not None and process.parent_process() is not None:
        return
    if len(argv) > 1 and argv[1] in ROLE_COMMANDS:
        catch_early()


def on_shutdown(name: str, callback: Callable[[str], None]) -> Callable[[], None]:
    """Run ``callback(signal_name)`` on the first SIGTERM/SIGINT; returns the unregister."""
    global _next_id
    with _lock:
        if threading.current_thread() is not threading.main_thread():
            # Signal handlers can only be installed from the main thread; a scheduler started
            # elsewhere (a test, an embedding) is stopped by its owner instead.
            return lambda: None
        _next_id += 1
        token = _next_id
        if not _callbacks:
            _signalled.clear()
            for signum in SIGNALS:
                _previous[signum] = signal.signal(signum, _handle)
        _callbacks[token] = (name, callback)
        if _early:
            # The signal came while the process was starting: drain now, without waiting.
            _signalled.set()
            threading.Thread(
                target=callback, args=(_early[0],), name=f"drain-{name}", daemon=True
            ).start()

    def unregister() -> None:
        with _lock:
            if _callbacks.pop(token, None) is None or _callbacks:
                return
            if threading.current_thread() is threading.main_thread():
                for signum, previous in _previous.items():
                    signal.signal(signum, previous)
                _previous.clear()

    return unregister


def registered() -> list[str]:
    """Names of the callbacks a signal would run now."""
    with _lock:
        return [name for name, _ in _callbacks.values()]
