"""Old names of the public API, kept working for a while as deprecated aliases."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

P = ParamSpec("P")
T = TypeVar("T")


def renamed(old: str, new: Callable[P, T]) -> Callable[P, T]:
    """``new`` under its ``old`` name, with a ``DeprecationWarning`` that names the new one."""
    message = f"{new.__qualname__.rsplit('.', 1)[0]}.{old}() is renamed {new.__name__}()"
    if inspect.iscoroutinefunction(new):

        @functools.wraps(new)
        async def alias_async(*args: P.args, **kwargs: P.kwargs) -> Any:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return await new(*args, **kwargs)

        return cast(Callable[P, T], alias_async)

    @functools.wraps(new)
    def alias(*args: P.args, **kwargs: P.kwargs) -> T:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)

    return alias
