"""A decorator for any function, sync or async: run it holding a lock whose resources are
formatted from the call's arguments (``"report:{user_id}"``), with the options of ``lock()``."""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import AsyncGenerator, Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from .base.protocol import check_hold_bounds
from .leases.leases import current_owner

if TYPE_CHECKING:
    from .kinds.lock import Lock

F = TypeVar("F", bound=Callable[..., Any])


class Locks(Protocol):
    """What the decorator needs of the engine (a ``Redlock``): a lock on the call's resources,
    with the decorator's options (``Redlock.lock``'s)."""

    @property
    def lock(self) -> Callable[..., Lock]: ...


def locking(
    locks: Callable[[], Locks], templates: tuple[str, ...], options: dict[str, Any]
) -> Callable[[F], F]:
    """``locks()`` gives the engine (a ``Redlock``) at call time: the Django layer reads its
    settings then, never at import time.

    A generator function (sync or async) holds the lock across its iteration: acquired on the
    first ``next()`` (``anext()``), released when it is exhausted or closed (``close()``,
    ``aclose()``, a ``break`` out of ``for`` and the generator's finalization), by whichever
    thread or task closes it."""
    if not templates:
        raise ValueError("locked() needs at least one resource (a name or a template)")
    # Checked now, not at the first call: a bad bound is a bug in the decorated module.
    check_hold_bounds(options.get("at_least"), options.get("at_most"))

    def decorate(func: F) -> F:
        resources = resources_of(func, templates)

        def lock_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
            return locks().lock(*resources(args, kwargs), **options)

        if inspect.isasyncgenfunction(func):
            return cast(F, _async_generator_locked(func, lock_of))
        if inspect.isgeneratorfunction(func):
            return cast(F, _generator_locked(func, lock_of))
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def arun_locked(*args: Any, **kwargs: Any) -> Any:
                async with lock_of(args, kwargs):
                    return await func(*args, **kwargs)

            return cast(F, arun_locked)

        @functools.wraps(func)
        def run_locked(*args: Any, **kwargs: Any) -> Any:
            with lock_of(args, kwargs):
                return func(*args, **kwargs)

        return cast(F, run_locked)

    return decorate


#: ``(args, kwargs) -> Lock``: the lock of one call, not yet acquired.
LockOf = Callable[[tuple[Any, ...], dict[str, Any]], "Lock"]


# A generator's hold ends for the owner that took it (``_leave``), whichever thread or task
# closes it: asyncio finalizes an abandoned async generator in a task of its own, and a
# generator may be handed to another thread to finish.


def _generator_locked(
    func: Callable[..., Generator[Any, Any, Any]], lock_of: LockOf
) -> Callable[..., Generator[Any, Any, Any]]:
    @functools.wraps(func)
    def iterate_locked(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        lock = lock_of(args, kwargs)
        owner = current_owner()
        lock.acquire()
        try:
            result = yield from func(*args, **kwargs)
        except BaseException as exc:
            lock._leave(owner, exc)
            raise
        lock._leave(owner, None)
        return result

    return iterate_locked


def _async_generator_locked(
    func: Callable[..., AsyncGenerator[Any, Any]], lock_of: LockOf
) -> Callable[..., AsyncGenerator[Any, Any]]:
    @functools.wraps(func)
    async def aiterate_locked(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        lock = lock_of(args, kwargs)
        owner = current_owner()
        await lock.aacquire()
        try:
            inner = _AsyncDelegation(func(*args, **kwargs))
            await inner.send(None)
            while inner.running:
                try:
                    sent = yield inner.value
                except GeneratorExit:
                    await inner.close()
                    raise
                except BaseException as exc:  # noqa: BLE001 (thrown in: passed on to inner)
                    await inner.throw(exc)
                else:
                    await inner.send(sent)
        except BaseException as exc:
            await lock._aleave(owner, exc)
            raise
        await lock._aleave(owner, None)

    return aiterate_locked


class _AsyncDelegation:
    """``yield from`` for an async generator (the language has none): drives ``inner`` with
    what the wrapper's caller sends or throws, keeping its next value."""

    __slots__ = ("inner", "running", "value")

    def __init__(self, inner: AsyncGenerator[Any, Any]) -> None:
        self.inner = inner
        self.running = True
        self.value: Any = None

    async def send(self, sent: Any) -> None:
        try:
            self.value = await self.inner.asend(sent)
        except StopAsyncIteration:
            self.running = False

    async def throw(self, exc: BaseException) -> None:
        try:
            self.value = await self.inner.athrow(exc)
        except StopAsyncIteration:
            self.running = False

    async def close(self) -> None:
        await self.inner.aclose()


def resources_of(
    func: Callable[..., Any],
    templates: tuple[str, ...],
    signature: inspect.Signature | None = None,
) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, ...]]:
    """How to make the resources of one call; checks now (at decoration) that every field of
    every template names a parameter of ``func`` (of ``signature``, if given: a bound task's
    without its first), so that a typo fails at import, not at the first call."""
    signature = signature or inspect.signature(func)
    # The ``**`` parameter, whatever its name (``**kwargs``, ``**options``): a field may name
    # any keyword it receives.
    var_keyword = next(
        (p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None
    )
    takes_any = var_keyword is not None
    for template in templates:
        if not isinstance(template, str):
            raise ValueError(f"a resource template must be a str, got {template!r}")
        for _, field, _, _ in string.Formatter().parse(template):
            if field is None:
                continue
            name = field.split(".")[0].split("[")[0]
            if not name or (name not in signature.parameters and not takes_any):
                raise ValueError(
                    f"resource template {template!r} names {{{field}}}, which is not a "
                    f"parameter of {func.__qualname__}{signature}"
                )
    if all("{" not in t for t in templates):
        return lambda args, kwargs: templates

    def resources(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        if var_keyword is not None:
            arguments = {**arguments, **arguments.get(var_keyword, {})}
        return tuple(t.format_map(arguments) for t in templates)

    return resources
