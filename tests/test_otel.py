"""OpenTelemetry spans through real requests: redlock.acquire / redlock.release under Django's
request span (opentelemetry-instrumentation-django), with votes, attempts, wait and validity,
and one event per failing member; recorded by the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest
from django.test import Client
from opentelemetry import trace
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_redlock import LockContended, redlock
from django_redlock.contrib import otel
from tests.fencedapp.models import Ledger

from .conftest import printed_ok

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.fencedapp.urls")]

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def _provider() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)  # once per process: the API allows no second one


@pytest.fixture
def spans(_provider, redlock_settings) -> Iterator[InMemorySpanExporter]:
    DjangoInstrumentor().instrument()
    EXPORTER.clear()
    try:
        yield EXPORTER
    finally:
        DjangoInstrumentor().uninstrument()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_acquire_and_release_are_spans_under_the_request_span(spans):
    Ledger.objects.create(name="row")
    assert Client().get("/add/row/").status_code == 200
    (request,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    (acquire,) = named(spans, "redlock.acquire")
    (release,) = named(spans, "redlock.release")
    for span in (acquire, release):
        assert span.parent is not None
        assert span.parent.span_id == request.context.span_id
        assert span.context.trace_id == request.context.trace_id
        assert span.attributes["redlock.resource"] == "ledger:row"
        assert span.attributes["redlock.members"] == 5
        assert span.attributes["redlock.quorum"] == 3
        assert span.attributes["redlock.votes_for"] == 5
        assert span.attributes["redlock.votes_against"] == 0
    assert acquire.attributes["redlock.attempts"] == 1
    assert 0 <= acquire.attributes["redlock.wait"] < 1
    assert 0 < acquire.attributes["redlock.validity"] <= 1.0  # the view's ttl
    assert release.attributes["redlock.validity"] == 0.0  # released
    assert acquire.end_time <= release.start_time


def test_a_failing_member_is_an_event_and_a_vote_against(spans, redlock_settings):
    # Killed, so it refuses the connection at once: a failed vote the round sees. (A paused
    # member is no failure here: the acquisition returns once a quorum granted, without it.)
    Ledger.objects.create(name="row")
    redlock_settings[4].kill()
    try:
        assert Client().get("/add/row/").status_code == 200
    finally:
        redlock_settings[4].start()
    (acquire,) = named(spans, "redlock.acquire")
    assert (
        acquire.attributes["redlock.votes_for"],
        acquire.attributes["redlock.votes_against"],
    ) == (4, 1)
    (event,) = acquire.events
    assert event.name == "redlock.member_failed"
    assert event.attributes["redlock.member"] == redlock_settings[4].url
    assert event.attributes["redlock.reason"] == "error"


def test_a_contended_acquire_is_an_error_span_with_every_refusal(spans, redlock_of, masters):
    Ledger.objects.create(name="row")
    with redlock_of(masters).lock("ledger:row", ttl=5):  # another engine: another owner
        EXPORTER.clear()  # only the request's spans from here
        assert Client().get("/add/row/").status_code == 423
    (acquire,) = named(spans, "redlock.acquire")
    assert acquire.status.status_code is StatusCode.ERROR
    assert acquire.attributes["redlock.votes_against"] == 5
    assert acquire.attributes["redlock.votes_for"] == 0
    assert {e.attributes["redlock.reason"] for e in acquire.events if e.name != "exception"} == {
        "held"
    }
    assert any(e.name == "exception" for e in acquire.events)
    assert LockContended.__name__ in acquire.status.description


def test_extend_is_a_span(spans):
    with redlock("ledger:extend", ttl=5) as lock:
        lock.extend(ttl=10)
    (extend,) = named(spans, "redlock.extend")
    assert extend.attributes["redlock.votes_for"] == 5
    assert 9 < extend.attributes["redlock.validity"] <= 10


def test_without_opentelemetry_locks_make_no_span(redlock_settings, monkeypatch):
    """No opentelemetry installed (its import fails): tracer() is None and locks work."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    otel._api.cache_clear()
    try:
        assert otel.tracer() is None
        EXPORTER.clear()
        with redlock("ledger:plain", ttl=5) as lock:
            lock.extend()
        assert EXPORTER.get_finished_spans() == ()
    finally:
        otel._api.cache_clear()


def test_without_a_tracer_provider_locks_make_no_span():
    """opentelemetry-api installed but no provider set (its default: spans that record nothing):
    no span is made at all (they cost a fifth of a cycle); one set later is used from then on.
    In a fresh process: this one's provider is set once for the module above."""
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from django_redlock.contrib import otel\n"
        "assert otel.tracer() is None, otel.tracer()\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "assert otel.tracer() is not None\n"
        "print('ok')\n"
    )
    printed_ok(code)


def test_a_provider_named_by_the_environment_is_used():
    """``OTEL_PYTHON_TRACER_PROVIDER`` names a provider that the API makes when first asked:
    locks are traced with it although no code set one (``tracer()`` does not ask the API while
    no provider is set and the environment names none). In a fresh process, as above."""
    code = (
        "from django_redlock.contrib import otel\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "assert otel.tracer() is not None\n"
        "assert isinstance(trace.get_tracer_provider(), TracerProvider)\n"
        "print('ok')\n"
    )
    printed_ok(code, {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"})


def test_async_acquire_and_release_are_spans_with_their_votes(spans):
    """``async with``: the spans wrap the awaited operations, and the engine's events, sent
    while each one runs, reach them (the acquisition's attempts and votes, the release's)."""

    async def hold() -> None:
        async with redlock("ledger:async", ttl=5):
            pass

    asyncio.run(hold())
    (acquire,) = named(spans, "redlock.acquire")
    (release,) = named(spans, "redlock.release")
    for span in (acquire, release):
        assert span.attributes["redlock.resource"] == "ledger:async"
        assert span.attributes["redlock.votes_for"] == 5
        assert span.attributes["redlock.votes_against"] == 0
    assert acquire.attributes["redlock.attempts"] == 1
    assert 0 < acquire.attributes["redlock.validity"] <= 5
    assert release.attributes["redlock.validity"] == 0.0
    assert acquire.end_time <= release.start_time
