"""Masters one network hop away: a ``DelayProxy`` (``django_redlock.testing.proxy``) in front
of each, adding ``delay`` seconds each way, served by a process of their own.

Why a separate process: the proxies forward bytes in Python threads; in the measuring process they
would compete with the implementation under test for the GIL, and the measurement would include
that contention rather than the network hop alone.

``python -m bench.proxies <delay> <port>...`` prints the proxies' ports as one JSON list, then
forwards until its stdin closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from django_redlock.testing.proxy import DelayProxy

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def delayed(ports: Sequence[int], delay: float) -> Iterator[list[int]]:
    """Proxies for the masters on ``ports``, each adding ``delay`` seconds each way; yields the
    proxies' ports, in the same order."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.proxies", str(delay), *map(str, ports)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the proxy process exited with {proc.wait()}")
        yield [int(p) for p in json.loads(line)]
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> None:
    delay = float(sys.argv[1])
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(DelayProxy(int(p), delay)) for p in sys.argv[2:]]
        print(json.dumps([p.port for p in proxies]), flush=True)
        sys.stdin.read()  # until the benchmark closes our stdin


if __name__ == "__main__":
    main()
