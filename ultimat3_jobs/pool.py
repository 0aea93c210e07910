"""Job slots in child processes (``run_worker --pool process``): a timeout kills the stuck code
for real, and a crash (a segfault, ``os._exit()``, the OOM killer) ends one attempt, not the
worker.

Each of the worker's job threads owns one ``Child``: it hands the child a started job through
a pipe and waits for how it ended, at most the job's timeout (then SIGTERM, and SIGKILL after
``KILL_AFTER``). Children never touch the job table for a @job: they run the function and send
back how it ended, and the thread gives that to the dispatcher, which writes it with its next
claim as it does for the thread pool. A Django Task's row is run and written by the child, as a
job thread writes it in the thread pool (its return value goes with it).

Children are started with ``spawn``: a fresh interpreter that sets Django up by itself, so no
database connection (nor a lock held by another thread) is ever shared across a fork. A child
is replaced after ``max_jobs`` jobs or once its peak resident memory passes ``max_memory_mb``
(Celery's ``--max-tasks-per-child`` and ``--max-memory-per-child``, gunicorn's
``max_requests``), and when it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import SpawnProcess

    from .attempts import Outcome
    from .store import ClaimedJob, StartedTask

#: Seconds a child timed out gets to end on SIGTERM before SIGKILL.
KILL_AFTER = 2.0
#: Seconds a new child gets to set Django up and say it is ready, before it is given up.
READY_WITHIN = 120.0
#: Seconds a child asked to stop (recycled, worker stopping) gets before it is killed.
STOP_AFTER = 5.0
#: How often a child checks that its worker is still alive; orphaned, it exits.
ORPHAN_CHECK = 1.0
#: How often a child's start is checked for having been given up (``Child.cancel``).
CANCEL_CHECK = 0.1


@dataclass(frozen=True, slots=True)
class ChildSetup:
    """What a child needs to run jobs as its worker would: the database names its worker uses
    (a test database is not the settings' name), and for Django Tasks, the worker's id and
    retry rules."""

    databases: dict[str, str]
    using: str
    node_id: str
    backoff_base: float
    backoff_max_s: float
    retry_every_s: float


@dataclass(frozen=True, slots=True)
class Reply:
    """How a job ended in a child: ``kind`` is "succeeded", "raised" (``text``: the traceback,
    ``fields``: its log fields), or "task" (a Django Task, written by the child: ``outcome``, or
    None when every write was refused). ``rss_kb``: the child's peak resident memory."""

    kind: str
    rss_kb: int
    text: str = ""
    fields: dict[str, Any] | None = None
    outcome: Outcome | None = None


#: What a child says once it can take jobs.
READY = "ready"


class ChildDied(Exception):
    """The child ended while running a job, or would not take one; ``exit_code`` as
    ``multiprocessing`` gives it (negative: the signal that killed it)."""

    def __init__(self, exit_code: int | None) -> None:
        super().__init__(f"child exited with {exit_code}")
        self.exit_code = exit_code


class ChildTimedOut(Exception):
    """The job ran past its timeout; its child was killed."""


class Child:
    """One job slot's child process, started on first use and replaced as needed.

    ``run`` is called by one thread at a time (the slot's). ``pids`` lists every child it
    started, for tests and logs.
    """

    def __init__(
        self, setup: ChildSetup, *, max_jobs: int | None = None, max_memory_mb: int | None = None
    ) -> None:
        self.setup = setup
        self.max_jobs = max_jobs
        self.max_memory_mb = max_memory_mb
        self.pids: list[int] = []
        self._process: SpawnProcess | None = None
        self._conn: Connection | None = None
        #: Set once the current child said it is ready; cleared as it is let go or replaced.
        self._started = False
        self._jobs = 0
        self._context = multiprocessing.get_context("spawn")
        self._cancelled = threading.Event()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def ready(self) -> bool:
        """Whether a job given now would start at once: a child up, Django set up in it. Read
        from the dispatcher (a racy look is fine: it only decides whether the claim may mark
        a job started)."""
        process = self._process
        return self._started and process is not None and process.is_alive()

    def ensure(self) -> None:
        """A live child, ready for a job: a dead one (killed between jobs) is replaced.

        Raises ``ChildDied`` when the child ended before it was ready, or its start was given
        up (``cancel``); no child is left behind.
        """
        if self._process is not None and self._process.is_alive():
            return
        self._reap()
        if self._cancelled.is_set():
            raise ChildDied(None)
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=child_main,
            args=(theirs, self.setup, os.getpid()),
            name="ultimat3-job-child",
            daemon=True,
        )
        process.start()
        # Our copy closed: the pipe reads EOF as soon as the child is gone.
        theirs.close()
        self._process, self._conn, self._jobs = process, ours, 0
        self.pids.append(process.pid or 0)
        # Ready once Django is set up in it: its start-up is neither a job's run nor counted
        # in a job's timeout, and no job is marked started before a child can run it.
        if not self._ready(ours):
            raise self._died(0 if self._cancelled.is_set() else KILL_AFTER)
        self._started = True

    def cancel(self) -> None:
        """Give up a start under way, and any later one (the worker is stopping): a child still
        setting Django up would otherwise hold its thread for up to ``READY_WITHIN``. Safe from
        any thread; the child is ended by the thread that started it."""
        self._cancelled.set()

    def end_now(self) -> None:
        """SIGKILL the child, and what its job started, from any thread: the worker leaves
        without its job (its drain grace ran out). The thread that runs it finds it dead, and
        reaps it; one it reaped already (closed) is left alone, and a reaped child is never
        signalled again."""
        process = self._process
        if process is not None:
            # Nothing here waits on the child (the thread that runs it reaps it); a child that
            # thread closed meanwhile raises ValueError, and is left alone.
            with contextlib.suppress(
                ValueError, ProcessLookupError, PermissionError, AttributeError, TypeError
            ):
                os.killpg(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            with contextlib.suppress(ValueError, ProcessLookupError):
                process.kill()  # One that had not made its group yet.

    def _ready(self, conn: Connection) -> bool:
        deadline = time.monotonic() + READY_WITHIN
        try:
            while not self._cancelled.is_set():
                if conn.poll(CANCEL_CHECK):
                    return bool(conn.recv() == READY)
                if time.monotonic() >= deadline:
                    return False
        except (EOFError, OSError):
            pass  # It died starting.
        return False

    def run(self, job: ClaimedJob, row: StartedTask | None, timeout: float | None) -> Reply:
        """Run ``job`` (a Django Task: with its ``row``) in the child; how it ended.

        Raises ``ChildTimedOut`` (the child was killed) or ``ChildDied``; either way the next
        ``run`` gets a new child.
        """
        self.ensure()
        assert self._conn is not None and self._process is not None
        try:
            self._conn.send((job, row))
        except (BrokenPipeError, EOFError, OSError) as error:
            raise self._died() from error
        if not self._conn.poll(timeout):
            self.kill()
            raise ChildTimedOut
        try:
            reply: Reply = self._conn.recv()
        except (EOFError, OSError) as error:
            raise self._died() from error
        self._jobs += 1
        if (self.max_jobs is not None and self._jobs >= self.max_jobs) or (
            self.max_memory_mb is not None and reply.rss_kb > self.max_memory_mb * 1024
        ):
            self.stop()  # The next job starts a fresh one.
        return reply

    def _died(self, wait: float = KILL_AFTER) -> ChildDied:
        """The child failed us: it gets ``wait`` seconds to end by itself, with its own exit
        code, and is killed if it has not."""
        if self._process is not None:
            self._process.join(wait)
        return ChildDied(self.kill())

    def kill(self) -> int | None:
        """SIGTERM the child and the processes its job started, SIGKILL whichever of them
        is still there after ``KILL_AFTER``; the child's exit code (read before the process
        object is closed), None without a child. A child that ended by itself is left so,
        and what its jobs started with it."""
        process = self._process
        code = None
        if process is not None:
            if process.is_alive():
                deadline = time.monotonic() + KILL_AFTER
                _signal_group(process, signal.SIGTERM)
                process.join(KILL_AFTER)
                # What its job started gets the same grace, the child ended or not.
                while time.monotonic() < deadline and _signal_group(process, 0):
                    time.sleep(0.05)
                _signal_group(process, signal.SIGKILL)
                process.join()
            code = process.exitcode
        self._reap()
        return code

    def stop(self) -> None:
        """Let the child go (between jobs): asked to exit, killed if it does not."""
        if self._conn is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(None)
        if self._process is not None:
            self._process.join(STOP_AFTER)
        self.kill()

    def _reap(self) -> None:
        self._started = False
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.join(0)
            if not self._process.is_alive():
                self._process.close()
        self._process, self._conn = None, None


# -- in the child ---------------------------------------------------------------------------------


def child_main(conn: Connection, setup: ChildSetup, parent: int) -> None:
    """A child's life: set Django up, then run what the pipe brings until told to stop."""
    # The worker drains on SIGINT (a terminal's ^C reaches the whole group): let the job end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A process group of its own, which what its jobs start joins: a timeout ends them all.
    with contextlib.suppress(OSError, AttributeError):
        os.setpgid(0, 0)
    _die_with_the_worker(parent)
    threading.Thread(target=_exit_if_orphaned, args=(parent,), daemon=True).start()
    import django
    from django.conf import settings

    django.setup()
    # A timeout's SIGTERM: the job's statement under way, if any, is cancelled first.
    signal.signal(signal.SIGTERM, _cancel_then_end)
    # What setup built lives as long as the child: the collector need not walk it again, in the
    # child's full collections nor in those its interpreter runs at exit (as ``JobsCommand``).
    gc.freeze()
    for alias, name in setup.databases.items():
        if alias in settings.DATABASES:
            settings.DATABASES[alias]["NAME"] = name
    from django.db import close_old_connections, connections

    attempts = None
    try:
        if not _told(conn, READY):
            return
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # The worker is gone, or gave this child up.
            if message is None:
                return
            job, row = message
            if row is None:
                reply = _run_job(job, setup)
            else:
                if attempts is None:
                    attempts = _task_attempts(setup)
                outcome = attempts.run_django_task(job, row)
                reply = Reply("task", _peak_rss_kb(), outcome=outcome)
            close_old_connections()
            if not _told(conn, reply):
                return
    finally:
        # A child ends without its interpreter's exit hooks: what its threads hold goes first.
        if attempts is not None:
            attempts.checkins.close()  # The closing check-ins of the tasks it ran.
        from . import tracing

        tracing.flush()
        connections.close_all()


def _told(conn: Connection, message: object) -> bool:
    """Send ``message`` to the worker; False once nobody reads the pipe (the worker was killed,
    or it gave this child up after a timeout): the child ends quietly."""
    try:
        conn.send(message)
    except OSError:
        return False
    return True


def _run_job(job: ClaimedJob, setup: ChildSetup) -> Reply:
    from . import tracing
    from .db import committed, in_transaction, left_in_transaction, running_job_of
    from .logs import failure_fields
    from .registry import registry
    from .retries import format_error

    handle = registry.get_job(job.name)
    assert handle is not None  # The worker runs only the jobs its own code declares.
    before = in_transaction()
    try:
        # Its span, as in the thread pool: the trace its row keeps, continued in this child.
        with tracing.job_run(job, worker=setup.node_id), running_job_of(setup.using):
            handle.func(**job.input)
            committed(job.name, before)
    except BaseException as error:
        left_in_transaction(before)
        return Reply("raised", _peak_rss_kb(), format_error(error), failure_fields(error))
    return Reply("succeeded", _peak_rss_kb())


def _task_attempts(setup: ChildSetup) -> Any:
    from datetime import timedelta

    from . import clock
    from .attempts import Attempts
    from .store import store_for

    return Attempts(
        store=store_for(setup.using),
        node_id=setup.node_id,
        clock=clock.now,
        backoff_base=setup.backoff_base,
        backoff_max=timedelta(seconds=setup.backoff_max_s),
        retry_every=timedelta(seconds=setup.retry_every_s),
        abandoned=threading.Event(),
    )


def _peak_rss_kb() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes there, KiB on Linux


#: ``prctl``'s option that has the kernel signal a process when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with_the_worker(parent: int) -> None:
    """On Linux, have the kernel SIGKILL this child as its worker dies (the thread that
    started it, which outlives it), whatever the job holds: a C call that keeps the GIL
    leaves ``_exit_if_orphaned``'s thread no turn. Elsewhere that thread alone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)  # It died before the kernel was told.


def _cancel_then_end(signum: int, frame: Any) -> None:
    """SIGTERM (a timeout, a stop): cancel the statement the job's connections run, so that
    it and its locks end with this process, then die of the signal as without a handler.
    The server would otherwise run it on, a statement not noticing its client gone."""
    from .db import cancel_statements, thread_connections

    cancel_statements(thread_connections())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _signal_group(process: SpawnProcess, signum: int) -> bool:
    """``signum`` to the child's process group (itself and the processes its job started),
    or to the child alone before it made its group; whether any process got it (``signum``
    0 sends none: is any still there?). The group's id is the child's pid, which is not
    another process's while the group has members; the child alone is signalled only while
    it is unreaped."""
    pid = process.pid
    if pid is None:
        return False
    try:
        os.killpg(pid, signum)
        return True
    except (ProcessLookupError, PermissionError, AttributeError):
        pass
    if process.exitcode is not None:
        return False
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _exit_if_orphaned(parent: int) -> None:
    # A worker killed outright (SIGKILL) cannot stop its children: each leaves by itself.
    while True:
        time.sleep(ORPHAN_CHECK)
        if os.getppid() != parent:
            os._exit(1)


__all__ = ["Child", "ChildDied", "ChildSetup", "ChildTimedOut", "Reply"]
