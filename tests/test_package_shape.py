"""The five package apps have the same rooms (issue 14, ARCHITECTURE §3, notes/shape14.md).

A reader who knows one package knows all five: ``domain``, ``stores/{base,memory,kv}``
with ``stores/__init__`` on the kernel ``DefaultStore``, ``services`` (writes),
``selectors`` (reads, never importing the app's services), ``api``, ``views``, and no
other top-level module. The seed's package objects (``Inbox``, ``PluginHub``,
``DeploymentRegistry``, …) are gone: the module-level ``<entity>_<action>`` functions
are the one public surface. The rules are read from the source (``ast``) where they
are about imports and names, and exercised where they are about behaviour.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from botmesh_admin.kv.runtime import DefaultStore

ROOT = Path(__file__).resolve().parent.parent
APPS = ["inbox", "crm", "campaigns", "hub", "deployments"]

REQUIRED_FILES = ["stores/__init__.py", "stores/base.py", "stores/memory.py", "stores/kv.py", "selectors.py", "api.py"]
REQUIRED_FILES += ["views.py", "urls.py", "apps.py"]
EITHER_MODULE_OR_PACKAGE = ["domain", "services"]  # ``domain.py`` or ``domain/``, ``services.py`` or ``services/``
ALLOWED_MODULES = {"__init__", "domain", "services", "selectors", "api", "views", "urls", "tasks", "handlers"}
ALLOWED_MODULES |= {"demo", "apps"}
ALLOWED_PACKAGES = {"domain", "services", "stores", "migrations", "management", "templates", "templatetags"}
REMOVED_OBJECTS = {
    "Inbox",
    "ContactDirectory",
    "PluginHub",
    "DeploymentRegistry",
    "default_inbox",
    "default_directory",
    "default_hub",
    "default_registry",
}


def app_dir(app: str) -> Path:
    return ROOT / app


def source_files(app: str) -> list[Path]:
    """Every Python file of ``app`` except its migrations."""
    return sorted(p for p in app_dir(app).rglob("*.py") if "migrations" not in p.relative_to(ROOT).parts)


def package_of(path: Path) -> str:
    """Return the dotted package a file's relative imports resolve against (``hub/stores/kv.py`` → ``hub.stores``)."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """Return ``(line, absolute name)`` of every import in ``source`` (also inside functions).

    A ``from m import n`` yields both ``m`` and ``m.n`` (so ``from . import services``
    counts as importing ``<package>.services``); relative imports resolve against ``package``.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


@pytest.mark.parametrize("app", APPS)
def test_every_app_has_the_required_rooms(app: str) -> None:
    """``domain``, ``stores/{__init__,base,memory,kv}``, ``services``, ``selectors``, ``api``, ``views``, ``urls``."""
    missing = [name for name in REQUIRED_FILES if not (app_dir(app) / name).is_file()]
    for room in EITHER_MODULE_OR_PACKAGE:
        module, package = app_dir(app) / f"{room}.py", app_dir(app) / room / "__init__.py"
        if module.is_file() == package.is_file():
            missing.append(f"{room}.py or {room}/ (exactly one)")
    assert not missing, f"{app} lacks {', '.join(missing)}"


@pytest.mark.parametrize("app", APPS)
def test_no_app_has_another_top_level_module(app: str) -> None:
    """Write logic under another name (``projection.py``, ``planner.py``, ``runtime.py``…) hides from a reader."""
    extra = []
    for entry in sorted(app_dir(app).iterdir()):
        if entry.name == "__pycache__" or entry.name.startswith("."):
            continue
        if entry.is_dir() and entry.name not in ALLOWED_PACKAGES:
            extra.append(entry.name + "/")
        elif entry.suffix == ".py" and entry.stem not in ALLOWED_MODULES:
            extra.append(entry.name)
    assert not extra, f"{app} has top-level modules outside the shape: {', '.join(extra)}"


@pytest.mark.parametrize("app", APPS)
def test_stores_package_exposes_default_store_and_use_store_on_the_kernel_default_store(app: str) -> None:
    """``default_store()`` answers what ``use_store(store)`` set for the block, and the Kv store again after."""
    stores = importlib.import_module(f"{app}.stores")
    public = sorted(
        name
        for name, obj in vars(stores).items()
        if inspect.isfunction(obj) and obj.__module__ == stores.__name__ and not name.startswith("_")
    )
    assert public == ["default_store", "use_store"], f"{app}.stores defines {public}"
    assert any(isinstance(obj, DefaultStore) for obj in vars(stores).values()), f"{app}.stores has no DefaultStore"
    sentinel = object()
    with stores.use_store(sentinel):
        assert stores.default_store() is sentinel
    assert stores.default_store() is not sentinel


@pytest.mark.parametrize("app", APPS)
def test_selectors_never_import_their_own_services(app: str) -> None:
    """Reads import the store and the domain; a selector importing services makes reads and writes one knot."""
    path = app_dir(app) / "selectors.py"
    services = f"{app}.services"
    hits = [
        f"line {line}: {module}"
        for line, module in imported_modules(path.read_text(encoding="utf-8"), package_of(path))
        if module == services or module.startswith(services + ".")
    ]
    assert not hits, f"{app}/selectors.py imports its services: {'; '.join(hits)}"


@pytest.mark.parametrize("app", APPS)
def test_the_seed_package_objects_are_gone(app: str) -> None:
    """One public surface per action: no ``Inbox``/``PluginHub``/``DeploymentRegistry`` beside the functions."""
    left = []
    for path in source_files(app):
        for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            names: list[str] = []
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            left += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in REMOVED_OBJECTS]
    assert not left, f"{app} still defines {', '.join(left)}"


def test_the_import_reader_sees_every_spelling_of_an_import() -> None:
    """The selectors check relies on ``imported_modules``: relative, absolute and in-function imports count."""
    source = (
        "from . import services\n"
        "from .services import plugin_install\n"
        "from ..hub.services import plugin_revoke\n"
        "import hub.services.extra\n"
        "def f():\n"
        "    from hub.services import plugin_grant\n"
    )
    modules = {m for _, m in imported_modules(source, "hub")}
    assert {"hub.services", "hub.services.plugin_install", "hub.services.extra", "hub.services.plugin_grant"} <= modules
    assert "hub.services" in {m for _, m in imported_modules("from .. import services", "hub.stores")}
