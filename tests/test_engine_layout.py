"""The engine's shape: imports run one way (no circles, no lazy import dodging one), no Django in
it, and files small enough to read. Read from the source, so that it holds for every module."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "django_redlock" / "engine"
MAX_LINES = 400


def engine_imports(path: Path) -> tuple[set[str], set[str]]:
    """(engine modules, top-level packages) that ``path`` imports when it runs: module level or
    inside functions alike, leaving out ``if TYPE_CHECKING:`` blocks (annotations only)."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for child in ast.walk(node))
    engine, packages = set(), set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                names = [node.module] if node.module else [a.name for a in node.names]
                engine.update(n.split(".")[0] for n in names)
            elif node.level == 0 and node.module:
                packages.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            packages.update(a.name.split(".")[0] for a in node.names)
    return engine - {"__init__"}, packages


def import_graph() -> dict[str, set[str]]:
    return {
        path.stem: engine_imports(path)[0]
        for path in ENGINE.glob("*.py")
        if path.stem != "__init__"
    }


def test_engine_imports_run_one_way():
    order = list(graphlib.TopologicalSorter(import_graph()).static_order())  # CycleError if not
    assert order.index("protocol") < order.index("procedures") < order.index("lock")
    assert order.index("pipes") < order.index("rounds") < order.index("drivers")
    assert order[-1] == "redlock"


def test_the_layout_check_catches_a_circle():
    graph = import_graph()
    graph["protocol"] = graph["protocol"] | {"lock"}  # protocol importing the handle: a circle
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("a circle went unnoticed")


def test_engine_is_django_free():
    for path in ENGINE.glob("*.py"):
        packages = engine_imports(path)[1]
        assert "django" not in packages, f"{path.name} imports Django"
        assert "django_redlock" not in packages, f"{path.name} imports the Django layer"


def test_engine_files_stay_readable():
    long = {
        p.name: n for p in ENGINE.glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
