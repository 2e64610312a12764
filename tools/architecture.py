"""Keeps ``docs/architecture.md`` true to the code.

- The layers: drawn from the real import graph (``tools/layers.py``, the reader the layer test
  uses) between ``<!-- layers -->`` and ``<!-- /layers -->``: each layer a box, top to bottom,
  with its modules, and under it the imports it makes into each layer (runtime, and made only for
  annotations). ``python -m tools.architecture`` writes it; ``--check`` exits 1 if the page's copy
  is not what the code draws now (``tests/test_architecture.py`` runs it).
- The walk: the page's table between ``<!-- walk -->`` and ``<!-- /walk -->`` follows one
  ``with redlock("r"):`` file by file. ``--check`` runs one, traced (three throwaway masters,
  ``django_redlock.testing``), and exits 1 naming the first step of the table that the real
  acquisition does not take, in the table's order: a file or function renamed, moved or no
  longer on the path. ``--trace`` prints the traced calls, to write the table from.

Run it from the repository's root: ``python -m tools.architecture [--check | --trace]``.
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tools.layers import PACKAGE, RANKS, Graph, django_graph, import_graph, layer_of

DOC = PACKAGE.parent / "docs" / "architecture.md"
WIDTH = 96
DJANGO = "django_redlock"


# --- the layers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Layers:
    """What the diagram is drawn from: the engine's graph and the Django layer's imports of the
    engine, each with every import (``all``) and with only those that run (``runtime``)."""

    engine_all: Graph
    engine_runtime: Graph
    django_all: Graph
    django_runtime: Graph

    @classmethod
    def read(cls) -> Layers:
        return cls(import_graph(), import_graph(False), django_graph(), django_graph(False))


def _counts(graph: Graph, layer: str, layer_of_source: Callable[[str], str]) -> Counter[str]:
    """How many (module, imported module) pairs go from ``layer`` into each engine layer."""
    counts: Counter[str] = Counter()
    for module, imported in graph.items():
        if layer_of_source(module) == layer:
            counts.update(layer_of(target) for target in imported)
    return counts


def _edges(layer: str, runtime: Counter[str], typing_only: Counter[str]) -> list[str]:
    """The lines under a layer's box: its imports into each layer, the highest first (an
    upward one marked ``↑``)."""
    own = RANKS.index(layer) if layer in RANKS else len(RANKS)

    def spelled(head: str, counts: Counter[str]) -> list[str]:
        parts = []
        for target in reversed(RANKS):
            if counts[target]:
                rank = RANKS.index(target)
                where = "itself" if rank == own else ("↑ " if rank > own else "") + target
                parts.append(f"{where} {counts[target]}")
        parts = parts or ["none"]
        lines = [head + parts[0]]
        for part in parts[1:]:
            if len(lines[-1]) + 3 + len(part) > WIDTH:
                lines.append(" " * len(head) + part)
            else:
                lines[-1] += f" · {part}"
        return lines

    lines = spelled("  ↓ runtime: ", runtime)
    if typing_only:
        lines += spelled("  ⇣ annotations only: ", typing_only)
    return lines


def _box(title: str, names: Sequence[str]) -> list[str]:
    inner = WIDTH - 4
    rows = textwrap.wrap("  ".join(names), inner, break_on_hyphens=False) or [""]
    return [
        f"┌─ {title} " + "─" * (WIDTH - len(title) - 5) + "┐",
        *(f"│ {row.ljust(inner)} │" for row in rows),
        "└" + "─" * (WIDTH - 2) + "┘",
    ]


def diagram(layers: Layers) -> str:
    """The layers as boxes, the Django layer on top and ``base`` at the bottom, each with its
    modules and the imports it makes (counted in importing-module, imported-module pairs)."""
    lines: list[str] = []
    django_units = sorted(layers.django_all)
    lines += _box(f"the Django layer: {DJANGO}/ (a module or package each)", django_units)

    def unit(name: str) -> str:
        return "django" if name in layers.django_all else "?"

    def typing_only(everything: Graph, runtime: Graph) -> Graph:
        return {m: everything[m] - runtime.get(m, set()) for m in everything}

    django_typing = typing_only(layers.django_all, layers.django_runtime)
    lines += _edges(
        "django",
        _counts(layers.django_runtime, "django", unit),
        _counts(django_typing, "django", unit),
    )
    engine_typing = typing_only(layers.engine_all, layers.engine_runtime)
    for layer in reversed(RANKS):
        modules = sorted(
            "__init__" if m == layer else m.split(".")[-1]
            for m in layers.engine_all
            if layer_of(m) == layer
        )
        title = "root: engine/*.py" if layer == "root" else f"{layer}: engine/{layer}/"
        lines += _box(title, modules)
        lines += _edges(
            layer,
            _counts(layers.engine_runtime, layer, layer_of),
            _counts(engine_typing, layer, layer_of),
        )
    return "\n".join(lines)


def between(text: str, marker: str) -> tuple[int, int]:
    """Where the part of ``text`` between ``<!-- marker -->`` and ``<!-- /marker -->`` starts
    and ends (ValueError naming a missing marker)."""
    opening, closing = f"<!-- {marker} -->\n", f"<!-- /{marker} -->"
    start, end = text.find(opening), text.find(closing)
    if start < 0 or end < start:
        raise ValueError(f"no {opening.strip()} ... {closing} part")
    return start + len(opening), end


def drawn(page: str, layers: Layers) -> str:
    """``page`` with the diagram of ``layers`` between its layers markers."""
    start, end = between(page, "layers")
    return page[:start] + "```text\n" + diagram(layers) + "\n```\n" + page[end:]


# --- the walk -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A Python function of ``django_redlock`` entered while traced (or a generator resumed)."""

    depth: int
    file: str  # from django_redlock/: engine/kinds/lock.py
    function: str  # its qualified name: Lock.__enter__
    resumed: bool


