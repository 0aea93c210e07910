"""Connections the app owns beside Django's, the database clock, and rows made in a thread
ahead of the statement that takes them (``Ahead``), kept off the round's own locks
(``OwnLockWaits``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import select
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import orjson
import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.backends.signals import connection_created
from psycopg.pq import TransactionStatus

from .errors import JobTransactionLeftOpenError

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


def app_database() -> str:
    """The database the app's tables are on: the one ``DATABASE_ROUTERS`` send its writes to
    (``default`` without a router). Where a caller names no database, this one is meant."""
    from .models import Job

    return router.db_for_write(Job) or DEFAULT_DB_ALIAS


#: The database of the job this thread (or pool child) runs, set by the worker around its
#: function (``running_job_of``): the app's own jobs, the nightly prune, work on the database
#: their row is on, which a worker's ``--database`` names, not where the router sends the app.
_running_on: ContextVar[str | None] = ContextVar("running_on", default=None)


@contextlib.contextmanager
def running_job_of(using: str) -> Iterator[None]:
    token = _running_on.set(using)
    try:
        yield
    finally:
        _running_on.reset(token)


def job_database() -> str:
    """The database of the job running here, else the app's (``app_database``)."""
    return _running_on.get() or app_database()


def dedicated_connection(using: str, application_name: str) -> psycopg.Connection[Any]:
    """An autocommit PostgreSQL connection of our own, with Django's parameters for ``using``.

    For what must outlive Django's per-request connections: an advisory lock, a LISTEN.
    Keepalives notice a vanished server or network in seconds rather than hours.
    """
    params = connections[using].get_connection_params()
    # Django's cursor factory and adapters are for its own connections; a plain one will do.
    for key in (
        "cursor_factory",
        "context",
        "prepare_threshold",
        "server_side_binding",
        "application_name",
        "autocommit",
    ):
        params.pop(key, None)
    # Ours unless the OPTIONS of DATABASES set them (a connect_timeout of the project's).
    defaults = {
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
    }
    return psycopg.connect(
        **{**defaults, **params},
        autocommit=True,
        # Never prepared: a statement run once a round gains nothing from it, and a
        # transaction-pooling PgBouncer cannot keep it (psycopg's default prepares from the
        # sixth run).
        prepare_threshold=None,
        # Ours whatever the OPTIONS say: the status tells the advisory leader by it.
        application_name=application_name,
    )


def in_transaction() -> frozenset[str]:
    """The databases whose Django connection in this thread is in a transaction now (an
    atomic block, autocommit off). No statement."""
    return frozenset(
        wrapper.alias
        for wrapper in thread_connections()
        if wrapper.connection is not None and _in_transaction(wrapper)
    )


#: Each thread's Django connection objects (``thread_connections``).
_wrappers = threading.local()


def thread_connections() -> list[Any]:
    """The Django connection objects of this thread, one per database, looked up once a
    thread (``connections.all()`` asks its thread-local store for each, per call): what a
    job's run is checked on, and what its timeout cancels from another thread. An object
    stays its thread's for the thread's life; one not connected has ``connection`` None."""
    found: list[Any] | None = getattr(_wrappers, "all", None)
    if found is None or len(found) != len(connections.settings):
        found = _wrappers.all = [connections[alias] for alias in connections]
    return found


def _in_transaction(wrapper: Any) -> bool:
    return bool(
        wrapper.in_atomic_block or wrapper.autocommit != wrapper.settings_dict["AUTOCOMMIT"]
    )


def left_in_transaction(before: frozenset[str] = frozenset()) -> list[str]:
    """The databases whose Django connection in this thread is in a transaction it was not in
    ``before`` the code it ran (autocommit turned off and never back on, an atomic block
    entered and never left), each closed: the server rolls its writes back, and the next job
    of the thread opens a clean one rather than writing into that transaction. No statement."""
    left = []
    for wrapper in thread_connections():
        if wrapper.connection is None or wrapper.alias in before:
            continue
        if _in_transaction(wrapper):
            left.append(wrapper.alias)
            # Out of the block, so that close() lets the connection go (connect() resets the
            # rest of the block's state).
            wrapper.in_atomic_block = False
            wrapper.close()
    return left


