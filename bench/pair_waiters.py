"""What waiting locks over several resources cost while they wait: 200 threads of one process
each wait (``wait=6``) for a lock over ("a", "b<i>") while another engine holds "a"; measured over
3 s of their wait, after 1.5 s to settle: the waiting process's CPU (``time.process_time()``) and
the 3 masters' (``INFO cpu``, summed), each as % of one core. Not part of ``python -m bench``.

``.venv/bin/python -m bench.pair_waiters [waiters]``
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from django_redlock.engine import LockContended, Redlock
from django_redlock.testing.masters import LocalMaster, local_masters

SETTLE = 1.5
WINDOW = 3.0


def masters_cpu(masters: list[LocalMaster]) -> float:
    total = 0.0
    for master in masters:
        with master.client() as client:
            info = client.info("cpu")
        total += info["used_cpu_sys"] + info["used_cpu_user"]
    return total


def measure(waiters: int) -> str:
    with tempfile.TemporaryDirectory() as tmp, local_masters(3, Path(tmp)) as masters:
        urls = [m.url for m in masters]
        holder, engine = Redlock(urls), Redlock(urls)
        held = holder.lock("a", ttl=30).acquire()

        def wait(i: int) -> None:
            try:
                with engine.lock("a", f"b{i}", ttl=5, wait=SETTLE + WINDOW + 1.5):
                    pass
            except LockContended:
                pass

        threads = [threading.Thread(target=wait, args=(i,)) for i in range(waiters)]
        for thread in threads:
            thread.start()
        time.sleep(SETTLE)
        client, server, wall = time.process_time(), masters_cpu(masters), time.monotonic()
        time.sleep(WINDOW)
        wall = time.monotonic() - wall
        client = (time.process_time() - client) / wall
        server = (masters_cpu(masters) - server) / wall
        for thread in threads:
            thread.join()
        held.release()
        holder.close()
        engine.close()
    return (
        f"{waiters} waiting pair locks: client {100 * client:.1f}% of a core, "
        f"masters {100 * server:.1f}% (3 together)"
    )


if __name__ == "__main__":
    print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
