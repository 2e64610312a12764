"""The Django layer's shape, as tests/test_engine_layout.py keeps the engine's: imports between the
package's modules run one way, with no circle, annotations included (``if TYPE_CHECKING:``
imports count here: a circle drawn only for types is still two files that need each other).

Nodes are the package's top-level modules and subpackages; the engine is one node (its inside is
test_engine_layout's), and so is ``management``; each module of the two groups, ``contrib`` and
``operations``, is a node of its own (``contrib.celery``). The package's ``__init__`` is left
out: it is the façade that imports the Django surfaces lazily, on purpose (``from django_redlock
import lock_view``), and modules reach ``redlock()`` through it."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_redlock"
#: Folders that group modules by the question they answer: each module in them is a node.
GROUPS = ("contrib", "operations")


def node_of(parts: list[str] | tuple[str, ...]) -> str:
    """The node of the module at ``parts`` (its dotted path in the package, as a list)."""
    if parts[0] in GROUPS and len(parts) > 1 and parts[1] != "__init__":
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def _exists(parts: list[str]) -> bool:
    target = PACKAGE.joinpath(*parts)
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


def imported_nodes(path: Path) -> set[str]:
    """The package's nodes that ``path`` imports, anywhere in it (TYPE_CHECKING blocks too)."""
    here = list(path.relative_to(PACKAGE).parts[:-1])  # the package path of ``path``
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[list[str]] = []
        if isinstance(node, ast.ImportFrom) and (node.level or node.module):
            if node.level:
                module = here[: len(here) - (node.level - 1)] + (node.module or "").split(".")
            elif node.module.split(".")[0] == "django_redlock":  # type: ignore[union-attr]
                module = node.module.split(".")[1:]  # type: ignore[union-attr]
            else:
                continue
            module = [part for part in module if part]
            # ``from .contrib import otel`` imports the module otel; ``from .conf import x``, conf.
            for alias in node.names:
                named = module + [alias.name]
                targets.append(named if _exists(named) else module)
        elif isinstance(node, ast.Import):
            targets += [a.name.split(".")[1:] for a in node.names if a.name.startswith("django_")]
        for parts in targets:
            # ``from . import redlock``: a name of the façade, not a module.
            if parts and _exists(parts[:1]):
                found.add(node_of(parts))
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        node = node_of(path.relative_to(PACKAGE).with_suffix("").parts)
        if node == "__init__":
            continue
        graph.setdefault(node, set()).update(imported_nodes(path) - {node, "__init__"})
    return graph


def test_the_django_layer_imports_run_one_way() -> None:
    graph = import_graph()
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError if not
    assert order.index("views") < order.index("admin")  # admin -> views, never views -> admin
    assert order.index("engine") < order.index("conf") < order.index("views")
    assert {"admin", "views", "operations.inventory", "contrib.celery", "management"} <= set(graph)


def test_the_layout_check_catches_a_circle() -> None:
    graph = import_graph()
    graph["views"] = graph["views"] | {"admin"}  # the circle there was (annotations only)
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("a circle went unnoticed")
