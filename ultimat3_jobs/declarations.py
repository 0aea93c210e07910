"""``@job`` and ``@task``: every problem with a declaration raises here, at import, with a fix.

The decorators check what the tables and the scheduler will need (names, limits, the zone, the
cron, the policies, a key template against the function's signature), build the handle and
register it under its name.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, overload

from .cron import DstGap, DstRepeat, check_dst_options, parse
from .errors import (
    InvalidCatchUpError,
    InvalidDeclarationError,
    InvalidJobKeyError,
    InvalidOverlapError,
)
from .handles import (
    CATCH_UP_POLICIES,
    OVERLAP_POLICIES,
    CatchUp,
    Entry,
    JobHandle,
    JobKey,
    Overlap,
    TaskHandle,
)
from .inputs import (
    CRON_LIMIT,
    INT_LIMIT,
    KEY_LIMIT,
    NAME_LIMIT,
    check_count,
    check_queue,
    check_text,
    check_timeout,
)
from .monitors import Monitor, check_monitor
from .registry import registry
from .zones import resolve_zone


def _default_name(func: Callable[..., Any]) -> str:
    """``<app_label>.<function>``: the app that holds the module, else its parent package."""
    module = func.__module__
    try:
        from django.apps import apps

        config = apps.get_containing_app_config(module)
    except Exception:  # Django not set up: a script or a pure unit test.
        config = None
    if config is not None:
        return f"{config.label}.{func.__name__}"
    parts = module.split(".")
    label = parts[-2] if len(parts) > 1 else parts[0]
    return f"{label}.{func.__name__}"


def _check_key_declaration(key: object, func: Callable[..., Any], job_name: str) -> None:
    """A ``key=`` that can never build a key is refused at import, not at the first enqueue."""
    if key is None or callable(key):
        return
    if not isinstance(key, str):
        raise InvalidJobKeyError(
            f'job "{job_name}" has key={key!r}: neither a template nor a callable',
            fix=f"pass a template over the arguments of {job_name}(), "
            f'e.g. key="{job_name}:{{day}}", or a callable of the input',
            cause=key,
        )
    params = inspect.signature(func).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    accepted = ", ".join(named) or "none"

    def refuse(problem: str) -> InvalidJobKeyError:
        return InvalidJobKeyError(
            f'key template "{key}" of job "{job_name}" {problem}',
            fix=f"name only arguments of {job_name}() in braces ({accepted}), e.g. "
            f'key="{job_name}:{{{named[0] if named else "day"}}}"; double a literal brace: {{{{',
            cause=key,
        )

    templates = [key]
    while templates:
        try:
            fields = list(string.Formatter().parse(templates.pop()))
        except ValueError as error:
            raise refuse(f"does not parse: {error}") from error
        for _, field, spec, conversion in fields:
            if field is None:
                continue
            head = field.split(".", 1)[0].split("[", 1)[0]
            if not head or head.isdigit():
                raise refuse(f'has a positional field "{{{field}}}"')
            if head not in named and not takes_any:
                raise refuse(f'names "{head}", which {job_name}() does not take')
            if conversion not in (None, "r", "s", "a"):
                raise refuse(f'has the conversion "!{conversion}" (only !r, !s, !a exist)')
            if spec:
                templates.append(spec)  # Nested fields, e.g. "{n:{width}}".
    literal = "".join(text for text, *_ in string.Formatter().parse(key))
    if len(literal) > KEY_LIMIT:
        raise refuse(f"is over {KEY_LIMIT} characters before any field is filled in")


def _check_name(name: object, kind: str) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip() or ":" in name):
        raise InvalidDeclarationError(
            f"{kind} name {name!r} is not a usable name",
            fix=f'name the {kind} with a non-empty string without ":", e.g. "billing.nightly"',
            cause=name,
        )
    if name is not None:
        check_text(name, f"{kind} name", NAME_LIMIT)


@overload
def job(func: Callable[..., Any], /) -> JobHandle: ...
@overload
def job(
    *,
    name: str | None = None,
    key: JobKey = None,
    max_attempts: int | None = None,
    queue: str | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], JobHandle]: ...
def job(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    key: JobKey = None,
    max_attempts: int | None = None,
    queue: str | None = None,
    timeout: float | None = None,
) -> JobHandle | Callable[[Callable[..., Any]], JobHandle]:
    """Declare a job: ``@job`` or ``@job(name=..., key=..., max_attempts=..., queue=...,
    timeout=...)``.

    ``key`` makes enqueues idempotent: a format string over the input (``"digest:{day}"``) or
    a callable of the input. ``max_attempts`` and ``queue`` default to the settings.
    ``timeout``: seconds an attempt may run before the worker ends it ``jobs.job.timeout``
    and moves on (default: the ``JOB_TIMEOUT`` setting; None there is no limit).
    """
    _check_name(name, "job")
    attempts_problem = None
    if max_attempts is not None:
        attempts_problem = check_count(max_attempts, "max_attempts", "@job")
    if attempts_problem is not None:
        raise InvalidDeclarationError(
            f"{attempts_problem}: it is not a positive integer",
            fix="pass max_attempts=1 or more to @job, e.g. max_attempts=5",
            cause=max_attempts,
        )
    check_queue(queue, "@job")
    seconds = check_timeout(timeout, "@job")

    def decorate(fn: Callable[..., Any]) -> JobHandle:
        if not callable(fn) or isinstance(fn, JobHandle | TaskHandle):
            raise InvalidDeclarationError(
                f"@job cannot wrap {fn!r}",
                fix="put @job directly on a plain function",
                cause=fn,
            )
        job_name = name or _default_name(fn)
        _check_name(job_name, "job")
        _check_key_declaration(key, fn, job_name)
        handle = JobHandle(
            fn, name=job_name, key=key, max_attempts=max_attempts, queue=queue, timeout=seconds
        )
        registry.register(handle)
        return handle

    return decorate(func) if func is not None else decorate


def task(
    cron: str | None = None,
    *,
    tz: str | None = None,
    name: str | None = None,
    catch_up: CatchUp = "skip",
    max_catch_up: int = 10,
    dst_gap: DstGap = "end-of-gap",
    dst_repeat: DstRepeat = "first",
    overlap: Overlap = "allow",
    monitor: Monitor = None,
) -> Callable[[Callable[[datetime], Iterable[Entry]]], TaskHandle]:
    """Declare a task: ``@task(cron="0 3 * * *", tz="Europe/Paris")``.

    The function receives each occurrence (aware, in ``tz``) and returns ``[(job, input), ...]``.
    ``dst_gap`` ("end-of-gap" | "skip") and ``dst_repeat`` ("first" | "both") choose what a
    wall-clock schedule does on DST days (``ultimat3_jobs.cron``). ``overlap="skip"`` records an
    occurrence as skipped, rather than firing it, while a job of an earlier occurrence of the
    task is not done (queued, running, or relayed and not yet reported done). ``monitor`` makes
    the task a Sentry Crons monitor (True, or a dict of Sentry monitor options) or keeps it from
    being one (False); None follows ``SENTRY_CRONS``. Every problem with the declaration raises
    here, at import, with a fix.
    """
    if callable(cron):
        # ``@task`` without its parentheses: the function came in as the cron, and what the
        # module would hold under its name is the decorator, declaring nothing.
        raise InvalidDeclarationError(
            f"@task was put on {getattr(cron, '__qualname__', repr(cron))} without its arguments",
            fix='declare it with its schedule: @task(cron="0 3 * * *", tz="Europe/Paris")',
            cause=cron,
        )
    _check_name(name, "task")

    def decorate(fn: Callable[[datetime], Iterable[Entry]]) -> TaskHandle:
        if not callable(fn) or isinstance(fn, JobHandle | TaskHandle):
            raise InvalidDeclarationError(
                f"@task cannot wrap {fn!r}",
                fix="put @task directly on a plain function of the occurrence",
                cause=fn,
            )
        task_name = name or _default_name(fn)
        _check_name(task_name, "task")
        zone = resolve_zone(tz, task_name)
        schedule = parse(cron)  # type: ignore[arg-type]
        if len(schedule.expr) > CRON_LIMIT:
            raise InvalidDeclarationError(
                f'task "{task_name}" has a cron of {len(schedule.expr)} characters, over the '
                f"{CRON_LIMIT} the task table holds",
                fix="shorten the cron: ranges (1-5) and steps (*/15) rather than long lists",
                cause=schedule.expr,
            )
        if catch_up not in CATCH_UP_POLICIES:
            raise InvalidCatchUpError(
                f'task "{task_name}" has catch_up={catch_up!r}',
                fix='use catch_up="skip" (default), "run-once" or "run-all"',
                cause=catch_up,
            )
        if check_count(max_catch_up, "max_catch_up", f'task "{task_name}"') is not None:
            raise InvalidCatchUpError(
                f'task "{task_name}" has max_catch_up={max_catch_up!r}',
                fix=f"use a whole number from 1 to {INT_LIMIT}, e.g. max_catch_up=10",
                cause=max_catch_up,
            )
        gap, repeat = check_dst_options(dst_gap, dst_repeat, f'task "{task_name}"')
        if overlap not in OVERLAP_POLICIES:
            raise InvalidOverlapError(
                f'task "{task_name}" has overlap={overlap!r}',
                fix='use overlap="allow" (default: occurrences may run side by side) or '
                '"skip" (skip an occurrence while a job of an earlier one is not done)',
                cause=overlap,
            )
        monitor_option = check_monitor(monitor, schedule, f'task "{task_name}"')
        handle = TaskHandle(
            fn,
            name=task_name,
            schedule=schedule,
            zone=zone,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
            dst_gap=gap,
            dst_repeat=repeat,
            overlap=overlap,
            monitor=monitor_option,
        )
        registry.register(handle)
        return handle

    return decorate
