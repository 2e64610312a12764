"""A decorator for any function, sync or async: run it holding a lock whose resources are
formatted from the call's arguments (``"report:{user_id}"``), with the options of ``lock()``."""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Callable
from typing import Any, TypeVar

from .protocol import check_hold_bounds

F = TypeVar("F", bound=Callable[..., Any])


def locking(
    locks: Callable[[], Any], templates: tuple[str, ...], options: dict[str, Any]
) -> Callable[[F], F]:
    """``locks()`` gives the engine (a ``Redlock``) at call time: the Django layer reads its
    settings then, never at import time."""
    if not templates:
        raise ValueError("locked() needs at least one resource (a name or a template)")
    # Checked now, not at the first call: a bad bound is a bug in the decorated module.
    check_hold_bounds(options.get("at_least"), options.get("at_most"))

    def decorate(func: F) -> F:
        resources = resources_of(func, templates)
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def arun_locked(*args: Any, **kwargs: Any) -> Any:
                async with locks().lock(*resources(args, kwargs), **options):
                    return await func(*args, **kwargs)

            return arun_locked  # type: ignore[return-value]

        @functools.wraps(func)
        def run_locked(*args: Any, **kwargs: Any) -> Any:
            with locks().lock(*resources(args, kwargs), **options):
                return func(*args, **kwargs)

        return run_locked  # type: ignore[return-value]

    return decorate


def resources_of(
    func: Callable[..., Any],
    templates: tuple[str, ...],
    signature: inspect.Signature | None = None,
) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, ...]]:
    """How to make the resources of one call; checks now (at decoration) that every field of
    every template names a parameter of ``func`` (of ``signature``, if given: a bound task's
    without its first), so that a typo fails at import, not at the first call."""
    signature = signature or inspect.signature(func)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
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
        arguments = {**bound.arguments, **bound.arguments.get("kwargs", {})}
        return tuple(t.format_map(arguments) for t in templates)

    return resources
