"""The wait and hold histograms (``contrib/histograms.py``, behind ``contrib/prometheus.py``): a
scrape must read exactly what ``prometheus_client.Histogram`` objects fed the same observations
would export, counts must survive threads, and prometheus_client's multiprocess mode must still
see them."""

from __future__ import annotations

import re
import threading
import time

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from django_redlock import redlock
from django_redlock.contrib import prometheus
from django_redlock.contrib.histograms import Histograms
from django_redlock.contrib.prometheus import HOLD_BUCKETS, WAIT_BUCKETS

from .conftest import fresh_python

#: What each lock's outcome was observed as: (template, outcome or None for holds, seconds);
#: on bucket bounds, between them, below the first, past the last, zero, negative.
OBSERVED = [
    ("report:{id}", "acquired", 0.001),
    ("(untemplated)", "acquired", 0.0004),
    ("report:{id}", "contended", 0.25),
    ("order:{pk}", "acquired", 61.0),
    ("report:{id}", "acquired", 0.0025),
    ("order:{pk}", "unavailable", 0.0),
    ("report:{id}", "acquired", -0.5),
    ("report:{id}", None, 0.01),
    ("order:{pk}", None, 3600.0),
    ("order:{pk}", None, 4000.5),
    ("(untemplated)", None, 0.333),
    ("report:{id}", None, 0.01 + 1e-12),
]


def _reference(registry: CollectorRegistry) -> tuple[dict, dict]:
    """The histograms as prometheus.py declared them with prometheus_client's ``Histogram``
    (before histograms.py): names, help, labels and buckets written out here, on purpose."""
    wait = Histogram(
        "redlock_acquire_wait_seconds",
        "Seconds from the first attempt to acquire a lock to the outcome.",
        ["outcome"],
        buckets=WAIT_BUCKETS,
        registry=registry,
    )
    hold = Histogram(
        "redlock_hold_seconds",
        "Seconds a lock was held, from acquisition to release.",
        buckets=HOLD_BUCKETS,
        registry=registry,
    )
    template_wait = Histogram(
        "redlock_template_wait_seconds",
        "Seconds from the first attempt to acquire a lock to the outcome, by lock template.",
        ["template", "outcome"],
        buckets=WAIT_BUCKETS,
        registry=registry,
    )
    template_hold = Histogram(
        "redlock_template_hold_seconds",
        "Seconds a lock was held, from acquisition to release, by lock template.",
        ["template"],
        buckets=HOLD_BUCKETS,
        registry=registry,
    )
    return {"wait": wait, "template_wait": template_wait}, {
        "hold": hold,
        "template_hold": template_hold,
    }


def _observe_reference(waits: dict, holds: dict) -> None:
    for template, outcome, seconds in OBSERVED:
        if outcome is None:
            holds["hold"].observe(seconds)
            holds["template_hold"].labels(template=template).observe(seconds)
        else:
            waits["wait"].labels(outcome=outcome).observe(seconds)
            waits["template_wait"].labels(template=template, outcome=outcome).observe(seconds)


def _observe_ours(waits: Histograms, holds: Histograms) -> None:
    for template, outcome, seconds in OBSERVED:
        if outcome is None:
            holds.series(template).observe(seconds)
        else:
            waits.series(template, outcome).observe(seconds)


def _scrapes() -> tuple[CollectorRegistry, CollectorRegistry]:
    reference, ours = CollectorRegistry(), CollectorRegistry()
    _observe_reference(*_reference(reference))
    # prometheus.py's own construction (registered in the given registry, in its order)
    waits, holds = prometheus._timings(
        prometheus_client, ours, prometheus._WAITS, prometheus._HOLDS
    )
    assert isinstance(waits, Histograms)
    _observe_ours(waits, holds)
    return reference, ours


CREATED = re.compile(rb"^(\w+_created(?:\{.*\})?) [0-9.e+]+$", re.MULTILINE)


@pytest.mark.parametrize("exposition", [generate_latest, openmetrics_latest])
def test_a_scrape_reads_what_prometheus_clients_histograms_would_export(exposition):
    reference, ours = _scrapes()
    expected, got = exposition(reference), exposition(ours)
    labels = {"template": "report:{id}", "outcome": "acquired", "le": "0.001"}
    assert ours.get_sample_value("redlock_template_wait_seconds_bucket", labels) == 2.0
    assert ours.get_sample_value("redlock_hold_seconds_count", {}) == 5.0
    # Identical but for the creation times (each series' own time.time() when it was made).
    assert CREATED.sub(rb"\1 T", got) == CREATED.sub(rb"\1 T", expected)
    assert len(CREATED.findall(got)) == len(CREATED.findall(expected)) == 3 + 5 + 1 + 3


def test_created_times_are_the_series_own_and_can_be_switched_off_as_prometheus_clients():
    before = time.time()
    reference, ours = _scrapes()
    created = [
        float(v) for v in re.findall(rb"_created.* ([0-9.e+]+)$", generate_latest(ours), re.M)
    ]
    assert len(created) == 3 + 5 + 1 + 3
    assert all(before <= c <= time.time() for c in created)
    prometheus_client.disable_created_metrics()
    try:
        assert generate_latest(ours) == generate_latest(reference)  # byte for byte
        assert b"_created" not in generate_latest(ours)
    finally:
        prometheus_client.enable_created_metrics()