@dataclass(frozen=True)
class Step:
    """A row of the page's walk: a file and the functions of it entered, in order (none named:
    any function of the file); or ``the masters`` and the commands each ran."""

    file: str
    functions: tuple[str, ...]

    @property
    def on_masters(self) -> bool:
        return self.file == "the masters"


_ROW = re.compile(r"^\|[^|]*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|")


def walk_of(page: str) -> list[Step]:
    """The steps of the page's walk table (file in the second column, functions in backticks
    in the third)."""
    start, end = between(page, "walk")
    steps = []
    for line in page[start:end].splitlines():
        row = _ROW.match(line)
        if row is None or set(row[1]) <= set("-: ") or row[1].lower() == "file":
            continue
        steps.append(Step(row[1].strip("`"), tuple(re.findall(r"`([^`]+)`", row[2]))))
    return steps


def strays(steps: Sequence[Step], calls: Sequence[Call], commands: Counter[str]) -> list[str]:
    """The steps the traced acquisition did not take, in the table's order (each step's
    functions after the previous step's; a step ``the masters`` in the commands they ran)."""
    wrong = []
    position = 0
    for number, step in enumerate(steps, 1):
        if step.on_masters:
            wrong += [
                f"step {number}: the masters did not run {c}"
                for c in step.functions
                if not commands[c]
            ]
            continue
        wanted = step.functions or ("",)
        for function in wanted:
            found = next(
                (
                    i
                    for i in range(position, len(calls))
                    if calls[i].file == step.file and function in ("", calls[i].function)
                ),
                None,
            )
            if found is None:
                named = f"{step.file} {function}".strip()
                wrong.append(f"step {number}: {named}: not entered after step {number - 1}")
            else:
                position = found
    return wrong


