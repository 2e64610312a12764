"""Fault injection with checkers that can fail: client processes do critical sections on real
redis-server masters while scenarios kill, pause, slow, flush and restart them; the checkers
(lost updates, interval sweep, fencing) judge what the clients recorded.

Run ``python -m bench.chaos`` (full size) or see ``bench/chaos/README.md``; the CI-sized run is
``tests/test_chaos.py``.
"""
