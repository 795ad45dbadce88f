"""The import graph of the project, read with ``ast`` (no module is imported): issue 14's import rules.

- **No import cycle at module level** anywhere: imports inside a function (or
  under ``if TYPE_CHECKING:``) run later or never, so they are left out; a
  cycle among the rest makes the result depend on which module is imported first.
- **Services and tasks** (HackSoft's styleguide, shape14.md): a package's
  ``tasks`` imports its ``services`` only inside the task function, and its
  ``services`` import ``tasks`` only at module level, a Celery task under a
  ``*_task`` name (``from .tasks import drain as drain_task``) — so the two
  never form a circle.
- **Selectors never import their own package's services** (reads only), at
  any level.

An edge goes to the module named: ``from pkg import sub`` is an edge to
``pkg.sub`` when that is a module, else to ``pkg``; the parent packages an
import also runs (their ``__init__``) are not edges of their own.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("botmesh_admin", "inbox", "crm", "campaigns", "hub", "deployments")
"""The project's top-level packages: the kernel (``botmesh_admin``, with its sub-packages) and the five apps."""


@dataclass(frozen=True)
class Import:
    """One import statement's target in ``source`` (dotted module names) at ``line``."""

    source: str
    target: str
    line: int
    module_level: bool
    names: tuple[tuple[str, str], ...] = ()
    """``(name, bound as)`` of a ``from … import`` whose target is the module they come from."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Return ``{dotted name: path}`` of every module of the project's packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts and path.name != "__init__.py":
                continue  # Django imports migrations itself, none imports another module's migration
            found[_module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(source: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = source.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _imports_of(name: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    known = modules()
    is_package = path.name == "__init__.py"
    out: list[Import] = []

    def visit(nodes: list[ast.stmt], module_level: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    out.append(Import(name, alias.name, node.lineno, module_level))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                plain: list[tuple[str, str]] = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:
                        out.append(Import(name, sub, node.lineno, module_level))
                    else:
                        plain.append((alias.name, alias.asname or alias.name))
                if plain or not node.names:
                    out.append(Import(name, base, node.lineno, module_level, tuple(plain)))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(node.body, False)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse, module_level)  # the TYPE_CHECKING branch never runs
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit([c for c in children if isinstance(c, ast.stmt)], module_level)
                        for child in children:
                            if isinstance(child, ast.ExceptHandler | ast.match_case):
                                visit(child.body, module_level)

    visit(tree.body, True)
    return [i for i in out if i.target in known]


@cache
def imports() -> list[Import]:
    """Return every import of one project module by another."""
    return [imp for name, path in modules().items() for imp in _imports_of(name, path)]


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of ``graph`` with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """Return one cycle through ``component``'s first module (a shortest one), for the message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    return component  # pragma: no cover - a component always has a cycle


def _where(source: str, target: str) -> str:
    lines = sorted({i.line for i in imports() if i.source == source and i.target == target and i.module_level})
    return f"{source} (line {', '.join(map(str, lines))}) → {target}"


def _packages_with(child: str) -> list[str]:
    """Return the packages that have a ``<child>`` module or sub-package (``services``, ``selectors``)."""
    return sorted({name.rsplit(".", 1)[0] for name in modules() if name.rsplit(".", 1)[-1] == child})


def _in(module: str, package: str, child: str) -> bool:
    return module == f"{package}.{child}" or module.startswith(f"{package}.{child}.")


def _celery_tasks(module: str) -> set[str]:
    """Return the names of the functions ``module`` decorates as Celery tasks (``@shared_task``, ``@app.task``)."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                label = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if label in ("shared_task", "task"):
                    names.add(node.name)
    return names


# -- the tests -----------------------------------------------------------------------------------------


def test_the_graph_sees_the_project() -> None:
    """The walk finds the packages and their imports (a broken walk would pass every rule below)."""
    names = modules()
    assert {"botmesh_admin.events.services", "botmesh_admin.events.tasks", "inbox.selectors"} <= set(names)
    assert any(
        i.source == "botmesh_admin.events.services" and i.target == "botmesh_admin.events.base" for i in imports()
    )
    assert _sccs({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_at_module_level() -> None:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for imp in imports():
        if imp.module_level and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    cycles = []
    for component in _sccs(graph):
        cycle = _cycle_in(component, graph)
        steps = "; ".join(_where(a, b) for a, b in zip(cycle, cycle[1:], strict=False))
        cycles.append(f"{len(component)} modules, e.g. {steps}")
    assert cycles == [], "module-level import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("package", _packages_with("tasks"))
def test_tasks_import_services_only_inside_the_task_function(package: str) -> None:
    wrong = [
        f"{i.source} line {i.line} imports {i.target} at module level"
        for i in imports()
        if i.source == f"{package}.tasks" and i.module_level and _in(i.target, package, "services")
    ]
    assert wrong == [], "tasks must import services inside the function (HackSoft):\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", [p for p in _packages_with("services") if f"{p}.tasks" in modules()])
def test_services_import_tasks_at_module_level_as_star_task(package: str) -> None:
    tasks = f"{package}.tasks"
    celery_tasks = _celery_tasks(tasks)
    wrong = []
    for i in imports():
        if not (_in(i.source, package, "services") and i.target == tasks):
            continue
        if not i.module_level:
            wrong.append(f"{i.source} line {i.line} imports {tasks} inside a function (import it at module level)")
        for name, bound in i.names:
            if name in celery_tasks and not bound.endswith("_task"):
                wrong.append(f"{i.source} line {i.line}: import the task {name} as {name}_task")
    assert wrong == [], "services import tasks at module level, tasks as *_task:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", _packages_with("selectors"))
def test_selectors_never_import_their_own_services(package: str) -> None:
    wrong = [
        f"{i.source} line {i.line} imports {i.target}"
        for i in imports()
        if _in(i.source, package, "selectors") and _in(i.target, package, "services")
    ]
    assert wrong == [], "selectors are reads only and never import their own services:\n" + "\n".join(wrong)
