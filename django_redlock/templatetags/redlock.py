"""``{% load redlock %}``: the ``printable`` filter (see ``django_redlock.display``)."""

from __future__ import annotations

from django import template

from ..operations.display import printable as _printable

register = template.Library()


@register.filter
def printable(value: object) -> str:
    return _printable(str(value))