def committed(name: str, before: frozenset[str] = frozenset()) -> None:
    """Raise ``JobTransactionLeftOpenError`` if the run of the job or task ``name`` that just
    returned in this thread left a transaction open (``left_in_transaction``)."""
    left = left_in_transaction(before)
    if left:
        raise JobTransactionLeftOpenError(
            f'"{name}" returned with a transaction open on the database '
            f"{', '.join(map(repr, left))}: what it wrote there was rolled back",
            fix="commit before returning: write in a transaction.atomic() block, or call "
            "transaction.commit() and set_autocommit(True) after set_autocommit(False); then "
            "retry the job from the admin",
            cause=left,
        )


def cancel_statements(wrappers: Iterable[Any]) -> None:
    """Cancel the statement each of ``wrappers`` (Django connections, another thread's or this
    one's) is running, if any: a job past its timeout must not go on in the server, holding
    its locks, however its own code is stuck. From any thread, even a signal handler."""
    for wrapper in wrappers:
        raw = wrapper.connection
        if raw is None:
            continue
        with contextlib.suppress(Exception):  # Closed meanwhile, or the server away: nothing runs.
            if wrapper.vendor == "postgresql":
                if raw.info.transaction_status == TransactionStatus.ACTIVE:
                    raw.cancel_safe(timeout=CANCEL_TIMEOUT)
            elif wrapper.vendor == "sqlite":
                raw.interrupt()


#: Seconds a cancel request may take to reach the server.
CANCEL_TIMEOUT = 2.0


def hung_up(connection: Any) -> bool:
    """Whether the server has spoken on this idle Django connection to PostgreSQL, which in
    practice is its goodbye: a restart's or a ``pg_terminate_backend``'s "terminating
    connection due to administrator command", then the socket's close. Never blocks.

    An idle connection has nothing to read until it sends a query, so any byte waiting on its
    socket says the connection is not the one the next query expects (a rare notice the app
    asked for ends it too, at the price of a new connection). Without this a job would meet
    the dead connection as its first query's error, and a Django Task, never retried, would
    fail for it.
    """
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    if connection.in_atomic_block:
        return False  # A caller's transaction: its own statements will say.
    try:
        readable, _, _ = select.select([connection.connection.pgconn.socket], [], [], 0)
    except (OSError, psycopg.Error):
        return True  # Closed already.
    return bool(readable)


#: How often PostgreSQL 14 and later look, during a statement, for its client gone
#: (``cancel_for_dead_clients``).
CLIENT_CHECK_INTERVAL = "250ms"


def cancel_for_dead_clients() -> None:
    """From now on, every connection this process opens to PostgreSQL 14 or later has the
    server cancel its statement once the process that sent it is gone
    (``client_connection_check_interval``), rather than run it to its end.

    A statement sent outside a transaction commits when it ends, whoever is left to hear the
    reply. A worker SIGKILLed while its start mark waited on a lock (a migration's, another
    session's) had the mark land after its death: the job, never run, was then recovered as
    started, its attempt counted, and a Django Task failed with ``WorkerLostError``. Cancelled,
    the mark never lands and the job goes back to the queue uncounted. The server looks every
    ``CLIENT_CHECK_INTERVAL``: a lock let go within that of the death still lets the statement
    end; so does a client whose host died without closing its socket (README, "Workers").
    """
    connection_created.connect(_check_for_dead_client, dispatch_uid="ultimat3_jobs.db.dead-client")


def _check_for_dead_client(sender: Any, connection: Any, **kwargs: Any) -> None:
    raw = connection.connection
    if connection.vendor != "postgresql" or raw.info.server_version < 140000:
        return
    if raw.autocommit:  # Else it would be a setting of the first transaction alone.
        # On the driver's connection: no statement of the app's, in no log of Django's. A
        # server that refuses it leaves the connection as it was.
        with contextlib.suppress(psycopg.Error):
            raw.execute(f"SET client_connection_check_interval = '{CLIENT_CHECK_INTERVAL}'")


def database_now(using: str = "default") -> datetime:
    """The database server's clock, the one leases and skew are judged by."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT clock_timestamp()")
            row = cursor.fetchone()
            assert row is not None
            return row[0]
        cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
        row = cursor.fetchone()
    assert row is not None
    return datetime.fromisoformat(row[0]).replace(tzinfo=UTC)


def dumps(value: Any) -> str:
    """JSON text for a jsonb column or parameter; instants as ISO 8601.

    orjson encodes a round's inputs several times faster than ``json``; the text only has to be
    valid JSON (PostgreSQL re-reads it), so the two need not agree byte for byte. orjson
    refuses integers beyond 64 bits, which ``json`` takes.
    """
    return _json_bytes(value).decode()


def _json_bytes(value: Any) -> bytes:
    """``dumps``, as UTF-8."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, default=_json_default).encode()


