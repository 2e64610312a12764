"""``python -m bench.instructions``: CPU instructions per uncontended cycle (acquire + release
of a fresh key on 5 local masters) of the floor and of ours, counted by valgrind's callgrind.
Not part of ``all``: it prints, it saves nothing.

Wall-clock ratios on a shared machine move with everyone else's load; an instruction count does
not. Each row runs in a process of its own under callgrind, which counts only inside
``operator.call(contender.run, cycles)`` (``--toggle-collect=_operator_call``: nothing else in a
cycle calls it), after warm-up cycles. It counts this process's instructions in user space
(Python, redis-py, hiredis, libc), not the kernel's and not the masters': the client's own work,
which is what our code adds to the floor's. The node budget is raised to 5 s in the measured
process (callgrind runs code ~50x slower: no timeout may change the path).

``--baseline DIR`` measures the code in DIR too (``git archive main | tar -x -C DIR``), row by
row beside this tree's, on the same masters.

Needs ``valgrind`` on PATH (Debian: ``apt-get install valgrind``); says so and stops without it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: Rows: what each measures (the contenders of ``bench.cycle`` and ``bench.django_layer``).
KINDS = {
    "floor": "floor (redis-py connections, pipelined by hand)",
    "with": "ours, `with redlock.lock(r):`",
    "django": "ours, `with redlock(r):` (Django settings, observer, signals, metrics)",
    "afloor": "floor (asyncio)",
    "async": "ours (async, aacquire/arelease)",
    "adjango": "ours, `async with redlock(r):` (Django)",
    "permit": "ours, `with redlock.lock(r, limit=4):` (a semaphore's permit)",
    "reader": "ours, `with redlock.lock(r, shared=True):` (a reader)",
}

ROOT = Path(__file__).resolve().parent.parent

#: The per-node budget in the measured process.
BUDGET = 5.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("kinds", nargs="*", default=list(KINDS), help=" ".join(KINDS))
    parser.add_argument("--cycles", type=int, default=200, help="measured cycles per row")
    parser.add_argument("--baseline", type=Path, help="a tree to measure beside this one")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.cycles, args.urls.split(","))
        return
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or args.cycles < 1:
        parser.error(f"kinds: {' '.join(KINDS)}; --cycles >= 1 (got {unknown}, {args.cycles})")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: no instruction counts (apt-get install valgrind)")
        return
    trees = [("this tree", ROOT)]
    if args.baseline is not None:
        trees.insert(0, ("baseline", args.baseline.resolve()))

    from django_redlock.testing.masters import local_masters

    from .cycle import load_scripts

    counts: dict[tuple[str, str], int | None] = {}
    with local_masters(5) as masters:
        load_scripts(masters)
        urls = [m.url for m in masters]
        for kind in args.kinds:
            for name, tree in trees:
                counts[name, kind] = _measure(tree, kind, urls, args.cycles)
    _print(args.kinds, trees, counts, args.cycles)


def _measure(tree: Path, kind: str, urls: list[str], cycles: int) -> int | None:
    """Instructions per cycle of ``kind`` with the code in ``tree``; None if the run failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=_operator_call",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            kind,
            "--cycles",
            str(cycles),
            "--urls",
            ",".join(urls),
        ]
        environment = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
        done = subprocess.run(  # noqa: S603 (our own interpreter and script)
            command, cwd=tree, env=environment, capture_output=True, text=True, check=False
        )
        if done.returncode != 0 or "errors 0" not in done.stdout:
            print(f"{kind} ({tree}): failed\n{done.stdout[-500:]}{done.stderr[-1500:]}")
            return None
        total = sum(
            int(found)
            for dump in Path(tmp).glob("callgrind.out*")
            for found in re.findall(r"^summary: (\d+)", dump.read_text(), re.MULTILINE)
        )
    return total // cycles


def _child(kind: str, cycles: int, urls: list[str]) -> None:
    """In the measured process: warm ``kind`` up, then run ``cycles`` inside operator.call."""
    import operator

    from bench import cycle, django_layer

    cycle.NODE_TIMEOUT = django_layer.NODE_TIMEOUT = BUDGET
    addresses = [(urlsplit(u).hostname or "", urlsplit(u).port or 6379) for u in urls]
    make = {
        "floor": lambda: cycle.Floor(addresses, "bench:instructions:floor"),
        "with": lambda: cycle.OursWith(urls, "bench:instructions:with"),
        "django": lambda: django_layer.OursDjango(urls, "bench:instructions:django"),
        "afloor": lambda: cycle.AsyncFloor(addresses, "bench:instructions:afloor"),
        "async": lambda: cycle.OursAsync(urls, "bench:instructions:async"),
        "adjango": lambda: django_layer.OursDjangoAsync(urls, "bench:instructions:adjango"),
    }
    contender: Any = make[kind]() if kind in make else _Mode(urls, kind)
    contender.run(50)  # warm: connections, scripts, caches
    batch = operator.call(contender.run, cycles)
    print("errors", len(batch.errors), batch.errors[:3])
    contender.close()


class _Mode:
    """A permit (``limit=4``) or a reader (``shared=True``) taken and given back with ``with``, a
    new handle every cycle (as ``cycle.OursWith``), on a name of its own. Built on the engine's
    public API only, so that ``--baseline`` measures an older tree's the same way."""

    def __init__(self, urls: list[str], kind: str) -> None:
        from django_redlock.engine import Redlock

        self.redlock = Redlock(urls, node_timeout=BUDGET)
        self._resource = f"bench:instructions:{kind}"
        self._options: dict[str, object] = {"limit": 4} if kind == "permit" else {"shared": True}

    def _cycle(self) -> None:
        with self.redlock.lock(self._resource, ttl=10.0, **self._options):  # type: ignore[arg-type]
            pass

    def run(self, cycles: int) -> Any:
        from bench.cycle import timed

        return timed(self._cycle, cycles)

    def close(self) -> None:
        self.redlock.close()


def _print(
    kinds: list[str],
    trees: list[tuple[str, Path]],
    counts: dict[tuple[str, str], int | None],
    cycles: int,
) -> None:
    print(f"\n### instructions per uncontended cycle (callgrind, {cycles} cycles, 5 masters)\n")
    heads = [f"{name}: Ir per cycle | x floor" for name, _ in trees]
    print("| row | " + " | ".join(heads) + " |")
    print("|---|" + "---|---|" * len(trees))
    floor = {name: counts.get((name, "floor")) for name, _ in trees}
    for kind in kinds:
        cells = []
        for name, _ in trees:
            count, base = counts[name, kind], floor[name]
            ratio = f"{count / base:.2f}x" if count and base else "-"
            cells.append(f"{count:,} | {ratio}" if count else "failed | -")
        print(f"| {KINDS[kind]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if __package__ in (None, ""):  # run by path (the measured process): the tree's bench, and
        # not this directory first (its profile.py would stand in for the standard library's)
        sys.path[0] = os.environ.get("PYTHONPATH", str(ROOT))
    main()
