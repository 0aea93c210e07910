"""The package's layout, read from its source with ``ast``: no import cycle, no shadowed names."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ultimat3_jobs"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: module level, outside TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)
    return found


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import a module can run, inside functions too; only TYPE_CHECKING ones are free."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))
    return found


def _edges(
    name: str, path: Path, modules: dict[str, Path], *, function_local: bool = False
) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in _all_imports(tree) if function_local else _import_time_imports(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        targets.add(base)
        # ``from . import clock`` imports the module ``clock``, not only the package.
        targets.update(f"{base}.{alias.name}" for alias in node.names)
    return {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str], done: set[str]) -> None:
        if node in trail:
            cycles.append([*trail[trail.index(node) :], node])
            return
        if node in done:
            return
        for target in sorted(graph[node]):
            visit(target, [*trail, node], done)
        done.add(node)

    done: set[str] = set()
    for name in sorted(graph):
        visit(name, [], done)
    return cycles


def test_layout__no_import_cycle_between_modules_at_import_time() -> None:
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_layout__no_import_cycle_counting_imports_inside_functions() -> None:
    # A function-local import dodges a cycle at import time; it is a cycle all the same.
    modules = _modules()
    graph = {
        name: _edges(name, path, modules, function_local=True) for name, path in modules.items()
    }
    assert _cycles(graph) == []


#: Each module's layer, lowest first (a package's modules take the package's layer). A module
#: imports its own layer and those below it, never one above, not even inside a function.
LAYERS: dict[str, set[str]] = {
    "leaves": {
        "catchup", "clock", "collector", "conf", "cron", "db", "errors", "humanize", "inputs",
        "instruments", "logs", "models", "monitors", "retries", "shutdown", "tasks_compat",
        "tracing", "zones",
    },
    "declarations": {"declarations", "handles", "registry"},
    "store": {"history", "listener", "nodes", "store"},
    "roles": {
        "attempts", "backends", "backfill", "celery", "celery_beat", "checkins", "engines",
        "leaders", "lifecycle", "manual", "outbox", "planner", "pool", "relay", "retention",
        "scheduler", "state", "worker",
    },
    "surfaces": {
        "admin", "apps", "checks", "health", "health_checks", "management", "metrics",
        "overview", "relay_checks", "status", "tasks", "testing",
    },
}  # fmt: skip
#: ``from ultimat3_jobs import job, task``: the public facade sits outside the layers.
FACADE = "ultimat3_jobs"


def _layer(module: str) -> int:
    top = module.removeprefix(FACADE + ".").split(".")[0]
    for rank, members in enumerate(LAYERS.values()):
        if top in members:
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def test_layout__every_module_is_in_a_layer() -> None:
    unplaced = []
    for name in _modules():
        try:
            name == FACADE or _layer(name)
        except AssertionError:
            unplaced.append(name)
    assert unplaced == []


def test_layout__every_import_goes_down_the_layers_even_inside_a_function() -> None:
    modules = _modules()
    names = list(LAYERS)
    upward = sorted(
        f"{source} ({names[_layer(source)]}) imports {target} ({names[_layer(target)]})"
        for source, path in modules.items()
        if source != FACADE
        for target in _edges(source, path, modules, function_local=True)
        if target != FACADE and _layer(target) > _layer(source)
    )
    assert upward == []


def test_layout__the_layer_check_sees_a_back_edge() -> None:
    # Guards the check itself: a declaration importing the store would be an upward edge.
    assert _layer("ultimat3_jobs.handles") < _layer("ultimat3_jobs.store.postgres")
    assert _layer("ultimat3_jobs.store") < _layer("ultimat3_jobs.worker")
    assert _layer("ultimat3_jobs.worker") < _layer("ultimat3_jobs.admin.jobs")


def test_layout__the_graph_reader_sees_a_known_edge() -> None:
    # Guards the reader itself: the worker imports the job store at import time.
    modules = _modules()
    assert "ultimat3_jobs.store" in _edges(
        "ultimat3_jobs.worker", modules["ultimat3_jobs.worker"], modules
    )


def test_layout__the_graph_reader_sees_an_import_inside_a_function() -> None:
    # Guards the reader too: the backend imports the job store only when it enqueues.
    modules = _modules()
    backends = "ultimat3_jobs.backends"
    assert "ultimat3_jobs.store" not in _edges(backends, modules[backends], modules)
    assert "ultimat3_jobs.store" in _edges(
        backends, modules[backends], modules, function_local=True
    )


def test_layout__no_module_is_named_after_a_standard_library_module() -> None:
    clashes = sorted(
        name for name in _modules() if name.rpartition(".")[2] in sys.stdlib_module_names
    )
    assert clashes == []


#: What writes or deletes rows through a queryset or a manager.
_WRITES = {
    *("create", "bulk_create", "get_or_create", "update_or_create"),
    *("update", "bulk_update", "delete"),
}
#: A statement that writes the job table, as the package spells it.
_JOB_TABLE_SQL = re.compile(
    r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|COPY)\s+(\{_JOB\}|ultimat3_jobs_job)"
)


def _reaches_job_manager(node: ast.expr) -> bool:
    """Whether a call's receiver is ``Job.objects`` (``.using()``, ``.filter()``... after)."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            if node.attr == "objects" and isinstance(node.value, ast.Name):
                return node.value.id == "Job"
            node = node.value
        else:
            return False


def test_layout__only_the_store_writes_or_deletes_job_rows() -> None:
    found = []
    for name, path in _modules().items():
        if name == "ultimat3_jobs.store" or name.startswith("ultimat3_jobs.store."):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _WRITES
                and _reaches_job_manager(node.func.value)
            ):
                found.append(f"{name}:{node.lineno}")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _JOB_TABLE_SQL.search(node.value)
            ):
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_layout__the_job_row_reader_sees_a_known_write() -> None:
    # Guards the reader itself: the store's ORM path updates rows through Job.objects.
    call = ast.parse("Job.objects.using(u).filter(pk=1).update(status='x')").body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    assert isinstance(call.value.func, ast.Attribute)
    assert _reaches_job_manager(call.value.func.value)
    assert _JOB_TABLE_SQL.search("UPDATE {_JOB} AS job SET")