#: The version of PostgreSQL's binary jsonb, the byte before its JSON text.
_JSONB_VERSION = b"\x01"


def jsonb_field(value: Any) -> bytes:
    """A jsonb field of a binary COPY row (``copy_rows``): ``value`` as ``dumps`` encodes it,
    or JSON text already, after the format's version byte."""
    return _JSONB_VERSION + (value.encode() if isinstance(value, str) else _json_bytes(value))


def _json_default(value: Any) -> Any:
    if isinstance(value, orjson.Fragment):
        # A job's input kept as its JSON text (``PlannedJob.row_input``).
        return json.loads(orjson.dumps(value))
    return datetime.isoformat(value)


def json_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as the one JSON parameter of a bulk statement (``jsonb_to_recordset``).

    Instants are the one non-JSON type in them; PostgreSQL reads ISO 8601 as timestamptz.
    """
    return dumps(rows)


def _each_once(convert: Callable[[K], V]) -> Callable[[K | None], V | None]:
    """``convert``, with None passed through and each distinct value converted only once."""
    seen: dict[K, V] = {}

    def converted(value: K | None) -> V | None:
        if value is None:
            return None
        found = seen.get(value)
        if found is None:
            found = seen[value] = convert(value)
        return found

    return converted


def instant_texts() -> Callable[[datetime | None], str | None]:
    """ISO 8601 text of instants for JSON parameters and log lines, each formatted once: a
    round's rows share a handful of instants (now, each occurrence)."""
    return _each_once(datetime.isoformat)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def instants_from_microseconds() -> Callable[[int | None], datetime | None]:
    """Microseconds since the epoch as the exact aware instant; each value converted once.

    Statements read instants as ``(extract(epoch FROM column) * 1000000)::bigint`` (exact on
    PostgreSQL 14 and later) where rows come by the thousand: an integer loads in C, while
    Django's time zone loader for timestamptz runs in Python for every value.
    """
    return _each_once(lambda us: EPOCH + timedelta(microseconds=us))


def copy_rows(
    using: str, statement: str, rows: Iterable[Sequence[Any]], types: Sequence[str] = ()
) -> None:
    """``COPY ... FROM STDIN`` on Django's connection, in the caller's transaction: in text, or
    in binary given its columns' ``types`` (for a statement that says ``FORMAT BINARY``).

    In binary, PostgreSQL reads no text for instants and numbers, which it otherwise parses
    field by field. Its fields are: aware datetimes for timestamptz, ``jsonb_field``'s bytes
    for jsonb (sent as they are), and integers that fit their column, since psycopg wraps a
    larger one past 32 bits where the text format would have it refused.

    Logged like any other statement while Django records queries (``CaptureQueriesContext``,
    DEBUG), so statement counts and debug tooling see it.
    """
    connection = connections[using]
    start = time.monotonic()
    try:
        with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
            if types:
                copy.set_types([_AS_SENT.get(name, name) for name in types])
            for row in rows:
                copy.write_row(row)
    finally:
        _logged(connection, statement, start)  # A refused COPY too, as Django logs its own.


#: How a binary COPY's field is dumped where it is not as its column's type: a jsonb field
#: comes ready (``jsonb_field``), and the server reads it with jsonb's own binary input.
_AS_SENT = {"jsonb": "bytea"}


