"""How one outbox row reaches its engine: Celery's ``apply_async`` or a Django Tasks backend's
``enqueue()``, and which of their errors mean the engine is down rather than that it refused
the row.

A Celery task goes through the current app's ``apply_async`` with a task id derived from the job
key, so every send of one row carries the same id; a Django Task goes through its backend's
``enqueue()``. Only a connection or transport error (``broker_down``) is an outage, which the
relay's loop backs off from; any other error is this row's own (``RelayRefusedError``), and an
unknown task is a ``RelayTargetError``. The relay's loop (``relay.py``) decides what each means
for the row.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any

from . import tracing
from .errors import BrokerUnavailableError, RelayRefusedError, RelayTargetError
from .models import Job
from .outbox import CELERY, CELERY_ONCE, TASKS

#: Celery task ids are uuid5 of the job key in this namespace: one row, one id, every send.
TASK_ID_NAMESPACE = uuid.UUID("6f1c1f0e-8d0b-4b52-9a53-5f3b0f6c2a11")

#: The connection and timeout errors of the clients an engine talks through, by module: only
#: a library already imported can have raised one. ``OSError`` covers the standard library's
#: (``ConnectionError``, ``TimeoutError``, socket errors).
CLIENT_CONNECTION_ERRORS = {
    # kombu wraps a transport's connection errors in this (``retry=False`` publishes too).
    "kombu.exceptions": ("OperationalError",),
    "redis.exceptions": ("ConnectionError", "TimeoutError", "BusyLoadingError"),
    "amqp.exceptions": ("ConnectionError",),
    # A Tasks backend that keeps its queue in a database of its own.
    "django.db": ("OperationalError", "InterfaceError"),
}
#: Errors a broken message raises: never a transport's, whatever a transport lists (kombu's
#: Redis transport counts a ``KeyError`` as a connection error, for its consumer's poller).
MESSAGE_ERRORS = (KeyError, TypeError, ValueError)
#: Seconds a publish to a Redis broker waits on its socket (to connect, then for each reply)
#: unless ``CELERY_BROKER_TRANSPORT_OPTIONS`` sets ``socket_timeout``/``socket_connect_timeout``.
#: kombu waits for ever by default: a broker that hangs (a paused host, a network that drops
#: packets) held the relay, its batch's row locks and its drain until it woke.
PUBLISH_SOCKET_TIMEOUT = 5.0
#: The Celery apps whose publishing this process bounded (``_bound_publishing``), by id.
_BOUNDED_APPS: set[int] = set()


def celery_task_id(key: str) -> str:
    """The Celery task id of the job with ``key``: stable, so a resend is the same task."""
    return str(uuid.uuid5(TASK_ID_NAMESPACE, key))


@dataclass(frozen=True)
class Sent:
    """What the engine said when it took a row: its id, and an outcome if it ran it already."""

    engine_id: str
    done: bool = False
    ok: bool = True
    return_value: Any = None
    error: str = ""


def resolve_celery_task(name: str) -> Any:
    """The registered Celery task ``name`` of the current app, or ``RelayTargetError``."""
    from celery import current_app

    app = current_app._get_current_object()
    tasks = app.tasks  # Finalises the app: every @shared_task is bound to it now.
    if name not in tasks:
        app.loader.import_default_modules()  # The app's autodiscovered task modules.
    try:
        return tasks[name]
    except KeyError:
        raise RelayTargetError(
            f'Celery task "{name}" is not registered in the relay\'s Celery app "{app.main}"',
            fix="import the module that declares it in the relay process too (an installed "
            "app's tasks.py is; check CELERY settings and that run_relay runs the same code)",
            cause=name,
        ) from None


def broker_down(error: BaseException, transport: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``error`` says the engine's service cannot be reached (every row waits for it),
    rather than that the engine refused this one row.

    A connection or timeout error of a client library in use, or one of ``transport`` (what the
    Celery app's transport lists), raised as such or as the cause of a wrapper's error.
    """
    known: list[type[BaseException]] = [OSError, *transport]
    for module, names in CLIENT_CONNECTION_ERRORS.items():
        found = sys.modules.get(module)
        known.extend(getattr(found, name) for name in names if hasattr(found, name))
    errors = tuple(
        kind for kind in known if not any(issubclass(bad, kind) for bad in MESSAGE_ERRORS)
    )
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, errors):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def _bound_publishing(app: Any) -> None:
    """Give a Redis broker's connections of ``app`` in this process a socket timeout, unless
    the project set one: a hung broker is then a ``TimeoutError``, a broker down like any."""
    if id(app) in _BOUNDED_APPS:
        return
    _BOUNDED_APPS.add(id(app))
    try:
        redis = app.connection_for_write().transport.driver_type == "redis"
    except Exception:
        return  # A transport kombu cannot load fails the publish, which says so.
    if not redis:
        return
    options = dict(app.conf.broker_transport_options or {})
    for name in ("socket_timeout", "socket_connect_timeout"):
        options.setdefault(name, PUBLISH_SOCKET_TIMEOUT)
    app.conf.broker_transport_options = options
    app._pool = None  # Connections made before this (none in a relay) keep no timeout.
    app.amqp._producer_pool = None


def _transport_errors(task: Any) -> tuple[type[BaseException], ...]:
    """The connection and channel errors the transport of ``task``'s app lists."""
    try:
        connection = task.app.connection_for_write()
        return (*connection.connection_errors, *connection.channel_errors)
    except Exception:
        return ()  # Unknown transport: the generic client errors still count.


