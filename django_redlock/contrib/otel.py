"""OpenTelemetry spans for the locks of the Django layer, when ``opentelemetry-api`` is installed
(the ``otel`` extra); without it, nothing here is imported or costs anything but one cached
lookup per lock operation.

Spans ``redlock.acquire``, ``redlock.extend`` and ``redlock.release``, children of whatever span
is current (Django's request span under ``opentelemetry-instrumentation-django``), with:

=========================  ===================================================================
attribute                  meaning
=========================  ===================================================================
``redlock.resource``       the lock's resource (several: joined with " + ")
``redlock.members``        masters asked
``redlock.quorum``         votes needed
``redlock.votes_for``      members that did not refuse or fail: those that granted, and any a
                           round did not wait for once a quorum had granted (return at quorum)
``redlock.votes_against``  masters that refused (held by another, gone) or failed
``redlock.attempts``       acquisition attempts (acquire)
``redlock.wait``           seconds from the first attempt to the outcome (acquire)
``redlock.validity``       seconds of exclusivity left after the operation
=========================  ===================================================================

One span event ``redlock.member_failed`` per failing member (``redlock.member``,
``redlock.reason``, ``redlock.detail``); a failed operation sets the span's status to ERROR and
records the exception. The attributes come from the engine's events (``observer.py``), which the
engine sends while the operation's span is current. Renewals by the watchdog thread (auto-extend)
are not traced: they would be root spans of a background thread, one every TTL/3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine import Lock, LockNotAcquired, NodeFailure

#: Our span of the operation running in this context, for the observer's events.
_span: ContextVar[_Operation | None] = ContextVar("django_redlock_span", default=None)


def tracer() -> Any | None:
    """The tracer, or None when no spans would be recorded: opentelemetry-api not installed, or
    no tracer provider set (the API's default, whose spans are non-recording: making them cost
    about a fifth of an uncontended cycle on loopback). A provider set later is used from then
    on: this is asked on every operation."""
    api = _api()
    if api is None:
        return None
    trace, silent, proxy = api
    # Until a provider is set, the API's get_tracer_provider() looks for one named by the
    # environment (OTEL_PYTHON_TRACER_PROVIDER) in os.environ: two KeyErrors raised and caught,
    # on each of two calls per lock cycle. That provider, if named, was made when ``_api()``
    # asked for our tracer; so the provider set is looked at where the API keeps it (and the
    # API asked, should that ever move).
    provider = getattr(trace, "_TRACER_PROVIDER", _ASK)
    if provider is None:
        return None  # none set: the API would answer its proxy provider, which records nothing
    if provider is _ASK:
        provider = trace.get_tracer_provider()
    if isinstance(provider, silent):
        return None
    return proxy


#: ``tracer()``: the API keeps its provider elsewhere than we look; ask it.
_ASK = object()


def warm() -> None:
    """Import OpenTelemetry's trace API if it is installed (``AppConfig.ready``)."""
    _api()


@cache
def _api() -> tuple[Any, tuple[type, ...], Any] | None:
    """The OpenTelemetry trace API, the provider classes that record nothing, and our tracer
    (the API's proxy: it follows the global provider; asking for it makes the provider the
    environment names, if any); None without opentelemetry-api."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    silent = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    return trace, silent, trace.get_tracer("django_redlock")


class _Operation:
    __slots__ = ("against", "members", "span")

    def __init__(self, span: Any, members: int) -> None:
        self.span = span
        self.members = members
        self.against = 0

    def failed(self, failures: Sequence[NodeFailure]) -> None:
        self.against += len(failures)
        for failure in failures:
            self.span.add_event(
                "redlock.member_failed",
                {
                    "redlock.member": failure.node,
                    "redlock.reason": failure.reason,
                    "redlock.detail": failure.detail,
                },
            )


@contextlib.contextmanager
def operation(tracer_: Any, name: str, lock: Lock) -> Iterator[None]:
    """A span around one lock operation: ``with operation(t, "redlock.acquire", lock):``."""
    from opentelemetry.trace import Status, StatusCode

    masters = lock._redlock  # noqa: SLF001 (the Django layer's own lock subclass)
    with tracer_.start_as_current_span(
        name, record_exception=False, set_status_on_exception=False
    ) as span:
        members = len(masters.nodes)
        span.set_attribute("redlock.resource", lock.resource)
        span.set_attribute("redlock.members", members)
        span.set_attribute("redlock.quorum", masters.quorum)
        state = _Operation(span, members)
        token = _span.set(state)
        try:
            yield
        except BaseException as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:300]))
            raise
        finally:
            _span.reset(token)
            span.set_attribute("redlock.votes_against", min(state.against, members))
            span.set_attribute("redlock.votes_for", max(0, members - state.against))
            span.set_attribute("redlock.validity", lock.validity)


# --- what the observer tells (called by the engine while the operation's span is current) ----


def acquired(waited: float, attempts: int) -> None:
    state = _span.get()
    if state is not None:
        state.span.set_attribute("redlock.wait", waited)
        state.span.set_attribute("redlock.attempts", attempts)


def not_acquired(waited: float, error: LockNotAcquired) -> None:
    state = _span.get()
    if state is not None:
        state.span.set_attribute("redlock.wait", waited)
        state.span.set_attribute("redlock.attempts", error.attempts)
        state.failed(error.failures)


def masters_failed(failures: Sequence[NodeFailure]) -> None:
    state = _span.get()
    if state is not None:
        state.failed(failures)


def lost(failures: Sequence[NodeFailure]) -> None:
    state = _span.get()
    if state is not None:
        state.span.add_event("redlock.lost")
        state.failed(failures)
