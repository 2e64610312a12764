"""Signals sent by every lock made through ``django_redlock.redlock`` (and the Django surfaces).

Each is sent with ``sender=Lock`` (the class) and ``lock=<the Lock>``, plus:

- ``lock_acquired``: ``waited`` (seconds), ``attempts``
- ``lock_contended``: ``waited``, ``error`` (``LockContended`` or ``QuorumUnavailable``)
- ``lock_released``: ``held`` (seconds)
- ``lock_lost``: ``error`` (``LockLost``); sent once per lease, from the thread or task that
  noticed (the holder, a release that found it gone, or the watchdog, also when a lease that is
  not auto-extended simply runs out)
- ``masters_failed``: ``action`` ("acquire", "extend" or "release": it succeeded) and
  ``failures`` (``NodeFailure`` per master that failed meanwhile): the lock works, but one more
  failure there may cost the quorum

Receivers must be quick and must not raise: what they raise is logged and ignored.
"""

from django.dispatch import Signal

# ``use_caching``: each send finds its receivers in a per-sender cache (cleared on every
# connect and disconnect, as for Django's model signals) instead of filtering every receiver
# under a lock: two of these are sent on every lock's cycle.
lock_acquired = Signal(use_caching=True)
lock_contended = Signal(use_caching=True)
lock_released = Signal(use_caching=True)
lock_lost = Signal(use_caching=True)
masters_failed = Signal(use_caching=True)