def _refusal_fix(error: BaseException, *, what: str) -> str:
    """What to change when the engine refused a row, by what it raised."""
    retry = "then retry the row from the admin (Retry failed)"
    if isinstance(error, TypeError):
        return (
            f"make the entry's input fit the arguments of {what} as deployed where the relay "
            f"runs (a keyword renamed or removed?), {retry}"
        )
    if type(error).__name__ in ("EncodeError", "SerializationError"):
        return f"pass input that {what}'s serializer can encode (JSON values), {retry}"
    if type(error).__name__ in ("InvalidTask", "InvalidTaskError"):
        return f"declare {what} so its backend can run it (options, arguments), {retry}"
    return (
        f"fix what the error names in the declaration or options of {what} (time limits, "
        f"routing, serializer, arguments), {retry}"
    )


def send_celery(job: Job, using: str) -> Sent:
    """Publish ``job`` through the current app's task of its name, routed where Celery routes
    that task."""
    try:
        from .celery import DATABASE_HEADER, JOB_HEADER, KEY_HEADER
    except ImportError as error:
        raise RelayTargetError(
            f'job {job.pk} is the Celery task "{job.name}", and Celery is not installed here',
            fix="install the celery extra (pip install ultimat3-jobs[celery]) where run_relay runs",
            cause=error,
        ) from error
    task = resolve_celery_task(job.name)
    _bound_publishing(task.app)
    task_id = celery_task_id(job.key)
    try:
        task.apply_async(
            kwargs=dict(job.input or {}),
            task_id=task_id,
            headers={
                JOB_HEADER: job.pk,
                DATABASE_HEADER: using,
                KEY_HEADER: job.key,
                **tracing.message_headers(job.trace_context),
            },
            # Our own backoff retries a broker that is down; Celery's would hold the batch.
            retry=False,
        )
    except Exception as error:
        if broker_down(error, _transport_errors(task)):
            raise BrokerUnavailableError(
                f'the Celery broker cannot take task "{job.name}": {type(error).__name__}: {error}',
                fix="check CELERY_BROKER_URL and that the broker runs; the relay keeps the row "
                "and sends it once the broker is back",
                cause=error,
            ) from error
        raise RelayRefusedError(
            f'Celery refused task "{job.name}" for job {job.pk}: {type(error).__name__}: {error}',
            fix=_refusal_fix(error, what=f'the Celery task "{job.name}"'),
            cause=error,
        ) from error
    return Sent(task_id)


def send_django_task(job: Job) -> Sent:
    """Enqueue ``job`` through its Django Task's backend (the row's ``backend`` alias)."""
    from . import tasks_compat

    if not tasks_compat.AVAILABLE:
        # A relay with the celery extra alone, fed by a scheduler that has both.
        raise RelayTargetError(
            f'job {job.pk} is the Django Task "{job.name}", and Django Tasks is not installed '
            "here (Django 6's django.tasks, or the django-tasks package)",
            fix="install the tasks extra (pip install ultimat3-jobs[tasks]) where run_relay runs",
            cause=job.name,
        )
    from .backends import load_task
    from .tasks_compat import TaskResultStatus

    try:
        task = load_task(job.name)
        if task.backend != job.backend:
            task = task.using(backend=job.backend)
    except Exception as error:
        raise RelayTargetError(
            f'Django Task "{job.name}" on backend "{job.backend}" cannot be loaded: {error}',
            fix="deploy the code that declares it to the relay, and keep the alias in TASKS",
            cause=error,
        ) from error
    try:
        result = task.enqueue(*(job.args or []), **(job.input or {}))
    except Exception as error:
        if broker_down(error):
            raise BrokerUnavailableError(
                f'backend "{job.backend}" cannot take Django Task "{job.name}": '
                f"{type(error).__name__}: {error}",
                fix=f'check TASKS["{job.backend}"] and the service behind it; the relay keeps '
                "the row and sends it once the backend takes it",
                cause=error,
            ) from error
        raise RelayRefusedError(
            f'backend "{job.backend}" refused Django Task "{job.name}" for job {job.pk}: '
            f"{type(error).__name__}: {error}",
            fix=_refusal_fix(error, what=f'the Django Task "{job.name}"'),
            cause=error,
        ) from error
    # A backend that runs the task inline (ImmediateBackend) is done with it already.
    if result.status == TaskResultStatus.SUCCESSFUL:
        return Sent(str(result.id), done=True, return_value=result_value(result))
    if result.status == TaskResultStatus.FAILED:
        errors = getattr(result, "errors", None) or []
        text = errors[-1].traceback if errors else "failed"
        return Sent(str(result.id), done=True, ok=False, error=text)
    return Sent(str(result.id))


def result_value(result: Any) -> Any:
    """A finished Django Task's return value as its backend gives it (None if it will not:
    what the row keeps of it is the store's to decide)."""
    try:
        return result.return_value
    except Exception:
        return None


def send(job: Job, using: str) -> Sent:
    """Hand one outbox row to its engine."""
    if job.relay in (CELERY, CELERY_ONCE):
        # In the job's trace: Celery's publish span, when its instrumentation is on, is a
        # child of the occurrence's span.
        with tracing.continued(job.trace_context):
            return send_celery(job, using)
    if job.relay == TASKS:
        return send_django_task(job)
    raise RelayTargetError(
        f'job {job.pk} names relay "{job.relay}", which this version does not know',
        fix="run the relay of the version that wrote the row",
        cause=job.relay,
    )


__all__ = [
    "Sent",
    "broker_down",
    "celery_task_id",
    "result_value",
    "send",
    "send_celery",
    "send_django_task",
]
