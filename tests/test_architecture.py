"""docs/architecture.md is true to the code: its picture of the layers is the one
``python -m tools.architecture`` draws from the import graph now, and its walk through one
acquisition is the path a traced ``with redlock("r"):`` really takes (the script's ``--check``
starts three throwaway masters of its own for that)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from tools.architecture import DOC, Call, Layers, Step, drawn, strays, walk_of

ROOT = Path(__file__).resolve().parent.parent


def check(doc: Path = DOC) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "tools.architecture", "--check", "--doc", str(doc)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_page_is_true_to_the_code() -> None:
    result = check()
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_an_import_the_picture_does_not_show_makes_it_stale() -> None:
    """What ``--check`` compares: the page's picture with the one the graph draws. An import
    added to the graph (a runtime one, up from ``base``) draws another."""
    page = DOC.read_text()
    layers = Layers.read()
    assert drawn(page, layers) == page
    layers.engine_runtime["base.protocol"] = layers.engine_runtime["base.protocol"] | {"kinds.lock"}
    layers.engine_all["base.protocol"] = layers.engine_all["base.protocol"] | {"kinds.lock"}
    redrawn = drawn(page, layers)
    assert redrawn != page
    base = redrawn[redrawn.index("┌─ base:") :]
    assert "↓ runtime: ↑ kinds 1 · itself 2" in base


def test_the_check_fails_on_a_stale_picture_and_a_walk_off_the_path(tmp_path: Path) -> None:
    """A page whose picture lost a module, and whose walk names a function the acquisition
    does not enter and two steps in the wrong order: ``--check`` exits 1 naming each."""
    page = DOC.read_text()
    stale = page.replace("│ __init__  beacon  deadlines", "│ __init__  deadlines", 1)
    assert stale != page
    stale = stale.replace("| `Lock.acquire` |", "| `Lock.take` |", 1)
    judged = "| 19 | `engine/algorithm/procedures.py` | `judged` |"
    grants = "| 20 | `engine/algorithm/steps.py` | `grants` |"
    stale = stale.replace(judged, "@").replace(grants, judged).replace("@", grants)
    stale = stale.replace("| the masters | `SET` |", "| the masters | `SETEX` |", 1)
    doc = tmp_path / "architecture.md"
    doc.write_text(stale)
    result = check(doc)
    assert result.returncode == 1
    problems = result.stderr.splitlines()
    assert problems == [
        f"{doc}: the layers drawn there are not the code's (python -m tools.architecture)",
        f"{doc}: walk: step 6: engine/kinds/lock.py Lock.take: not entered after step 5",
        f"{doc}: walk: step 16: the masters did not run SETEX",
        f"{doc}: walk: step 20: engine/algorithm/procedures.py judged: not entered after step 19",
    ]


def test_the_walk_is_read_in_order_from_the_page() -> None:
    steps = walk_of(DOC.read_text())
    assert steps[0] == Step("__init__.py", ("redlock",))
    assert Step("engine/handles/fields.py", ()) in steps  # a file, any function of it
    assert Step("the masters", ("SET",)) in steps
    assert steps[-1] == Step("dbguard.py", ("unguard",))


def test_a_step_is_looked_for_after_the_one_before() -> None:
    def call(file: str, function: str) -> Call:
        return Call(1, file, function, False)

    calls = [call("a.py", "f"), call("b.py", "g"), call("a.py", "h")]
    ran = Counter({"SET": 3})
    assert strays([Step("a.py", ("f",)), Step("a.py", ("h",))], calls, ran) == []
    assert (
        strays([Step("b.py", ()), Step("the masters", ("SET",)), Step("a.py", ())], calls, ran)
        == []
    )
    assert strays([Step("a.py", ("h",)), Step("b.py", ("g",))], calls, ran) == [
        "step 2: b.py g: not entered after step 1"
    ]
    assert strays([Step("the masters", ("DEL",))], calls, ran) == [
        "step 1: the masters did not run DEL"
    ]


def test_a_page_without_its_parts_is_refused(tmp_path: Path) -> None:
    """No walk to check is no pass: a page that lost its walk's markers fails (before any
    master is started), and so does one whose walk lost its rows."""
    page = DOC.read_text()
    doc = tmp_path / "architecture.md"
    doc.write_text(page.replace("<!-- /walk -->", ""))
    result = check(doc)
    assert (result.returncode, result.stderr) == (
        1,
        f"{doc}: no <!-- walk --> ... <!-- /walk --> part\n",
    )
    start, end = page.index("<!-- walk -->"), page.index("<!-- /walk -->")
    doc.write_text(page[:start] + "<!-- walk -->\nNothing here.\n" + page[end:])
    result = check(doc)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{doc}: walk: no steps (a table of file | function rows)"
    ]
