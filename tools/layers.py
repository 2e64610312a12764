"""The layers of ``django_redlock`` and who imports whom, read from the source with ``ast`` (no
module is imported): the one reader of the import graph, for the layer test
(``tests/test_engine_layout.py``) and the picture (``tools/architecture.py``).

The engine's ranks, bottom to top (each package's ``__init__`` says what it owns)::

    base < scripts < members < waiting < leases < algorithm < running < handles < kinds < root

``root`` is the engine package itself: ``redlock.py``, ``locking.py`` and its ``__init__``.
Engine modules are named from the engine (``members.pipes``); the Django layer above it (the rest
of ``django_redlock``) is read a top-level module or package at a time (``locks``, ``contrib/``).
An import counts wherever it is (module level or inside a function); ``annotations=False`` leaves
out those made only for annotations (``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_redlock"
ENGINE = PACKAGE / "engine"
RANKS = (
    "base",
    "scripts",
    "members",
    "waiting",
    "leases",
    "algorithm",
    "running",
    "handles",
    "kinds",
    "root",
)

#: A graph: each module, and the modules it imports.
Graph = dict[str, set[str]]


def module_name(path: Path, root: Path = ENGINE) -> str:
    """``members.pipes`` for engine/members/pipes.py, ``redlock`` for engine/redlock.py (from
    ``root``: ``engine.kinds.lock`` from the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def layer_of(module: str) -> str:
    """The engine layer of an engine module."""
    first = module.split(".")[0]
    return first if first in RANKS else "root"


def _resolve(root: Path, base: list[str], module: str | None, names: list[str]) -> list[str]:
    """The modules (or packages) under ``root`` that ``from <base>.<module> import <names>``
    names."""
    if module:
        target = base + module.split(".")
        # ``from ..scripts import plain``: a module of the package, not a name in it.
        if all(root.joinpath(*target, name).with_suffix(".py").is_file() for name in names):
            return [".".join(target + [name]) for name in names]
        return [".".join(target)]
    return [".".join(base + [name]) for name in names]


def imports_of(
    path: Path, root: Path = ENGINE, annotations: bool = True
) -> tuple[set[str], set[str]]:
    """(modules under ``root``, other top-level packages) that ``path`` imports, anywhere in the
    file; with ``annotations=False``, leaving out ``if TYPE_CHECKING:`` blocks. Under ``root``:
    its relative imports (and, from the package, ``django_redlock.…`` ones)."""
    here = list(path.relative_to(root).parts[:-1])
    modules: set[str] = set()
    packages: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for child in ast.walk(node))
    for node in ast.walk(tree):
        if not annotations and id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[: len(here) - (node.level - 1)]
            names = [a.name for a in node.names]
            modules.update(m for m in _resolve(root, base, node.module, names) if m)
        elif (
            isinstance(node, ast.ImportFrom)
            and root == PACKAGE
            and node.module
            and node.module.split(".")[0] == PACKAGE.name
        ):
            names = [a.name for a in node.names]
            modules.update(_resolve(root, [], node.module.partition(".")[2], names))
        elif isinstance(node, ast.ImportFrom) and node.module:
            packages.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            packages.update(a.name.split(".")[0] for a in node.names)
    return modules, packages


def engine_imports(path: Path, annotations: bool = True) -> tuple[set[str], set[str]]:
    """(engine modules, top-level packages) that the engine file ``path`` imports."""
    return imports_of(path, ENGINE, annotations)


def import_graph(annotations: bool = True) -> Graph:
    """Every engine module and the engine modules it imports."""
    return {
        module_name(path): engine_imports(path, annotations)[0] - {"__init__"}
        for path in ENGINE.rglob("*.py")
        if module_name(path) != "__init__"
    }


def django_unit(path: Path) -> str:
    """The part of the Django layer ``path`` belongs to: its top-level module (``locks``) or
    package (``contrib/``)."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py") if first.endswith(".py") else f"{first}/"


def django_graph(annotations: bool = True) -> Graph:
    """The Django layer's parts (``django_unit``) and the engine modules each imports (the
    engine's own ``__init__``, ``from .engine import Lock``, is in the root layer)."""
    graph: Graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(ENGINE):
            continue
        imported = imports_of(path, PACKAGE, annotations)[0]
        engine = {m.removeprefix("engine.") for m in imported if m.split(".")[0] == "engine"}
        graph.setdefault(django_unit(path), set()).update(
            "__init__" if m == "engine" else m for m in engine
        )
    return graph
