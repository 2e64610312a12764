"""The protocol models (``model/*.pml``, described in docs/models.md) checked with Spin: each good
model's state space is searched in full and must hold its property (``errors: 0``); each known-bad
design, the same model with one ``-D`` switch, must be refuted with a trail that Spin replays.

Spin and a C compiler are installed by ``.ci/run``; without them these tests fail (never skip).
The searches are exhaustive (``-DCOLLAPSE`` only compresses the stored states, losslessly)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parent.parent / "model"

#: pan's depth bound: far above the deepest run of any model (a few hundred steps), so that a
#: search is never cut short (pan says "max search depth too small" when it is: checked below).
DEPTH = 100_000


@dataclass(frozen=True)
class Check:
    model: str
    defines: tuple[str, ...] = ()
    #: An LTL property (``ltl`` in the model): an acceptance-cycle search under weak fairness.
    liveness: bool = False

    @property
    def name(self) -> str:
        return " ".join((self.model, *self.defines))


GOOD = [
    Check("handoff.pml"),
    Check("quarantine.pml"),
    Check("permits.pml"),
    Check("readers.pml"),
    Check("at_least.pml"),
    # Today's READER_ACQUIRE: a refused reader wakes the queued writer (issue 35 item 7's fix).
    Check("wakeup.pml", liveness=True),
    Check("wakeup.pml", ("-DSAFETY_POLL",), liveness=True),
]

BAD = [
    Check("handoff.pml", ("-DRELEASE_NO_COMPARE",)),
    Check("handoff.pml", ("-DQUORUM_ONE",)),
    Check("quarantine.pml", ("-DNO_QUARANTINE",)),
    Check("permits.pml", ("-DNAIVE_COUNTER",)),
    Check("readers.pml", ("-DNO_MARKER_RAISE",)),
    Check("at_least.pml", ("-DFINISH_SAME_VALUE",)),
    # The reader script before issue 35 item 7's fix, without the 1 s safety poll: a writer
    # queued behind a refused reader is never woken.
    Check("wakeup.pml", ("-DNO_PASS_ON",), liveness=True),
]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: the model checks need it (.ci/run installs it)")
    return path


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
    return done.stdout + done.stderr


def verify(check: Check, tmp_path: Path, *, quick: bool = False) -> str:
    """Spin's verifier for ``check``, built and run in ``tmp_path``: its report. ``quick``: a
    search expected to stop at its first counterexample, a few thousand states in: compiled
    without optimization (a third of a second, against one to two)."""
    spin, cc = tool("spin"), tool("cc")
    for source in MODELS.glob("*.pml"):
        shutil.copy(source, tmp_path)
    out = run([spin, "-a", *check.defines, check.model], tmp_path)
    assert (tmp_path / "pan.c").exists(), out
    flags = ["-DNOFAIR"] if not check.liveness else ["-DNOREDUCE"]
    if not check.liveness:
        flags += ["-DSAFETY", "-DCOLLAPSE"]
    out = run([cc, "-O0" if quick else "-O1", "-w", *flags, "-o", "pan", "pan.c"], tmp_path)
    assert (tmp_path / "pan").exists(), out
    pan = ["./pan", f"-m{DEPTH}"] + (["-a", "-f"] if check.liveness else [])
    report = run(pan, tmp_path)
    assert "max search depth too small" not in report, report
    return report


def errors(report: str) -> int:
    found = re.search(r"errors: (\d+)", report)
    assert found is not None, report
    return int(found.group(1))


@pytest.mark.parametrize("check", GOOD, ids=lambda c: c.name)
def test_model_holds(check: Check, tmp_path: Path) -> None:
    report = verify(check, tmp_path)
    assert errors(report) == 0, report
    assert "Search not completed" not in report, report
    assert not (tmp_path / f"{check.model}.trail").exists(), report


@pytest.mark.parametrize("check", BAD, ids=lambda c: c.name)
def test_bad_design_refuted(check: Check, tmp_path: Path) -> None:
    report = verify(check, tmp_path, quick=True)
    assert errors(report) >= 1, report
    kind = "acceptance cycle" if check.liveness else "assertion violated"
    assert kind in report, report
    # The counterexample replays: Spin follows the trail to the same violation.
    replay = run([tool("spin"), "-t", *check.defines, check.model], tmp_path)
    assert kind in replay or "<<<<<START OF CYCLE>>>>>" in replay, replay