def execute_bound(
    using: str, statement: str, params: Sequence[Any] | Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """One statement and its rows (none for one that returns none), its parameters sent apart
    from its text (psycopg's server-side binding), on Django's connection, in the caller's
    transaction.

    Django's cursors bind on the client: a parameter is escaped into the statement's text,
    then copied again as bytes and into the message: for a round's watermarks, megabytes more
    at the round's peak. Prepared as the connection's ``prepare_threshold`` says (Django's
    default: never), which a client-side cursor never is: the worker's statements, planned
    anew at each run, cost PostgreSQL more than they cost to execute. Logged as ``copy_rows``
    logs; Django's ``execute_wrapper`` hooks do not see it.

    A server that does not hold the prepared statements psycopg believes a connection has (a
    transaction-pooling PgBouncer older than 1.21 hands each transaction to any of its
    backends, which keep what other clients prepared) fails the statement: from then on this
    process prepares nothing on that database (``UNPREPARED``), since every connection it
    opens would meet the same. The error is raised as it came; its log line's code,
    ``jobs.prepared-statement-lost`` (``logs.failure_fields``), says what to change.
    """
    connection = connections[using]
    connection.ensure_connection()
    start = time.monotonic()
    prepare = False if using in UNPREPARED else None  # None: as prepare_threshold says.
    try:
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(statement, params, prepare=prepare)
            rows = cursor.fetchall() if cursor.description is not None else []
    except Exception as error:
        if prepared_statement_lost(error):
            UNPREPARED.add(using)
        raise
    _logged(connection, statement, start)
    return rows


#: The database aliases whose server lost a prepared statement (``execute_bound``,
#: ``execute_named``): this process prepares nothing more there, whatever their
#: ``prepare_threshold``.
UNPREPARED: set[str] = set()


class Named:
    """A statement PostgreSQL keeps planned in each session that runs it, under a name its
    text decides (SQL ``PREPARE``), for ``execute_named``: whatever pooler hands a session
    from client to client, a name can only ever stand for this text. ``types``: each
    parameter of ``statement`` (``%(key)s``) and its SQL type, in order."""

    def __init__(self, statement: str, types: Mapping[str, str]) -> None:
        self.statement = statement
        self.keys = tuple(types)
        text = statement
        for number, key in enumerate(types, 1):
            text = text.replace(f"%({key})s", f"${number}")
        signature = ", ".join(types.values())
        digest = hashlib.blake2b(f"{signature}\n{text}".encode(), digest_size=8).hexdigest()
        self.name = f"ultimat3_jobs_{digest}"
        assert "$prepare$" not in text
        # Prepared unless the session holds it already, in one statement (so on one backend,
        # whatever the pooler): a PREPARE of a name the backend holds would fail, and be
        # logged by the server as an error.
        self.prepare = (
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_prepared_statements WHERE name = "
            f"'{self.name}') THEN EXECUTE $prepare$PREPARE {self.name} ({signature}) AS {text}"
            "$prepare$; END IF; END $$"
        )
        casts = ", ".join(f"%s::{kind}" for kind in types.values())
        self.execute = f"EXECUTE {self.name} ({casts})"


def execute_named(using: str, named: Named, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """``named`` in a transaction of its own, and its rows: planned once a session, whatever
    Django's ``prepare_threshold`` option says, its parameters written into the ``EXECUTE``
    (whose text PostgreSQL parses, but never plans). A connection prepares it before its
    first run.

    A session that lost it (a pooler's backend this client never prepared it on) fails the
    ``EXECUTE`` before it runs anything: it is prepared and run again. A second miss at once
    means the pooler moves the client from backend to backend between statements: this
    process then prepares nothing more on that database (``UNPREPARED``) and runs the
    statement as ``execute_bound`` does. Inside a transaction, where a miss would spoil it,
    the statement runs as ``execute_bound`` runs it.
    """
    connection = connections[using]
    connection.ensure_connection()
    session = connection.connection
    if session.info.transaction_status == TransactionStatus.IDLE and using not in UNPREPARED:
        start = time.monotonic()
        args = [params[key] for key in named.keys]
        with _NAMED_LOCK:
            prepared = _NAMED.setdefault(session, set())
        with connection.wrap_database_errors, psycopg.ClientCursor(session) as cursor:
            for _ in range(2):
                if named.name not in prepared:
                    cursor.execute(named.prepare)
                    prepared.add(named.name)
                try:
                    cursor.execute(named.execute, args)
                except psycopg.errors.InvalidSqlStatementName:
                    prepared.discard(named.name)
                    continue
                _logged(connection, named.execute, start)
                return cursor.fetchall()
        UNPREPARED.add(using)
    return execute_bound(using, named.statement, params)


#: The names ``execute_named`` prepared on each connection (a connection is one thread's at a
#: time; the lock guards the mapping).
_NAMED: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = weakref.WeakKeyDictionary()
_NAMED_LOCK = threading.Lock()


#: SQLSTATEs of a prepared statement the server does not hold as the client believes:
#: ``invalid_sql_statement_name`` (gone) and ``duplicate_prepared_statement`` (another
#: client's, on a backend a pooler shares).
PREPARED_STATEMENT_LOST = frozenset({"26000", "42P05"})


def prepared_statement_lost(error: BaseException) -> bool:
    """Whether ``error``, or the psycopg error Django raised it from, says the server does not
    hold this connection's prepared statements as psycopg believes."""
    cause = error if isinstance(error, psycopg.Error) else error.__cause__
    return isinstance(cause, psycopg.Error) and cause.sqlstate in PREPARED_STATEMENT_LOST


def _logged(connection: Any, statement: str, start: float) -> None:
    """Record a statement run past Django's cursor where Django records statements."""
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": " ".join(statement.split()), "time": f"{time.monotonic() - start:.3f}"}
        )


#: Rows ``Ahead`` hands over at a time, and chunks it makes before they are read.
AHEAD_CHUNK = 500
AHEAD_BUFFERED = 20


#: Seconds a reader of ``Ahead`` waits for rows between two calls of its ``on_wait``.
AHEAD_WAIT_CHECK = 0.5

#: The GIL's switch interval while rows are made ahead. At the default 5 ms, the thread making
#: rows held the GIL for up to 5 ms each time the round's thread had a result to read, and a
#: round waited on it; at 0.5 ms it waits far less. It is set back once no rows are being made
#: ahead.
AHEAD_SWITCH_INTERVAL = 0.0005

_switching = threading.Lock()
_making = 0
#: The interval to set back, and the one set (as read back), while any rows are made.
_interval_before: float | None = None
_interval_set = 0.0


def _shorten_switches() -> None:
    """``AHEAD_SWITCH_INTERVAL`` while any ``Ahead`` thread makes rows, unless it is shorter;
    until as many ``_restore_switches``."""
    global _making, _interval_before, _interval_set
    with _switching:
        if _making == 0 and sys.getswitchinterval() > AHEAD_SWITCH_INTERVAL:
            _interval_before = sys.getswitchinterval()
            sys.setswitchinterval(AHEAD_SWITCH_INTERVAL)
            _interval_set = sys.getswitchinterval()
        _making += 1


def _restore_switches() -> None:
    global _making, _interval_before
    with _switching:
        _making -= 1
        if _making == 0 and _interval_before is not None:
            # Set back, unless somebody else set it meanwhile.
            if sys.getswitchinterval() == _interval_set:
                sys.setswitchinterval(_interval_before)
            _interval_before = None


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Ahead(Generic[T]):
    """The rows of ``sources``, made in a thread of their own while the caller waits on SQL.

    Making a round's rows is pure Python (task functions, JSON, text); waiting on PostgreSQL
    (a compare-and-set of every watermark, the server taking a COPY) releases the GIL. Made
    ahead in a thread, the rows are ready when the statement that takes them wants them, and
    the two cores work at once. ``sources`` are made in order, one after the other: the
    caller reads ``rows(0)`` first, then ``rows(1)``. At most ``AHEAD_BUFFERED`` chunks of
    ``AHEAD_CHUNK`` rows wait to be read, so a slow reader holds a bounded number of rows.
    ``chunk`` and ``buffered`` say otherwise for rows that are each a statement's worth. An
    error making them is raised by ``rows()``. ``close()`` stops the thread (within one
    chunk) and waits for it. Rows made by calling task functions may open database
    connections, in that thread: ``closes_connections`` closes them when it ends, and
    ``on_wait`` (``OwnLockWaits.check``) is what the reader does while it waits for them.
    """

    def __init__(
        self,
        *sources: Iterable[T],
        chunk: int = AHEAD_CHUNK,
        buffered: int = AHEAD_BUFFERED,
        closes_connections: bool = False,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        self._chunk, self._closes_connections = chunk, closes_connections
        self._on_wait = on_wait
        self._queues: list[queue.Queue[list[T] | _Failed | None]] = [
            queue.Queue(buffered) for _ in sources
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._make, args=(sources,), name="ultimat3-rows-ahead", daemon=True
        )
        # Shortened before the thread starts: at the default 5 ms, the thread that starts it
        # waits that long for the GIL back before it can send its next statement (the
        # compare-and-set).
        _shorten_switches()
        try:
            self._thread.start()
        except BaseException:
            _restore_switches()
            raise

    def _make(self, sources: Sequence[Iterable[T]]) -> None:
        try:
            self._make_each(sources)
        finally:
            _restore_switches()
            if self._closes_connections:
                connections.close_all()  # This thread's alone: Django's are per thread.

    def _make_each(self, sources: Sequence[Iterable[T]]) -> None:
        for index, source in enumerate(sources):
            chunk: list[T] = []
            try:
                for row in source:
                    chunk.append(row)
                    if len(chunk) == self._chunk:
                        if not self._put(index, chunk):
                            return
                        chunk = []
            except BaseException as error:
                # Every source from this one on fails: a reader never waits for rows to come.
                for later in range(index, len(sources)):
                    self._put(later, _Failed(error))
                return
            if not (self._put(index, chunk) and self._put(index, None)):
                return

    def _put(self, index: int, item: list[T] | _Failed | None) -> bool:
        """Hand ``item`` over once there is room; False once closed."""
        while not self._stop.is_set():
            try:
                self._queues[index].put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def rows(self, index: int) -> Iterator[T]:
        """The rows of source ``index``, as they come; ``on_wait`` is called every
        ``AHEAD_WAIT_CHECK`` seconds the reader waits for them."""
        waiting = self._queues[index]
        while True:
            if self._on_wait is None:
                chunk = waiting.get()
            else:
                try:
                    chunk = waiting.get(timeout=AHEAD_WAIT_CHECK)
                except queue.Empty:
                    self._on_wait()
                    continue
            if chunk is None:
                return
            if isinstance(chunk, _Failed):
                raise chunk.error
            yield from chunk

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# The statement of backend ``waiting`` cancelled if it waits on a lock ``holder`` holds: the
# select list is computed only for a row the WHERE keeps. No row: it was not waiting on it.
_CANCEL_WAITING_ON = """
SELECT pg_cancel_backend(%(waiting)s)
WHERE %(holder)s::integer = ANY(pg_blocking_pids(%(waiting)s::integer))
"""


class OwnLockWaits:
    """Keeps the task functions of a round written while they run (``Ahead``) from waiting
    for good on the round's own locks.

    Those functions run in the thread that makes the round's rows, on that thread's
    connections, outside the round's transaction. One that updates or locks a row the round
    holds (a due task's row, the lease row) waits for the round to commit while the round
    waits for its rows: both wait forever, and no other node can write those tasks meanwhile.
    While the round's thread waits for rows, ``check`` asks PostgreSQL, on a connection of
    its own, whether that thread's statement on the round's database waits on the round's
    connection, and if so cancels it: the function raises, and its occurrence fires next
    round as any whose function failed. A wait on anybody else's lock is left alone. Behind a
    transaction pooler the backend ids a client sees are the pooler's, and nothing is found
    to cancel.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self._lock = threading.Lock()
        self._planner: Any = None
        self._task: str | None = None
        self._cancelled: set[str] = set()

    def started(self) -> None:
        """In the thread that calls the task functions, before the first: its connection to
        the round's database (opened, if ever, by a function) is the one watched."""
        self._planner = connections[self.using]

    def firing(self, task: str) -> None:
        """In that thread: the function of ``task`` is called next. Not while a check runs, so
        a statement the check cancels is always the function's it names."""
        with self._lock:
            self._task = task

    def cancelled(self, task: str) -> bool:
        """In that thread, once the function of ``task`` returned or raised: whether
        ``check`` cancelled a statement of it. Waits for a check under way."""
        with self._lock:
            return task in self._cancelled

    def check(self) -> str | None:
        """In the round's thread: cancel the statement the task functions' thread runs, if it
        waits on the round's connection. The task it was cancelled for, else None; a check
        that cannot reach the database finds nothing."""
        planner = self._planner
        waiting = planner.connection if planner is not None else None
        own = connections[self.using].connection
        if waiting is None or own is None:
            return None
        if waiting.info.transaction_status != TransactionStatus.ACTIVE:
            return None  # No statement under way: the function waits on something else.
        with self._lock:
            params = {"waiting": waiting.info.backend_pid, "holder": own.info.backend_pid}
            try:
                with dedicated_connection(self.using, "ultimat3_jobs round lock check") as conn:
                    found = conn.execute(_CANCEL_WAITING_ON, params).fetchall()
            except psycopg.Error:
                return None
            if not found or self._task is None:
                return None
            self._cancelled.add(self._task)
            return self._task