def _traced(resource: str) -> tuple[list[Call], Counter[str]]:
    """One ``with redlock(resource):`` on three throwaway masters, after two to warm up (its
    connections made, its scripts known): every call into ``django_redlock`` it made (on this
    thread), and the commands a quorum of the masters ran meanwhile."""
    from django_redlock.testing.masters import local_masters

    with local_masters(3) as masters:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            # (A budget of 2 s a master, not 0.05: a loaded machine must not turn the usual
            # path into a failed master's. The path is the same within either.)
            REDLOCK={"NODES": [master.url for master in masters], "NODE_TIMEOUT": 2.0},
        )
        django.setup()
        import django_redlock
        from django_redlock import redlock

        if Path(django_redlock.__file__ or "").parent != PACKAGE:  # (the trace would be empty)
            raise SystemExit(
                f"django_redlock is imported from {django_redlock.__file__}, not from this tree "
                f"({PACKAGE}): run python -m tools.architecture from {PACKAGE.parent}"
            )

        for _ in range(2):
            with redlock(resource):
                pass

        clients = [master.client() for master in masters]  # (one each: no HELLO counted)

        def stats() -> list[Counter[str]]:
            return [
                Counter({k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items()})
                for info in (client.info("commandstats") for client in clients)
            ]

        before = stats()
        calls: list[Call] = []
        depth = 0
        prefix = f"{PACKAGE}/"

        def profile(frame: FrameType, event: str, arg: object) -> None:
            nonlocal depth
            if event == "call":
                depth += 1
                code = frame.f_code
                if code.co_filename.startswith(prefix):
                    resumed = bool(code.co_flags & 0x20) and frame.f_lineno != code.co_firstlineno
                    file = code.co_filename.removeprefix(prefix)
                    calls.append(Call(depth, file, code.co_qualname, resumed))
            elif event == "return":
                depth -= 1

        gc.disable()  # (a collection would trace whatever finalizer it ran)
        sys.setprofile(profile)
        try:
            with redlock(resource):
                pass
        finally:
            sys.setprofile(None)
            gc.enable()
        ran = [after - then for after, then in zip(stats(), before, strict=True)]
        for client in clients:
            client.close()
    commands: Counter[str] = Counter()
    for each in ran:
        commands.update(command.upper() for command, count in each.items() if count)
    quorum = len(ran) // 2 + 1
    return calls, Counter({c: n for c, n in commands.items() if n >= quorum and c != "INFO"})


def _tree(calls: Sequence[Call]) -> Iterator[str]:
    """The traced calls indented by depth (among those of ``django_redlock``), a generator's
    resumption marked, a call repeated at once shown once: the walk's material."""
    depths: list[int] = []
    last = ""
    for call in calls:
        while depths and depths[-1] >= call.depth:
            depths.pop()
        depths.append(call.depth)
        line = "  " * (len(depths) - 1) + f"{call.file}  {call.function}"
        line += "  (resumed)" if call.resumed else ""
        if line != last:
            yield line
        last = line


# --- the command ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.architecture", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    mode.add_argument("--trace", action="store_true", help="print one traced acquisition")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page (docs/architecture.md)")
    args = parser.parse_args(argv)
    if args.trace:
        calls, commands = _traced("r")
        print("\n".join(_tree(calls)))
        print("the masters ran:", ", ".join(f"{c} {n}" for c, n in sorted(commands.items())))
        return 0
    page = args.doc.read_text()
    try:
        fresh, steps = drawn(page, Layers.read()), walk_of(page)
    except ValueError as missing:
        print(f"{args.doc}: {missing}", file=sys.stderr)
        return 1
    if not args.check:
        if fresh != page:
            args.doc.write_text(fresh)
            print(f"{args.doc}: layers drawn anew")
        return 0
    problems = []
    if fresh != page:
        problems.append(
            f"{args.doc}: the layers drawn there are not the code's (python -m tools.architecture)"
        )
    if not steps:
        problems.append(f"{args.doc}: walk: no steps (a table of file | function rows)")
    calls, commands = _traced("r")
    problems += [f"{args.doc}: walk: {wrong}" for wrong in strays(steps, calls, commands)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