def test_the_registry_refuses_a_second_collector_of_the_same_names_as_it_would_histograms():
    registry = CollectorRegistry()
    prometheus._timings(prometheus_client, registry, prometheus._WAITS, prometheus._HOLDS)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("redlock_template_hold_seconds", "again", ["template"], registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("redlock_acquire_wait_seconds_count", "again", registry=registry)


def test_observations_from_many_threads_are_all_counted():
    registry = CollectorRegistry()
    waits, _ = prometheus._timings(
        prometheus_client, registry, prometheus._WAITS, prometheus._HOLDS
    )
    threads, each = 8, 5_000
    start = threading.Barrier(threads)

    def observe(n: int) -> None:
        # Half of the threads share one series; all of them share the overall one.
        series = waits.series("shared" if n % 2 else f"own:{n}", "acquired")
        start.wait()
        for _ in range(each):
            series.observe(0.5)

    workers = [threading.Thread(target=observe, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    value = registry.get_sample_value
    assert value("redlock_acquire_wait_seconds_count", {"outcome": "acquired"}) == threads * each
    assert value("redlock_acquire_wait_seconds_sum", {"outcome": "acquired"}) == threads * each / 2
    assert value("redlock_acquire_wait_seconds_bucket", {"outcome": "acquired", "le": "0.25"}) == 0
    shared = {"template": "shared", "outcome": "acquired"}
    assert value("redlock_template_wait_seconds_count", shared) == threads // 2 * each
    assert value("redlock_template_wait_seconds_bucket", {**shared, "le": "0.5"}) == (
        threads // 2 * each
    )


def test_a_real_scrape_after_real_locks(redlock_settings):
    """``generate_latest(REGISTRY)``, as a project's /metrics view calls it, after locks taken
    through ``redlock()``: the hold and wait series of their template moved."""
    assert prometheus.enabled()

    def counts() -> tuple[float, float]:
        text = generate_latest(prometheus_client.REGISTRY).decode()
        hold = re.search(r'^redlock_template_hold_seconds_count\{template="scrape:\{n\}"\} (\S+)$',
                         text, re.MULTILINE)  # fmt: skip
        wait = re.search(r'^redlock_acquire_wait_seconds_count\{outcome="acquired"\} (\S+)$',
                         text, re.MULTILINE)  # fmt: skip
        return (float(hold[1]) if hold else 0.0), (float(wait[1]) if wait else 0.0)

    holds, waits = counts()
    for n in range(3):
        with redlock(f"scrape:{n}", template="scrape:{n}"):
            pass
    assert counts() == (holds + 3, waits + 3)


def test_multiprocess_mode_keeps_prometheus_clients_histograms(tmp_path):
    """With PROMETHEUS_MULTIPROC_DIR, values must reach the process's files (the scrape of any
    process reads them all): prometheus.py uses prometheus_client's own histograms there."""
    code = (
        "from prometheus_client import CollectorRegistry, multiprocess\n"
        "from django_redlock.contrib import prometheus\n"
        "prometheus.acquired(0.002, 'job:{n}'); prometheus.acquired(0.004, 'job:{n}')\n"
        "prometheus.released(1.5, 'job:{n}')\n"
        "registry = CollectorRegistry(); multiprocess.MultiProcessCollector(registry)\n"
        "value = registry.get_sample_value\n"
        "print(value('redlock_acquire_wait_seconds_count', {'outcome': 'acquired'}),\n"
        "      value('redlock_template_wait_seconds_count',\n"
        "            {'template': 'job:{n}', 'outcome': 'acquired'}),\n"
        "      value('redlock_hold_seconds_sum', {}),\n"
        "      value('redlock_template_hold_seconds_count', {'template': 'job:{n}'}))\n"
    )
    done = fresh_python(code, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2.0", "2.0", "1.5", "1.0"]


def test_an_exception_from_a_signal_handler_never_leaves_the_lock_held():
    """A signal handler (Ctrl-C) runs when a call returns: wherever in ``observe()`` that is,
    the exception it raises must not leave the series' lock held (every later metric call of
    the process would block on it forever). The trace raises where a handler could: at the
    instruction after each call."""
    import dis
    import sys

    from django_redlock.contrib.histograms import Series

    code = Series.observe.__code__
    instructions = list(dis.get_instructions(code))
    ends = [  # where each call returns to (its inline caches skipped)
        after.offset
        for ins, after in zip(instructions, instructions[1:], strict=False)
        if ins.opname == "CALL"
    ]
    assert len(ends) >= 2  # the bucket's bisect, the lock's acquire or exit

    class Interrupted(Exception):
        pass

    for offset in ends:
        lock = threading.Lock()
        series = Series((0.1, 1.0), lock, None)

        def local(frame, event, arg, offset=offset):
            if event == "opcode" and frame.f_lasti == offset:
                raise Interrupted
            return local

        def tracer(frame, event, arg):
            if frame.f_code is not code:
                return None
            frame.f_trace_opcodes = True
            return local

        sys.settrace(tracer)
        try:
            series.observe(0.5)
        except Interrupted:
            pass
        finally:
            sys.settrace(None)
        assert not lock.locked(), f"interrupted at offset {offset}: the lock stays held"
