"""The Django layer's shape, as tests/test_engine_layout.py keeps the engine's: imports between the
package's modules run one way, with no circle, annotations included (``if TYPE_CHECKING:``
imports count here: a circle drawn only for types is still two files that need each other).

Nodes are the package's top-level modules and subpackages; the engine is one node (its inside is
test_engine_layout's), and so is ``management``; each module of the two groups, ``contrib`` and
``operations``, is a node of its own (``contrib.celery``). The package's ``__init__`` is left
out: it is the façade that imports the Django surfaces lazily, on purpose (``from django_redlock
import lock_view``), and modules reach ``redlock()`` through it.

The grouping is checked too (``grouping_problems``): the engine imports nothing of the Django
layer; ``operations/`` reads the masters through the engine only; of ``contrib/``, the package
imports only the adapters every lock calls (``otel``, ``prometheus``), which import only the
engine, so the lock's path never imports Celery's or django-health-check's code; nothing on the
lock's path (``locks``, ``apps``: every process imports them) imports an operation (a project
with the admin installed imports them at setup all the same: admin -> views); a group's
``__init__`` imports nothing (each of its modules runs it); and the first paths kept for moved
modules (``celery``, ``metrics``) are imported by nothing in the package."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_redlock"
#: Folders that group modules by the question they answer: each module in them is a node.
GROUPS = ("contrib", "operations")
#: The integrations that every lock calls (each a no-op without its library).
ADAPTERS = {"contrib.otel", "contrib.prometheus", "contrib.histograms"}
#: The documented first paths of modules that moved, kept as re-exports: node -> its new node.
FIRST_PATHS = {"celery": "contrib.celery", "metrics": "contrib.prometheus"}
#: What every process imports: ``redlock()``'s lock, and the app's ``ready()``.
LOCK_PATH = ("locks", "apps")


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
                found.add(parts[0])  # a group's module runs its group's ``__init__`` first
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


def reached_from(graph: dict[str, set[str]], starts: tuple[str, ...]) -> set[str]:
    """The nodes that importing ``starts`` imports, ``starts`` included."""
    reached, todo = set(starts), list(starts)
    while todo:
        for target in graph[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    return reached


def grouping_problems(graph: dict[str, set[str]]) -> list[str]:
    """Each edge that breaks a rule of the grouping, as ``"a -> b: the rule"``."""
    on_lock_path = reached_from(graph, LOCK_PATH)
    problems = []
    for node, targets in sorted(graph.items()):
        group = node.split(".")[0]
        for target in sorted(targets):
            edge = f"{node} -> {target}"
            if node == "engine":
                problems.append(f"{edge}: the engine imports nothing of the Django layer")
            if node in GROUPS:
                problems.append(f"{edge}: a group's __init__ imports nothing (each module runs it)")
            if group == "operations" and target.split(".")[0] not in ("engine", "operations"):
                problems.append(f"{edge}: operations reach the masters through the engine only")
            if node in ADAPTERS and target not in {"engine", "contrib"} | ADAPTERS:
                problems.append(f"{edge}: an adapter every lock calls imports only the engine")
            if (
                target.startswith("contrib.")
                and target not in ADAPTERS
                and group != "contrib"
                and FIRST_PATHS.get(node) != target
            ):
                problems.append(f"{edge}: an integration is imported by the project that uses it")
            if target in FIRST_PATHS:
                problems.append(f"{edge}: a first path is for projects; the package uses the new")
            if node in on_lock_path and target.startswith("operations."):
                problems.append(f"{edge}: on the lock's path, which needs no operator's tool")
    return problems


def test_the_django_layer_is_grouped_by_the_question_it_answers() -> None:
    graph = import_graph()
    assert ADAPTERS | set(FIRST_PATHS) | set(FIRST_PATHS.values()) <= set(graph)
    assert {"contrib.otel", "contrib.prometheus", "conf"} <= reached_from(graph, LOCK_PATH)
    assert grouping_problems(graph) == []


@pytest.mark.parametrize(
    ("node", "target"),
    [
        ("engine", "conf"),  # the engine would need Django
        ("contrib", "contrib.celery"),  # every integration would import Celery
        ("operations.inventory", "conf"),  # an operation reading the setting itself
        ("contrib.otel", "locks"),  # an adapter reaching up (a circle, too)
        ("views", "contrib.celery"),  # the admin page would need Celery installed
        ("decorators", "celery"),  # the package using a first path
        ("observer", "operations.health"),  # every lock's process importing an operator's tool
    ],
)
def test_the_grouping_check_catches_a_wrong_edge(node: str, target: str) -> None:
    graph = import_graph()
    assert not [p for p in grouping_problems(graph) if p.startswith(f"{node} -> {target}:")]
    graph[node] = graph[node] | {target}
    assert [p for p in grouping_problems(graph) if p.startswith(f"{node} -> {target}:")]
