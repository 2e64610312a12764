"""Prometheus metrics for every lock, when ``prometheus_client`` is installed (the ``prometheus``
extra); otherwise every function here does nothing.

The collectors register in ``prometheus_client.REGISTRY`` on first use (never at import): when
``redlock()`` first builds the process's engine, so a project's existing ``/metrics`` endpoint
exports them; call ``enabled()`` once (in a metrics view or ``AppConfig.ready``) to export them,
at zero, before the first lock.

No metric is labelled by resource: resource names carry ids from requests, and a label per id
would grow without bound. The two permit gauges are the exception: a semaphore's name is one
chosen in code ("exports"), and a name is exported only while this process holds or waits for
one of its permits (read at scrape time, so it costs nothing per acquisition). The ``node``
label is the master's address with any password masked (bounded by the ``NODES`` setting).

==============================  =========  =========================================================
name                            type       meaning
==============================  =========  =========================================================
redlock_acquire_wait_seconds    histogram  time from the first attempt to the outcome,
                                           label ``outcome`` = acquired|contended|unavailable
redlock_hold_seconds            histogram  time from acquisition to release
redlock_contended_total         counter    acquisitions that failed, label ``reason`` =
                                           contended|unavailable
redlock_lost_total              counter    leases lost while held
redlock_node_failures_total     counter    per master, why it failed a failed acquisition:
                                           label ``node``, ``reason`` =
                                           timeout|error|quarantine|replica ack
redlock_permits_in_use          gauge      this process's permits held, per semaphore: ``name``
redlock_permits_waiting         gauge      this process's callers waiting for a permit: ``name``
redlock_template_wait_seconds   histogram  as ``redlock_acquire_wait_seconds``, by lock template:
                                           labels ``template``, ``outcome``
redlock_template_hold_seconds   histogram  as ``redlock_hold_seconds``, by lock template: label
                                           ``template``
redlock_job_runs_total          counter    guarded jobs (commands, Celery tasks, leaders), label
                                           ``job`` = the command/task/leader name, ``outcome`` =
                                           ran|skipped|lost|unavailable
redlock_job_seconds             histogram  how long a guarded job ran (outcome ran or lost),
                                           label ``job``
==============================  =========  =========================================================

The ``template`` label is the resource as written before formatting: ``lock_view`` and
``@locked`` give their key templates (``"order:{order_id}"``), guarded commands their lock
(``command:<name>``), ``redlock(..., template="invoice:{id}")`` one of your own; any other lock
counts as ``(untemplated)``. Never the formatted resource: one series per template, not per id.
Jobs are labelled by the name of the command, task or leader (a bounded set, written in code),
never by the formatted key (``report:42``), which carries ids.

The four wait and hold histograms are observed on every lock's cycle: they are recorded by
``histograms.py`` (exported exactly as ``prometheus_client.Histogram`` would export them, at a
fifth of its cost per observation), and are prometheus_client's own in its multiprocess mode.

Node failures are counted from failed acquisitions only: the engine reports per-master detail on
failure, not on success.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

from ..engine import LockContended, LockNotAcquired, NodeFailure
from ..engine.kinds.permit import USAGE

# Lock waits range from one round trip (sub-millisecond on a LAN) to a configured wait of seconds.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Holds range from a quick view to a nightly command.
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


#: The template label of a lock made without one (the engine's own locks included).
UNTEMPLATED = "(untemplated)"


class _Collectors(NamedTuple):
    waits: Any  # (the wait histograms, overall by outcome and per template: _timings())
    holds: Any  # (the hold histograms)
    contended: Any
    lost: Any
    permits: Any
    node_failures: Any
    job_runs: Any
    job_seconds: Any


class _Timing(NamedTuple):
    """A timing histogram and its per-template twin (labelled ``template`` + ``labels``)."""

    name: str
    documentation: str
    template_name: str
    template_documentation: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...]


_WAITS = _Timing(
    "redlock_acquire_wait_seconds",
    "Seconds from the first attempt to acquire a lock to the outcome.",
    "redlock_template_wait_seconds",
    "Seconds from the first attempt to acquire a lock to the outcome, by lock template.",
    ("outcome",),
    WAIT_BUCKETS,
)
_HOLDS = _Timing(
    "redlock_hold_seconds",
    "Seconds a lock was held, from acquisition to release.",
    "redlock_template_hold_seconds",
    "Seconds a lock was held, from acquisition to release, by lock template.",
    (),
    HOLD_BUCKETS,
)


@cache
def _collectors() -> _Collectors | None:
    try:
        import prometheus_client as prom
    except ImportError:
        return None
    waits, holds = _timings(prom, prom.REGISTRY, _WAITS, _HOLDS)
    return _Collectors(
        waits=waits,
        holds=holds,
        contended=prom.Counter(
            "redlock_contended",
            "Acquisitions that failed: held by another owner, or no quorum of masters.",
            ["reason"],
        ),
        lost=prom.Counter("redlock_lost", "Leases lost while held (expired or released by force)."),
        permits=_register_permits(prom),
        node_failures=prom.Counter(
            "redlock_node_failures",
            "Masters that failed a request of a lock (timeout or error), by master: during a "
            "failed acquisition, or one that succeeded without them (acquire, extend, release).",
            ["node", "reason"],
        ),
        job_runs=prom.Counter(
            "redlock_job_runs",
            "Guarded jobs (commands, Celery tasks, leaders) by name and outcome: ran, skipped "
            "(held elsewhere), lost (its lock was lost while it ran), unavailable (no quorum).",
            ["job", "outcome"],
        ),
        job_seconds=prom.Histogram(
            "redlock_job_seconds",
            "Seconds a guarded job ran, by name.",
            ["job"],
            buckets=HOLD_BUCKETS,
        ),
    )


def _timings(prom: Any, registry: Any, *timings: _Timing) -> list[Any]:
    """The histograms of ``timings``, registered in ``registry`` in the order prometheus_client's
    own would be (overall ones first, then per template): ours (``histograms.py``: observed on
    every lock's cycle), or ``prometheus_client.Histogram`` in its multiprocess mode, where only
    its own values reach the files that the scrape reads."""
    from prometheus_client import values

    if values.ValueClass is not values.MutexValue:  # (multiprocess mode)
        overall = [
            prom.Histogram(
                t.name, t.documentation, list(t.labels), buckets=t.buckets, registry=registry
            )
            for t in timings
        ]
        by_template = [
            prom.Histogram(
                t.template_name,
                t.template_documentation,
                ["template", *t.labels],
                buckets=t.buckets,
                registry=registry,
            )
            for t in timings
        ]
        return [_PrometheusHistograms(*pair) for pair in zip(overall, by_template, strict=True)]
    from .histograms import Histograms

    ours = [Histograms(*timing) for timing in timings]
    families = [histograms.collectors() for histograms in ours]
    for which in (0, 1):
        for collectors in families:
            registry.register(collectors[which])
    return ours


class _PrometheusHistograms:
    """A histogram and its per-template twin as ``prometheus_client.Histogram`` objects, with
    ``histograms.Histograms``'s ``series()``."""

    def __init__(self, overall: Any, by_template: Any) -> None:
        self._overall = overall
        self._by_template = by_template

    def series(self, template: str, *labels: str) -> _Both:
        overall = self._overall.labels(*labels) if labels else self._overall
        return _Both(overall, self._by_template.labels(template, *labels))


class _Both:
    """Observes in two ``prometheus_client`` histograms."""

    __slots__ = ("_by_template", "_overall")

    def __init__(self, overall: Any, by_template: Any) -> None:
        self._overall = overall
        self._by_template = by_template

    def observe(self, seconds: float) -> None:
        self._overall.observe(seconds)
        self._by_template.observe(seconds)


class _Permits:
    """A collector: permits in use and waiters per semaphore name, from ``engine.permit_lock``."""

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        in_use = GaugeMetricFamily(
            "redlock_permits_in_use",
            "Permits held by this process, per semaphore.",
            labels=["name"],
        )
        waiting = GaugeMetricFamily(
            "redlock_permits_waiting",
            "Callers in this process waiting for a permit, per semaphore.",
            labels=["name"],
        )
        for name, (held, waiters) in USAGE.snapshot().items():
            in_use.add_metric([name], held)
            waiting.add_metric([name], waiters)
        return [in_use, waiting]


def _register_permits(prom: Any) -> _Permits:
    collector = _Permits()
    prom.REGISTRY.register(collector)
    return collector


def warm() -> None:
    """Import ``prometheus_client`` if it is installed (``AppConfig.ready``); registers nothing."""
    try:
        import prometheus_client  # noqa: F401
        import prometheus_client.core  # noqa: F401 (the permits collector's first collect)
    except ImportError:
        return
    from . import histograms  # noqa: F401 (ours, imported by the first lock's ``_collectors``)


def enabled() -> bool:
    """True when ``prometheus_client`` is importable and the metrics are being recorded."""
    return _collectors() is not None


def acquired(waited: float, template: str = UNTEMPLATED) -> None:
    # (The series kept per template, here and in ``released``: saves 10.4k instructions a
    # ``with redlock(r)`` cycle, 2.5%, callgrind.)
    series = _waits.get((template, "acquired"))
    if series is None:
        if _collectors() is None:
            return
        series = _wait(template, "acquired")
    series.observe(waited)


def _wait(template: str, outcome: str) -> Any:
    """The wait histograms' series of ``template`` and ``outcome`` (both histograms': overall
    and per template). Kept: the templates are bounded (see the module's docstring), and so is
    this table."""
    c = _collectors()
    assert c is not None  # noqa: S101 (asked only when it is)
    series = _waits[template, outcome] = c.waits.series(template, outcome)
    return series


def _hold(template: str) -> Any:
    c = _collectors()
    assert c is not None  # noqa: S101
    series = _holds[template] = c.holds.series(template)
    return series


_waits: dict[tuple[str, str], Any] = {}
_holds: dict[str, Any] = {}


def not_acquired(waited: float, error: LockNotAcquired, template: str = UNTEMPLATED) -> None:
    c = _collectors()
    if c is None:
        return
    reason = "contended" if isinstance(error, LockContended) else "unavailable"
    (_waits.get((template, reason)) or _wait(template, reason)).observe(waited)
    c.contended.labels(reason=reason).inc()
    for failure in error.failures:
        node_failure(failure)


def node_failure(failure: NodeFailure) -> None:
    """A master failed a request (a timeout or an error; "held" is another owner's lock, and
    "gone" our expired one: not faults of the master)."""
    c = _collectors()
    if c is not None and failure.reason in ("timeout", "error", "quarantine", "replica ack"):
        c.node_failures.labels(node=failure.node, reason=failure.reason).inc()


def released(held: float, template: str = UNTEMPLATED) -> None:
    series = _holds.get(template)  # (as in ``acquired``)
    if series is None:
        if _collectors() is None:
            return
        series = _hold(template)
    series.observe(held)


def lost() -> None:
    c = _collectors()
    if c is not None:
        c.lost.inc()


#: The outcomes of a guarded job.
JOB_OUTCOMES = ("ran", "skipped", "lost", "unavailable")


def job(name: str, outcome: str, seconds: float | None = None) -> None:
    """A guarded job ``name`` (a command, task or leader name: never a formatted key) ended with
    ``outcome``; ``seconds``: how long it ran, if it ran."""
    if outcome not in JOB_OUTCOMES:
        raise ValueError(f"job outcome must be one of {JOB_OUTCOMES}, got {outcome!r}")
    c = _collectors()
    if c is None:
        return
    c.job_runs.labels(job=name, outcome=outcome).inc()
    if seconds is not None:
        c.job_seconds.labels(job=name).observe(seconds)
