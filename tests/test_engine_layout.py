"""The engine's shape: layers as packages, each importing only from the layers below it (and from
its own, with no circle), no Django in any of them. Read from the source (``tools/layers.py``, the
one reader of the import graph), so that it holds for every module; docs/architecture.md draws the
same graph (``python -m tools.architecture``).

The ranks, bottom to top (see each package's ``__init__`` for what it owns)::

    base < scripts < members < waiting < leases < algorithm < running < handles < kinds < root

``root`` is the engine package itself: ``redlock.py``, ``locking.py`` and its ``__init__``. An
import counts wherever it is (module level or inside a function). One made only for annotations
(``if TYPE_CHECKING:``) is held to the same rule, less a shrinking list of old exceptions: a file
that names an upper layer's type depends on it too.
"""

from __future__ import annotations

import graphlib

from tools.layers import ENGINE, RANKS, Graph, engine_imports, import_graph, layer_of

#: The algorithm names the members only through this module: its types and one question, never
#: a connection (``members/interface.py``).
MEMBERS_INTERFACE = "members.interface"
#: Imports made only for annotations that still point up a layer: each names an upper layer's
#: type (mostly the ``Lock`` handle a callback receives). To be replaced by protocols declared
#: in the lower layer; the list may only shrink.
ANNOTATIONS_UP = {
    "algorithm.steps imports running.watchdog: up from algorithm",
    "base.events imports kinds.lock: up from base",
    "handles.fields imports kinds.lock: up from handles",
    "handles.fields imports redlock: up from handles",
    "handles.granting imports kinds.lock: up from handles",
    "handles.options imports kinds.lock: up from handles",
    "kinds.group imports redlock: up from kinds",
    "kinds.modes imports redlock: up from kinds",
    "kinds.permit imports redlock: up from kinds",
    "kinds.readers imports redlock: up from kinds",
    "leases.leases imports algorithm.steps: up from leases",
    "leases.leases imports kinds.lock: up from leases",
    "leases.reentry imports kinds.lock: up from leases",
}


def layer_violations(graph: Graph) -> list[str]:
    """Every import that breaks the layering, worded for the reader of a failed test."""
    wrong = []
    for module, imported in sorted(graph.items()):
        rank = RANKS.index(layer_of(module))
        for target in sorted(imported):
            target_rank = RANKS.index(layer_of(target))
            if target_rank > rank:
                wrong.append(f"{module} imports {target}: up from {layer_of(module)}")
            elif (
                layer_of(module) == "algorithm"
                and layer_of(target) == "members"
                and target != MEMBERS_INTERFACE
            ):
                wrong.append(f"{module} imports {target}: not through {MEMBERS_INTERFACE}")
    return wrong


def test_every_engine_module_is_in_a_layer():
    stray = [m for m in import_graph() if layer_of(m) == "root" and "." in m]
    assert stray == []
    assert {layer_of(m) for m in import_graph()} == set(RANKS)


def test_engine_imports_run_down_the_layers():
    assert layer_violations(import_graph(annotations=False)) == []


def test_annotations_point_up_no_more_than_they_did():
    assert set(layer_violations(import_graph())) - ANNOTATIONS_UP == set()


def test_engine_imports_have_no_circle():
    graph = import_graph(annotations=False)
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError if not
    assert order.index("base.protocol") < order.index("algorithm.procedures")
    assert order.index("members.pipes") < order.index("members.rounds")
    assert order.index("algorithm.steps") < order.index("running.drivers")
    assert order.index("running.drivers") < order.index("kinds.lock") < order.index("redlock")


def test_the_layer_check_catches_an_upward_import():
    graph = import_graph(annotations=False)
    graph["base.protocol"] = graph["base.protocol"] | {"kinds.lock"}  # protocol naming the handle
    assert layer_violations(graph) == ["base.protocol imports kinds.lock: up from base"]


def test_the_layer_check_catches_the_algorithm_reaching_a_connection():
    graph = import_graph(annotations=False)
    graph["algorithm.holding"] = graph["algorithm.holding"] | {"members.pipes"}
    assert layer_violations(graph) == [
        "algorithm.holding imports members.pipes: not through members.interface"
    ]


def test_the_layout_check_catches_a_circle():
    graph = import_graph(annotations=False)
    graph["base.errors"] = graph["base.errors"] | {"base.events"}
    graph["base.events"] = graph["base.events"] | {"base.errors"}  # a circle inside one layer
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("a circle went unnoticed")


def test_engine_is_django_free():
    for path in ENGINE.rglob("*.py"):
        packages = engine_imports(path)[1]
        assert "django" not in packages, f"{path.name} imports Django"
        assert "django_redlock" not in packages, f"{path.name} imports the Django layer"
