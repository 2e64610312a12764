"""``lock_view``: one request at a time per resource, across every process and server.

    @lock_view("order:{order_id}", ttl=10)
    def pay(request, order_id): ...

Choices, and why:

- **Contention** answers ``423 Locked`` (or ``status=``, or ``on_contended(request, error)``) at
  once by default (``wait=0``): a request that waited for a lock held by a slow view would tie up
  a worker for as long. ``Retry-After`` is ``CONTENDED_RETRY_AFTER`` = 1 s (or the error's
  ``retry_after`` hint, if something set one: the engine does not): the holder is usually a
  request like this one, done in well under a second, and its lease (the TTL) is no better guess
  because an auto-extended lease lasts as long as the holder runs. Integer seconds, at least 1.
- **No quorum** (``QuorumUnavailable``) answers ``503`` (or ``on_unavailable(request, error)``)
  with ``Retry-After`` = the hint, else ``UNAVAILABLE_RETRY_AFTER`` = 5 s: masters coming back
  take seconds, and hammering them sooner does not help. Bodies are generic: which masters failed
  goes to the ``django_redlock`` log, not to the client.
- **Auto-extension**: the lease is renewed while the view runs (``auto_extend=True``), so ``ttl``
  bounds how long a crashed holder blocks others, not how long a view may take.
- **Streaming responses** (``StreamingHttpResponse``, ``FileResponse``): the lock covers the body
  too. It is released when the stream is exhausted, or when the server closes the response (client
  gone), so a generator that reads the protected data runs under the lock, as its author meant.
  The price: a slow client holds the lock while it downloads; materialize the body in the view if
  that is not what you want.
- **Lease lost** while the view ran (a pause longer than the lease, a force release): the
  ``lock_lost`` signal and an ERROR log fire when it is noticed, and the request fails with
  ``LockLost`` (a 500) instead of a success the lock did not protect. With ``atomic=True`` (or a
  database alias) the view runs in ``transaction.atomic`` *inside* the lock and the lease is
  checked before the commit, so a lost lease rolls the view's writes back.
- **``ATOMIC_REQUESTS``** (or an ``atomic`` block around the decorated view): the lock is held
  until that transaction ends, released right after its ``COMMIT`` (or ``ROLLBACK``), so the
  next request reads our committed write; a commit after the lease was lost is refused (rolled
  back, ``CommitRefused``, a 500). ``release_before_commit=True`` releases it when the view
  returns instead, before the commit (see ``django_redlock.transactions``).
  If the lease is lost during a stream, the stream raises ``LockLost`` after its last chunk; the
  server then cuts the response short, so the client sees an incomplete body rather than a
  complete-looking one. A stream closed outside the thread or task that took the lock (an ASGI
  worker thread, an abandoned async generator) cannot release it: the lock then stops being
  renewed and expires within its TTL.

Class-based views: decorate the class (``@lock_view(...)`` on a ``View`` subclass wraps its
``dispatch``, sync or async), or use ``method_decorator(lock_view(...), name="dispatch")`` on a
sync view, or on the handlers (``get``/``post``) of an async one.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase, StreamingHttpResponse
from django.views import View

from . import redlock
from .engine import Lock, LockContended, LockNotAcquired
from .engine.base import protocol
from .engine.kinds.modes import check_mode
from .keys import (
    KeyTemplateError,
    bounded_resource,
    check_view_fields,
    format_key,
    template_fields,
)
from .locks import check_release_before_commit
from .streaming import hand_over_to_stream

__all__ = ["CONTENDED_RETRY_AFTER", "UNAVAILABLE_RETRY_AFTER", "lock_view", "retry_after"]


CONTENDED_RETRY_AFTER = 1.0
UNAVAILABLE_RETRY_AFTER = 5.0

Key = str | Callable[..., str]
Handler = Callable[[HttpRequest, LockNotAcquired], Any]
V = TypeVar("V")


def retry_after(error: LockNotAcquired, fallback: float) -> int:
    """Whole seconds for a ``Retry-After`` header: the error's hint if it has a usable one, else
    ``fallback``; rounded up, at least 1 (``Retry-After: 0`` invites a retry storm)."""
    hint = error.retry_after
    seconds = hint if hint is not None and math.isfinite(hint) and hint > 0 else fallback
    return max(1, math.ceil(seconds))


def lock_view(
    *keys: Key,
    ttl: float | None = None,
    wait: float = 0.0,
    status: int | None = None,
    on_contended: Handler | None = None,
    on_unavailable: Handler | None = None,
    label: str | None = None,
    atomic: bool | str = False,
    limit: int | None = None,
    shared: bool = False,
    release_before_commit: bool = False,
) -> Callable[[V], V]:
    """Run the view while holding a Redlock on ``keys`` (see the module docstring for choices).

    ``keys``: each a template formatted from the URL kwargs (``"order:{order_id}"``) or a
    callable ``(request, *args, **kwargs) -> str``; names longer than 200 characters are hashed.
    Several keys make one lock over all of them (``"account:{src}", "account:{dst}"``): all or
    none, on each master, so two views locking the same pair in opposite orders never deadlock.
    ``ttl``: the lease in seconds (default: ``REDLOCK["TTL"]``), renewed while the view runs.
    ``wait``: seconds to keep trying a held lock before answering ``status`` (default 0: once).
    ``on_contended`` / ``on_unavailable``: ``(request, error) -> response`` (a coroutine
    function for async views is fine) to answer instead of 423 / 503; returned as they are.
    ``label``: shown as the holder in ``redlock_status`` and the admin (default: the view's name).
    ``atomic``: ``True`` or a database alias to run a sync view in ``transaction.atomic`` inside
    the lock, committed only if the lease is still held.
    ``limit=N``: up to N requests at once (a semaphore's permits); when all are taken the
    answer is ``429 Too Many Requests`` with ``Retry-After`` (unless ``status`` is given).
    ``shared=True``: a reader; readers share, the same key without it is their writer.
    ``release_before_commit=True``: under ``ATOMIC_REQUESTS`` (or inside any ``atomic`` block
    around the view), release the lock when the view returns, before the transaction commits
    (the next request may read data from before our commit). By default it is held until that
    transaction commits or rolls back (``django_redlock.transactions``).
    """
    if not keys:
        raise KeyTemplateError("lock_view needs at least one key: lock_view('order:{order_id}')")
    options = _Options(
        resources=tuple(_resource_function(key) for key in keys),
        ttl=None if ttl is None else protocol.check_ttl(ttl),
        wait=protocol.check_seconds("wait", wait, allow_zero=True),
        status=_check_status((423 if limit is None else 429) if status is None else status),
        on_contended=_check_handler("on_contended", on_contended),
        on_unavailable=_check_handler("on_unavailable", on_unavailable),
        label=protocol.check_label(label),
        atomic=_check_atomic(atomic),
        limit=limit,
        shared=shared,
        release_before_commit=check_release_before_commit(release_before_commit),
        template=" + ".join(k if isinstance(k, str) else _callable_name(k) for k in keys),
    )
    check_mode(limit, shared, reentrant=False)  # bad combinations fail at import, not per request

    def decorator(view: V) -> V:
        if isinstance(view, type):
            if not issubclass(view, View):
                raise TypeError(f"lock_view can decorate a view or a View subclass, not {view!r}")
            return _decorate_class(view, options)  # type: ignore[return-value]
        if not callable(view):
            raise TypeError(f"lock_view can decorate a view or a View subclass, not {view!r}")
        check_view_fields(view, keys)  # as early as the view allows: its signature
        return _decorate_function(view, options)  # type: ignore[return-value]

    return decorator


# --- options, checked when the decorator is made (at import time of the views module) ----------

#: ``(request, url_args, url_kwargs) -> resource``
ResourceOf = Callable[[HttpRequest, tuple[Any, ...], dict[str, Any]], str]


@dataclass(frozen=True)
class _Options:
    resources: tuple[ResourceOf, ...]
    ttl: float | None
    wait: float
    status: int
    on_contended: Handler | None
    on_unavailable: Handler | None
    label: str | None
    atomic: str | bool
    limit: int | None = None
    shared: bool = False
    release_before_commit: bool = False
    template: str = ""  # the keys as written: the metrics' label (bounded, unlike resources)

    def guard(self, view: object) -> _ViewLock:
        name = getattr(view, "__qualname__", None) or type(view).__qualname__
        label = self.label or f"view {getattr(view, '__module__', '?')}.{name}"
        return _ViewLock(self, label)


def _callable_name(key: object) -> str:
    return getattr(key, "__qualname__", None) or type(key).__qualname__


def _resource_function(key: Key) -> ResourceOf:
    if isinstance(key, str):
        template_fields(key)  # a malformed template fails here, at import, not per request

        def from_template(
            request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> str:
            return bounded_resource(format_key(key, kwargs))

        return from_template
    if callable(key):

        def from_callable(
            request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> str:
            name = key(request, *args, **kwargs)
            if not isinstance(name, str) or not name:
                raise KeyTemplateError(
                    f"lock_view key function {key!r} must return a non-empty str, got {name!r}"
                )
            return bounded_resource(name)

        return from_callable
    raise KeyTemplateError(
        f"lock_view key must be a template str like 'order:{{order_id}}' or a callable "
        f"(request, *args, **kwargs) -> str, got {key!r}"
    )


def _check_status(status: object) -> int:
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"status must be an HTTP error status (400-599), got {status!r}")
    return status


def _check_handler(name: str, handler: Handler | None) -> Handler | None:
    if handler is not None and not callable(handler):
        raise ValueError(f"{name} must be a callable (request, error) -> response, got {handler!r}")
    return handler


def _check_atomic(atomic: object) -> str | bool:
    if not isinstance(atomic, bool | str) or atomic == "":
        raise ValueError(f"atomic must be True, False or a database alias, got {atomic!r}")
    return atomic


# --- wrappers ----------------------------------------------------------------------------------


def _decorate_function(view: Callable[..., Any], options: _Options) -> Callable[..., Any]:
    guard = options.guard(view)
    if inspect.isgeneratorfunction(view) or inspect.isasyncgenfunction(view):
        # Its body would run after the view returned, unlocked: say so now, not per request.
        raise TypeError(
            f"lock_view on {guard.label}: a generator function is not a view; return a "
            f"StreamingHttpResponse of the generator instead (its body runs under the lock)"
        )
    if iscoroutinefunction(view):
        guard.refuse_atomic()

        async def async_wrapper(*args: Any, **kwargs: Any) -> HttpResponseBase:
            request, url_args = guard.request_and_args(args)
            return await guard.run_async(lambda: view(*args, **kwargs), request, url_args, kwargs)

        return wraps(view)(async_wrapper)

    def sync_wrapper(*args: Any, **kwargs: Any) -> HttpResponseBase:
        request, url_args = guard.request_and_args(args)
        return guard.run_sync(lambda: view(*args, **kwargs), request, url_args, kwargs)

    return wraps(view)(sync_wrapper)


def _decorate_class(cls: type[View], options: _Options) -> type[View]:
    """Wrap ``cls.dispatch`` with the sync or async wrapper, as ``cls.view_is_async`` says (an
    async view's ``dispatch`` is a plain function that returns a coroutine)."""
    dispatch: Callable[..., Any] = cls.dispatch
    guard = options.guard(cls)
    if cls.view_is_async:
        guard.refuse_atomic()

        async def async_dispatch(self: View, request: HttpRequest, *args: Any, **kw: Any) -> Any:
            return await guard.run_async(
                lambda: dispatch(self, request, *args, **kw), request, args, kw
            )

        cls.dispatch = wraps(dispatch)(async_dispatch)  # type: ignore[method-assign,assignment]
    else:

        def sync_dispatch(self: View, request: HttpRequest, *args: Any, **kw: Any) -> Any:
            return guard.run_sync(lambda: dispatch(self, request, *args, **kw), request, args, kw)

        cls.dispatch = wraps(dispatch)(sync_dispatch)  # type: ignore[method-assign]
    return cls


@dataclass(frozen=True)
class _ViewLock:
    """What one decorated view does around each call."""

    options: _Options
    label: str

    def refuse_atomic(self) -> None:
        if self.options.atomic is not False:
            raise ValueError(
                f"atomic={self.options.atomic!r} works with sync views only: {self.label} is "
                f"async (transaction.atomic cannot span awaits)"
            )

    def request_and_args(self, args: tuple[Any, ...]) -> tuple[HttpRequest, tuple[Any, ...]]:
        """The request and the URL args: ``(request, *args)`` for a function view, ``(self,
        request, *args)`` for a ``dispatch`` decorated without ``method_decorator``."""
        for i in (0, 1):
            if len(args) > i and isinstance(args[i], HttpRequest):
                return args[i], args[i + 1 :]
        raise TypeError(
            f"lock_view on {self.label}: no HttpRequest among the first arguments {args[:2]!r}; "
            f"decorate a view function, a View subclass, or use method_decorator"
        )

    def lock(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
        o = self.options
        resources = [resource_of(request, args, kwargs) for resource_of in o.resources]
        return redlock(
            *resources,
            ttl=o.ttl,
            wait=o.wait,
            label=self.label,
            auto_extend=True,
            limit=o.limit,
            shared=o.shared,
            template=o.template,
            release_before_commit=o.release_before_commit,
        )

    def run_sync(
        self,
        call: Callable[[], Any],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponseBase:
        lock = self.lock(request, args, kwargs)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(lock)
            except LockNotAcquired as error:
                return self.answer(_refuse(self.options, request, error))
            if self.options.atomic is False:
                response = call()
            else:
                using = None if self.options.atomic is True else self.options.atomic
                with transaction.atomic(using=using):
                    response = call()
                    lock.check()  # LockLost here rolls the view's writes back
            if inspect.isawaitable(response):
                if inspect.iscoroutine(response):
                    response.close()  # never awaited: say so here, not in a RuntimeWarning later
                raise TypeError(
                    f"lock_view on {self.label}: the view returned an awaitable from a sync "
                    f"function (an async class-based view's dispatch?); decorate the View "
                    f"subclass itself, or its async handlers with method_decorator, so the lock "
                    f"is taken without blocking the event loop"
                )
            if isinstance(response, StreamingHttpResponse):
                held.pop_all()  # from here the stream releases the lock, not this block
                hand_over_to_stream(response, lock)
            return self.answer(response)

    async def run_async(
        self,
        call: Callable[[], Awaitable[Any]],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponseBase:
        lock = self.lock(request, args, kwargs)
        async with contextlib.AsyncExitStack() as held:
            try:
                await held.enter_async_context(lock)
            except LockNotAcquired as error:
                return self.answer(await _maybe_await(_refuse(self.options, request, error)))
            response = await call()
            if isinstance(response, StreamingHttpResponse):
                held.pop_all()  # from here the stream releases the lock, not this block
                hand_over_to_stream(response, lock)
            return self.answer(response)

    def answer(self, response: object) -> HttpResponseBase:
        if not isinstance(response, HttpResponseBase):
            raise TypeError(
                f"lock_view on {self.label}: expected an HttpResponse, got {response!r}"
            )
        return response


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _refuse(options: _Options, request: HttpRequest, error: LockNotAcquired) -> Any:
    """The answer when the lock was not acquired: the configured handler's, else 423 (or
    ``status``) for contention and 503 when no quorum answered, with ``Retry-After``."""
    if isinstance(error, LockContended):
        handler, status, default = options.on_contended, options.status, CONTENDED_RETRY_AFTER
        text = "This resource is busy with another request"
    else:
        handler, status, default = options.on_unavailable, 503, UNAVAILABLE_RETRY_AFTER
        text = "The lock service is unavailable"
    if handler is not None:
        return handler(request, error)
    seconds = retry_after(error, default)
    response = HttpResponse(
        f"{text}. Retry in {seconds} s.\n",
        status=status,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(seconds)
    return response
