"""This process's id, read once and kept current across ``fork()``.

Leases remember the process that took them (a forked child neither renews nor releases its
parent's locks), and that is checked on every acquire and release: ``os.getpid()`` is a system
call, this is an attribute read.
"""

from __future__ import annotations

import os

#: This process's id (read as ``process.pid``: an attribute, not a call, since every acquire and
#: release checks it several times, and a Python call costs ~400 CPU instructions).
pid = os.getpid()


def _after_fork_in_child() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)
