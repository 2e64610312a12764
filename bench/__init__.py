"""Benchmarks for django-redlock side by side with the raw protocol floor and peer libraries.

Run ``python -m bench`` (every scenario, then the chart) or ``python -m bench a c`` (some of
them); see ``bench/README.md``. Benchmarks never run in the test suite and never assert speed.
``bench/chaos`` is a separate fault-injection suite (``python -m bench.chaos``).
"""
