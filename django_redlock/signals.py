"""Signals sent by every lock made through ``django_redlock.redlock`` (and the Django surfaces).

Each is sent with ``sender=Lock`` (the class) and ``lock=<the Lock>``, plus:

- ``lock_acquired``: ``waited`` (seconds), ``attempts``
- ``lock_contended``: ``waited``, ``error`` (``LockContended`` or ``QuorumUnavailable``)
- ``lock_released``: ``held`` (seconds)
- ``lock_lost``: ``error`` (``LockLost``); sent once per lease, from the thread or task that
  noticed (the holder, or the auto-extend watchdog)

Receivers must be quick and must not raise: what they raise is logged and ignored.
"""

from django.dispatch import Signal

lock_acquired = Signal()
lock_contended = Signal()
lock_released = Signal()
lock_lost = Signal()
