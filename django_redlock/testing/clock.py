"""Step a local master's wall clock, as an administrator's ``date -s`` or a stepping time daemon
would: for the wall-clock hazard (Redis expires keys by each master's own wall clock).

``clock_shim(dir)`` builds ``clockshift.c`` (an ``LD_PRELOAD`` library, see its header) with the C
compiler on PATH; ``shifted_clock_env(shim)`` is the environment that makes a master use it; and
``step_clock(master, seconds)`` moves that master's clock. A machine without a C compiler gets
a ``RuntimeError`` saying so (CI installs gcc), never a silent skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .masters import LocalMaster

SOURCE = Path(__file__).with_name("clockshift.c")
#: Read by the shim at every clock call, relative to the master's --dir (its working directory).
OFFSET_FILE = "clock-offset-ms"


def clock_shim(build_dir: Path) -> Path:
    """Compile the shim into ``build_dir`` (once) and return the library's path."""
    library = build_dir / "libclockshift.so"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(
            "no C compiler (cc or gcc) on PATH to build the clock-step shim: install one "
            "(apt-get install -y gcc)"
        )
    build_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(  # noqa: S603 (our own source, fixed arguments)
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    return library


def shifted_clock_env(shim: Path) -> dict[str, str]:
    """The environment under which a redis-server's wall clock follows ``step_clock``."""
    return {"LD_PRELOAD": str(shim), "CLOCKSHIFT_FILE": OFFSET_FILE}


def step_clock(master: LocalMaster, seconds: float) -> None:
    """Set ``master``'s wall clock to the real one plus ``seconds`` (0 puts it back)."""
    (master.workdir / OFFSET_FILE).write_text(str(round(seconds * 1000)))
