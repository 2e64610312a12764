"""Benchmarks for django-redlock against the raw protocol floor and peer libraries.

Run ``python -m bench`` (every scenario) or ``python -m bench cycle``; see ``bench/README.md``.
Benchmarks never run in the test suite and never assert speed.
"""
