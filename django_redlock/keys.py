"""Resource names built from outside data: bounded in length, and formatted from URL kwargs.

A view lock's name often contains request data (``"order:{order_id}"``). Whatever the request
carries, the name we send to Redis stays short: long names keep a readable prefix and end in the
SHA-256 of the whole name, so two different long names still get different locks.
"""

from __future__ import annotations

import hashlib
import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

#: Longest resource name we pass to the engine; longer names are hashed (see ``bounded_resource``).
MAX_RESOURCE_LENGTH = 200

_HASH_MARK = "~sha256:"
_HASH_LENGTH = len(_HASH_MARK) + 64


class KeyTemplateError(ValueError):
    """A key template is malformed, or the URL kwargs it needs are missing."""


def bounded_resource(name: str, *, limit: int = MAX_RESOURCE_LENGTH) -> str:
    """``name`` itself when it has at most ``limit`` characters; else its first characters
    followed by ``~sha256:<hex of the whole name>``, exactly ``limit`` characters long."""
    if not isinstance(name, str):
        raise ValueError(f"resource must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError("resource must not be empty")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < _HASH_LENGTH + 1:
        raise ValueError(f"limit must be an int of at least {_HASH_LENGTH + 1}, got {limit!r}")
    if len(name) <= limit:
        return name
    # surrogatepass: a lone surrogate (possible in decoded URLs) must hash, not raise.
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{name[: limit - _HASH_LENGTH]}{_HASH_MARK}{digest}"


def template_fields(template: str) -> tuple[str, ...]:
    """The kwarg names a key template uses, in order; ``KeyTemplateError`` unless every field is
    a plain name (``{order_id}``), because positional (``{}``, ``{0}``), attribute (``{a.b}``),
    index (``{a[0]}``) and conversion fields would let a template reach beyond the URL kwargs."""
    if not isinstance(template, str) or not template:
        raise KeyTemplateError(f"key template must be a non-empty str, got {template!r}")
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise KeyTemplateError(f"key template {template!r} is malformed: {exc}") from None
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            shown = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise KeyTemplateError(
                f"key template {template!r}: field {{{shown}}} must be a plain URL kwarg name "
                f"like {{order_id}}; use a callable key for anything else"
            )
        fields.append(field)
    return tuple(fields)


def format_key(template: str, kwargs: Mapping[str, object]) -> str:
    """``template`` with each ``{name}`` replaced by ``str(kwargs[name])``; a missing kwarg is a
    ``KeyTemplateError`` naming it and the kwargs that were there."""
    missing = [f for f in template_fields(template) if f not in kwargs]
    if missing:
        have = ", ".join(sorted(kwargs)) or "none"
        raise KeyTemplateError(
            f"key template {template!r} needs URL kwarg {missing[0]!r}, which this URL does not "
            f"capture (URL kwargs: {have})"
        )
    return template.format_map({name: str(kwargs[name]) for name in template_fields(template)})


def check_view_fields(view: Callable[..., Any], templates: tuple[object, ...]) -> None:
    """``KeyTemplateError`` now, at decoration, when a template names a URL kwarg that ``view``
    cannot receive: Django passes URL kwargs as keyword arguments, so a view that takes neither
    that parameter nor ``**kwargs`` could never be called with it. A view whose signature cannot
    be read, or that takes ``**kwargs``, is checked per request instead."""
    try:
        signature = inspect.signature(view)
    except (TypeError, ValueError):
        return
    parameters = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    accepted = {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    name = getattr(view, "__qualname__", repr(view))
    for template in templates:
        if not isinstance(template, str):
            continue  # a callable key: it takes whatever the view takes
        for field in template_fields(template):
            if field not in accepted:
                raise KeyTemplateError(
                    f"key template {template!r} needs URL kwarg {field!r}, which view "
                    f"{name}{signature} does not take: a URL that captures it would fail to call "
                    f"the view, and one that does not fails the template"
                )
