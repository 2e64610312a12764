"""No token in any repr, error or page: the one place a debugging user or an error tracker looks
is the exception with its frames' locals. Django's technical 500 page shows them all."""

from __future__ import annotations

import re

import pytest
from django.test import RequestFactory
from django.views.debug import ExceptionReporter, technical_500_response

from django_redlock import LockLost, redlock
from tests.conftest import wait_until

#: Tokens read from the masters, kept out of every frame's locals (a module global is not shown).
SEEN: set[str] = set()


def hold_past_the_lease(masters) -> None:
    """The view code under test: a block that outlives its lease, so leaving it raises LockLost."""
    with redlock("debug:page", ttl=1.0) as lock:
        for master in masters:
            value = master.call("GET", lock.key)
            SEEN.add(value.split(b":", 1)[0].decode())
        del value
        # Past the lease: it ran out on every master (waited for, not guessed).
        assert wait_until(lambda: all(m.call("EXISTS", lock.key) == 0 for m in masters), 10)


def locals_showing(page: str, token: str) -> list[str]:
    """The names of the frame locals whose shown value contains ``token``."""
    rows = re.finditer(r"<tr>\s*<td>([^<]*)</td>\s*<td class=\"code\"><pre>([^<]*)", page)
    return [row.group(1) for row in rows if token in row.group(2)]


def test_the_debug_500_page_of_a_lost_lock_shows_no_token(redlock_settings, settings):
    settings.DEBUG = True
    SEEN.clear()
    with pytest.raises(LockLost) as caught:
        hold_past_the_lease(redlock_settings)
    assert len(SEEN) == 1
    error = caught.value
    request = RequestFactory().get("/pay/42")
    page = technical_500_response(request, type(error), error, error.__traceback__)
    html = page.content.decode()
    reporter = ExceptionReporter(request, type(error), error, error.__traceback__)
    text = reporter.get_traceback_text()
    assert "debug:page" in html  # the page is about our lock, with its frames' locals
    [token] = SEEN
    shown = {"html": html.count(token), "text": text.count(token)}
    assert shown == {"html": 0, "text": 0}, f"token in locals {locals_showing(html, token)}"


def test_no_repr_of_a_held_lock_or_what_the_operator_tools_return_has_a_token(redlock_settings):
    from django_redlock import LockContended, conf
    from django_redlock.operations import force_release, inventory

    engine = conf.get_redlock()
    with pytest.raises(LockLost) as lost, redlock("repr:held", ttl=20, label="repr") as lock:  # noqa: PT012
        [token] = {m.call("GET", lock.key).split(b":", 1)[0].decode() for m in redlock_settings}
        with pytest.raises(LockContended) as contended:
            redlock("repr:held").acquire()
        found = inventory.list_locks(engine)
        held = inventory.inspect(engine, "repr:held")
        shown = [
            repr(lock),
            repr(contended.value),
            str(contended.value),
            repr(contended.value.failures),
            repr(found),
            repr(held),
        ]
        released = force_release.force_release(engine, "repr:held", held.fingerprint)
        shown += [repr(released), released.describe()]
    shown += [repr(lost.value), str(lost.value)]  # leaving: the lease was taken away
    assert [text for text in shown if token in text] == []
