"""``python -m tests.cron_fire <unix time> <program> [args...]``: what cron does on one host: wait
until this process's wall clock reads ``<unix time>``, then run the program in its place.

Started under the clock shim (``django_redlock.testing.clock``) with an offset, it fires as a
host whose clock is that much off would: a clock 2 s late fires 2 s after the others.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    fire_at = float(sys.argv[1])
    while (left := fire_at - time.time()) > 0:  # the wall clock: the one cron reads
        time.sleep(min(left, 0.05))
    os.execv(sys.argv[2], sys.argv[2:])  # noqa: S606 (the test's own command line)


if __name__ == "__main__":
    main()
