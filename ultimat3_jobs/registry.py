"""The registry: names to the handles ``@job`` and ``@task`` declared, and the naming rules.

A name is what a task's watermark and a job's keys hang on, so the rules here keep it
unambiguous: a different declaration never takes a name that is taken, one declaration never
takes two, and a module imported twice keeps the names it had.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import JobNameTakenError

if TYPE_CHECKING:
    from .handles import JobHandle, TaskHandle


def _site(func: Callable[..., Any]) -> tuple[str, int, str]:
    """Where a function was declared. A module imported twice declares the same site twice."""
    code = getattr(func, "__code__", None)
    if code is None:
        return (getattr(func, "__module__", "?"), 0, getattr(func, "__qualname__", repr(func)))
    return (code.co_filename, code.co_firstlineno, func.__qualname__)


class Registry:
    """Names to handles, with the naming rules that keep watermarks and keys unambiguous.

    A declaration is known by its site (file, line, qualified name) and the module instance
    that ran it: the same site from ANOTHER instance is a module imported twice and must keep
    its names; from the SAME instance it is a factory (a loop declaring one task per region)
    and each function may take a name of its own. One function object keeps one name.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_kind: dict[str, dict[str, Any]] = {"task": {}, "job": {}}
        #: kind -> site -> id of the module instance's globals -> names declared there; a site
        #: with one declaration holds (module, name) instead: most sites declare one name, and
        #: a dict and a set for each held a large ``tasks.py`` in memory many times over.
        self._sites: dict[str, dict[Site, SiteNames]] = {"task": {}, "job": {}}
        #: kind -> a registered function -> its name (the handle holds the function anyway).
        self._names: dict[str, dict[Callable[..., Any], str]] = {"task": {}, "job": {}}
        #: Bumped on every change, so a scheduler can cache its view of the tasks.
        self.version = 0

    def register(self, handle: TaskHandle | JobHandle) -> None:
        kind, name, func = handle.kind, handle.name, handle.func
        site, module = _site(func), _module_of(func)
        with self._lock:
            seated = self._by_kind[kind].get(name)
            if seated is not None and seated.func is not func:
                reimport = _site(seated.func) == site and _module_of(seated.func) != module
                # A DIFFERENT declaration under a taken name would silently take over the
                # watermark; only a module imported twice may declare a name again.
                if not reimport:
                    raise JobNameTakenError(
                        f'{kind} name "{name}" is already taken by {seated.func.__module__}.'
                        f"{seated.func.__qualname__}",
                        fix=f'give one of them another name with @{kind}(name="...")',
                        cause=name,
                    )
            # One declaration under two names would move the key the scheduler dedupes on.
            other = self._names[kind].get(func)
            elsewhere = [
                names
                for seen, names in _by_module(self._sites[kind].get(site)).items()
                if seen != module
            ]
            if other is None and elsewhere and not any(name in names for names in elsewhere):
                other = sorted(elsewhere[0])[0]  # The same site imported as another module.
            if other is not None and other != name:
                raise JobNameTakenError(
                    f'{kind} {func.__qualname__} is already registered as "{other}", not "{name}"',
                    fix=f"declare the {kind} once; to run it under a second name, "
                    "declare a second function",
                    cause=name,
                )
            if seated is not None:
                self._forget(seated)
            self._by_kind[kind][name] = handle
            sites = self._sites[kind]
            declared = sites.get(site)
            if declared is None:
                sites[site] = (module, name)
            elif declared != (module, name):
                modules = sites[site] = _by_module(declared)
                modules.setdefault(module, set()).add(name)
            self._names[kind][func] = name
            self.version += 1

    def _forget(self, handle: TaskHandle | JobHandle) -> None:
        """Drop what ``register`` noted about ``handle`` (the lock is held)."""
        kind, site, module = handle.kind, _site(handle.func), _module_of(handle.func)
        self._names[kind].pop(handle.func, None)
        sites = self._sites[kind]
        declared = sites.get(site)
        if declared == (module, handle.name):
            del sites[site]
        elif isinstance(declared, dict):
            declared.get(module, set()).discard(handle.name)
            if not declared.get(module, True):
                del declared[module]
            if not declared:
                del sites[site]

    def snapshot(self) -> tuple[Any, ...]:
        """Everything registered, for ``restore``: a test's declarations must not leak."""
        with self._lock:
            return (
                {kind: dict(table) for kind, table in self._by_kind.items()},
                _copy_sites(self._sites),
                {kind: dict(table) for kind, table in self._names.items()},
            )

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Go back to a ``snapshot``."""
        with self._lock:
            by_kind, sites, names = saved
            self._by_kind = {kind: dict(table) for kind, table in by_kind.items()}
            self._sites = _copy_sites(sites)
            self._names = {kind: dict(table) for kind, table in names.items()}
            self.version += 1

    def tasks(self) -> list[TaskHandle]:
        with self._lock:
            return sorted(self._by_kind["task"].values(), key=lambda t: t.name)

    def jobs(self) -> list[JobHandle]:
        with self._lock:
            return sorted(self._by_kind["job"].values(), key=lambda j: j.name)

    def get_task(self, name: str) -> TaskHandle | None:
        return self._by_kind["task"].get(name)

    def get_job(self, name: str) -> JobHandle | None:
        return self._by_kind["job"].get(name)

    def unregister(self, handle: TaskHandle | JobHandle) -> None:
        with self._lock:
            if self._by_kind[handle.kind].get(handle.name) is handle:
                del self._by_kind[handle.kind][handle.name]
                self._forget(handle)
                self.version += 1


#: Where a function was declared (``_site``).
Site = tuple[str, int, str]
#: Who declared there: the one (module instance, name), or names by module instance.
SiteNames = tuple[int, str] | dict[int, set[str]]


def _by_module(declared: SiteNames | None) -> dict[int, set[str]]:
    """The names declared at a site by module instance, as a dict of its own for a site of one
    declaration."""
    if declared is None:
        return {}
    if isinstance(declared, tuple):
        return {declared[0]: {declared[1]}}
    return declared


def _copy_sites(sites: dict[str, dict[Site, SiteNames]]) -> dict[str, dict[Site, SiteNames]]:
    return {
        kind: {
            site: declared
            if isinstance(declared, tuple)
            else {m: set(names) for m, names in declared.items()}
            for site, declared in by.items()
        }
        for kind, by in sites.items()
    }


def _module_of(func: Callable[..., Any]) -> int:
    """The module instance a function was declared in: two imports of one file differ."""
    return id(getattr(func, "__globals__", func))


registry = Registry()
