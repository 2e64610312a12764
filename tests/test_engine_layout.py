"""The engine's shape: layers as packages, each importing only from the layers below it (and from
its own, with no circle), no Django in any of them. Read from the source (``tools/layers.py``, the
one reader of the import graph), so that it holds for every module; docs/architecture.md draws the
same graph (``python -m tools.architecture``).

The ranks, bottom to top (see each package's ``__init__`` for what it owns)::

    base < scripts < members < waiting < leases < algorithm < running < handles < kinds < root

``root`` is the engine package itself: ``redlock.py``, ``locking.py`` and its ``__init__``. An
import counts wherever it is (module level or inside a function), and one made only for
annotations (``if TYPE_CHECKING:``) counts as any other: a file that names an upper layer's type
depends on it too. A lower layer that needs something of an upper one says what in a protocol of
its own (``leases.leases.LeaseHandle``: what a lease needs of the handle that acquired it;
``handles.fields.Engine``: what a handle needs of its ``Redlock``).
"""

from __future__ import annotations

import graphlib

from tools.layers import ENGINE, RANKS, Graph, engine_imports, import_graph, layer_of

#: The algorithm names the members only through this module: its types and one question, never
#: a connection (``members/interface.py``).
MEMBERS_INTERFACE = "members.interface"
#: The one annotation that still points up a layer. A mode's own renewal and release requests
#: (``LeaseCommands``: a permit's, a reader's) are ``Round`` steps of the algorithm, which the
#: lease only carries for it. Naming them from below needs ``Round`` in a lower layer (it is
#: made of ``members.interface.Command`` and a ``scripts`` script: a move, not an annotation),
#: or an ``Any`` that would stop mypy checking what a mode's commands return.
ANNOTATIONS_UP = ["leases.leases imports algorithm.steps: up from leases"]


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
    # Annotations too, but for the one named above (gone, it goes from the list).
    assert layer_violations(import_graph()) == ANNOTATIONS_UP


def test_engine_imports_have_no_circle():
    graph = import_graph()  # (annotations too: no circle of modules naming each other's types)
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
