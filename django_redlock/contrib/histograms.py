"""The lock-timing histograms of ``prometheus.py`` (waits and holds, overall and per template),
recorded at a fifth of what ``prometheus_client.Histogram`` costs and exported exactly as it
would export them.

Why: every lock's cycle observes its wait and its hold, each in two histograms (overall and per
template). ``Histogram.observe`` takes two locks (the sum's, then the bucket's), checks its labels
and scans the buckets in Python: 8,600 instructions each (callgrind), 34,000 per cycle, the
largest part of the Django layer's cost. Here one observation finds its bucket by bisection and
counts it in the template's series and in the overall series under one lock: 3,600 instructions
for both.

The scrape sees what ``Histogram`` shows: the same families, in the same order, with the same
names, help, labels, cumulative ``_bucket`` values, ``_count``, ``_sum`` and ``_created`` (unless
prometheus_client's created series are disabled), as floats; and the registry refuses another
collector of the same names as it would. Not in prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``): there every value must be written to the process's files, and
``prometheus.py`` uses ``Histogram`` itself.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any


class Series:
    """One series of a per-template histogram: its count per bucket (not cumulative: the scrape
    adds them up), its sum, when it was made; and the overall series it also counts in."""

    __slots__ = ("_bounds", "_lock", "counts", "created", "overall", "sum")

    def __init__(self, bounds: tuple[float, ...], lock: threading.Lock, overall: Series | None):
        self._bounds = bounds
        self._lock = lock
        self.counts = [0] * (len(bounds) + 1)  # (the last: +Inf)
        self.sum = 0.0
        self.created = time.time()
        self.overall = overall

    def observe(self, seconds: float) -> None:
        """Count ``seconds`` here and in the overall series."""
        i = bisect_left(self._bounds, seconds)  # the first bound >= seconds: Histogram's bucket
        overall, lock = self.overall, self._lock
        # ``with``, not acquire() then ``try``: an exception landing between those two (Ctrl-C,
        # a signal handler's) would leave the lock held and every later metric call blocked.
        with lock:
            self.counts[i] += 1
            self.sum += seconds
            if overall is not None:
                overall.counts[i] += 1
                overall.sum += seconds


class Histograms:
    """A histogram (``name``, labels ``labelnames``) and its per-template twin
    (``template_name``, labels ``template`` + ``labelnames``): ``series(template, *labels)``
    counts in both. ``collectors()``: the two, to register in that order."""

    def __init__(
        self,
        name: str,
        documentation: str,
        template_name: str,
        template_documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
    ) -> None:
        self._bounds = tuple(float(b) for b in buckets)
        self._le = [_go_float(b) for b in (*self._bounds, float("inf"))]
        self._lock = threading.Lock()
        self._labelnames = tuple(labelnames)
        self._overall: dict[tuple[str, ...], Series] = {}
        self._by_template: dict[tuple[str, ...], Series] = {}
        self._families = (
            (name, documentation, self._labelnames, self._overall),
            (template_name, template_documentation, ("template", *labelnames), self._by_template),
        )
        if not labelnames:  # (an unlabelled histogram exists, at zero, from its creation)
            self._overall[()] = Series(self._bounds, self._lock, None)

    def series(self, template: str, *labels: str) -> Series:
        """The series of ``template`` and ``labels`` (made on first use: keep it)."""
        key = (str(template), *map(str, labels))
        with self._lock:
            series = self._by_template.get(key)
            if series is None:
                overall = self._overall.get(key[1:])
                if overall is None:
                    overall = self._overall[key[1:]] = Series(self._bounds, self._lock, None)
                series = self._by_template[key] = Series(self._bounds, self._lock, overall)
        return series

    def collectors(self) -> tuple[Any, Any]:
        return _Family(self, 0), _Family(self, 1)

    def collect(self, which: int) -> list[Any]:
        from prometheus_client import metrics as prometheus_metrics
        from prometheus_client.core import HistogramMetricFamily

        name, documentation, labelnames, table = self._families[which]
        family = HistogramMetricFamily(name, documentation, labels=labelnames)
        with self._lock:
            rows = [(k, list(s.counts), s.sum, s.created) for k, s in table.items()]
        created = getattr(prometheus_metrics, "_use_created", True)  # (disable_created_metrics)
        for key, counts, total, made in rows:
            buckets, running = [], 0.0
            for le, count in zip(self._le, counts, strict=True):
                running += count
                buckets.append((le, running))
            family.add_metric(key, buckets, total)
            if created:
                family.add_sample(f"{name}_created", dict(zip(labelnames, key, strict=True)), made)
        return [family]

    def describe(self, which: int) -> list[Any]:
        from prometheus_client.core import HistogramMetricFamily

        name, documentation, labelnames, _ = self._families[which]
        return [HistogramMetricFamily(name, documentation, labels=labelnames)]


class _Family:
    """One of the two histograms, as a collector for a registry."""

    def __init__(self, histograms: Histograms, which: int) -> None:
        self._histograms = histograms
        self._which = which

    def collect(self) -> Iterable[Any]:
        return self._histograms.collect(self._which)

    def describe(self) -> Iterable[Any]:
        # (The names it will export: the registry refuses a second collector of the same.)
        return self._histograms.describe(self._which)


def _go_float(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]
