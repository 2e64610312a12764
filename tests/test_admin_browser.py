"""A real headless Chromium loads the "Held locks" admin page while locks are held.

Needs Debian's ``chromium`` (apt-get install -y chromium) and the ``playwright`` package (dev
extra); never ``playwright install``. Without them the test skips loudly on a developer machine
and fails under CI (the CI environment variable set), where they are installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from django_redlock import LockLost, conf
from django_redlock.engine.base.values import fingerprint
from django_redlock.operations import inventory

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "admin-held-locks.png"
PAGE = "/admin/django_redlock/heldlock/"


def require_browser() -> None:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if not missing:
        return
    reason = "BROWSER TEST NOT RUN: missing " + " and ".join(missing)
    if "CI" in os.environ:
        pytest.fail(f"{reason}; CI is set, so the browser must be there")
    pytest.skip(reason)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@contextlib.contextmanager
def browser_page(width: int = 1280) -> Iterator[Any]:
    """A page of a headless Debian Chromium (closed after)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


@contextlib.contextmanager
def held_locks_page(live_server: Any, user: str, password: str, width: int) -> Iterator[Any]:
    """``browser_page`` logged in as ``user``, on the "Held locks" page."""
    with browser_page(width) as page:
        page.goto(f"{live_server.url}/admin/login/?next={PAGE}")
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_server.url}{PAGE}")
        yield page


def test_held_locks_page_in_a_real_browser(
    live_server, django_user_model, redlock_settings, tmp_path
):
    require_browser()
    from playwright.sync_api import expect

    masters = redlock_settings
    user = django_user_model.objects.create_user("ops", password="browser-test-pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_held_locks", "force_release_lock"],
            content_type__app_label="django_redlock",
        )
    )
    engine = conf.get_redlock()
    resources = ["invoice:42", "nightly-report", "seat:12"]
    held = [engine.lock(r, ttl=60, label=f"demo {r}").acquire() for r in resources]
    held[0].fence  # noqa: B018 (issues a fencing token, so the page has one to show)
    # A leftover copy of another token on one master: shown as a stale minority copy.
    client = masters[4].client()
    try:
        client.set(
            engine.lock_key("seat:12"), b"f" * 32 + b':{"host":"crashed","pid":1}', px=20_000
        )
    finally:
        client.close()
    secrets = set()
    for m in masters:
        client = m.client()
        try:
            for r in resources:
                value = client.get(engine.lock_key(r))
                if value is not None:
                    secrets.add(value.split(b":", 1)[0].decode())
        finally:
            client.close()
    fingerprints = [inventory.inspect(engine, r).fingerprint for r in resources]
    shot = tmp_path / "admin-held-locks.png"
    try:
        with held_locks_page(live_server, "ops", "browser-test-pw", 1700) as page:
            expect(page.locator("#redlock-quorum")).to_have_text(
                "5 of 5 masters reachable, quorum 3: OK (can lose 2 more masters)"
            )
            node_rows = page.locator("#redlock-nodes tr.redlock-node")
            expect(node_rows).to_have_count(5)
            shown_nodes = [row.inner_text().split()[0] for row in node_rows.all()]
            lock_names = page.locator("tr.redlock-lock th.redlock-resource").all_inner_texts()
            seat_row = page.locator("tr.redlock-lock", has_text="seat:12").inner_text()
            html = page.content()
            page.screenshot(path=str(shot), full_page=True)
            # Force release through the real form: confirmation, then POST with CSRF.
            page.locator("tr.redlock-lock", has_text="invoice:42").get_by_text(
                "Force release"
            ).click()
            expect(page.locator("#redlock-holder")).to_contain_text(fingerprints[0])
            expect(page.locator("#redlock-holder")).to_contain_text("demo invoice:42")
            page.click("#redlock-release-form input[type=submit]")
            page.wait_for_url(f"{live_server.url}{PAGE}")
            expect(page.locator(".messagelist")).to_contain_text("released on 5 of 5 masters")
            after_release = page.locator("tr.redlock-lock th.redlock-resource").all_inner_texts()
    finally:
        for lock in held:
            with contextlib.suppress(LockLost):  # the one force-released says so
                lock.release()
    assert shown_nodes == [m.url for m in masters]
    assert lock_names == resources
    assert after_release == resources[1:]
    assert "4/5" in seat_row
    assert fingerprint(b"f" * 32) in seat_row  # the stale copy, by fingerprint
    assert all(fp in html for fp in fingerprints)
    assert len(secrets) == 4
    assert not any(token in html for token in secrets)
    width, height = png_size(shot)
    assert width >= 1700
    assert height >= 400
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank image
    ARTIFACT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)


def test_a_name_with_a_newline_and_escapes_is_force_released_from_a_real_browser(
    live_server, admin_user, redlock_settings
):
    """A browser sends a form's newline as CR LF: with the name itself in the form, the POST
    named another resource and released nothing. The form carries an opaque reference instead."""
    require_browser()
    from playwright.sync_api import expect

    engine = conf.get_redlock()
    resource = "order:\nevil\r\x1b[2J\tend"
    lock = engine.lock(resource, ttl=60, label="line\nbreak").acquire()
    long_name = "report:" + "x" * 500  # must wrap, not push the actions off-screen
    long_lock = engine.lock(long_name, ttl=60).acquire()
    try:
        # pytest-django's admin_user
        with held_locks_page(live_server, "admin", "password", 1280) as page:
            expect(page.locator("tr.redlock-lock")).to_have_count(2)
            action = page.locator("tr.redlock-lock", has_text="report:").get_by_text(
                "Force release"
            )
            box = action.bounding_box()
            viewport = page.viewport_size
            row = page.locator("tr.redlock-lock", has_text="order:")
            shown = row.locator("th.redlock-resource").inner_text()
            row.get_by_text("Force release").click()
            expect(page.locator("#redlock-holder")).to_contain_text("line\\nbreak")
            page.click("#redlock-release-form input[type=submit]")
            page.wait_for_url(f"{live_server.url}{PAGE}")
            message = page.locator(".messagelist").inner_text()
            left = page.locator("tr.redlock-lock").count()
    finally:
        long_lock.release()
        with contextlib.suppress(LockLost):  # the holder finds its lease gone, as it should
            lock.release()
    assert shown == "order:\\nevil\\r\\x1b[2J\\tend"  # escaped on the page, never raw
    assert "released on 5 of 5 masters" in message
    assert left == 1  # the long one
    assert box is not None
    assert viewport is not None
    assert box["x"] + box["width"] <= viewport["width"]  # the action is on screen
    assert inventory.inspect(engine, resource) is None
