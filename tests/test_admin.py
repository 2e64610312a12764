"""The admin's "Held locks" page and its force release: Django's test client, real masters."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import reverse

from django_redlock import LockLost, conf, views
from django_redlock.models import HeldLock
from django_redlock.operations import inventory

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/django_redlock/heldlock/"
RELEASE_URL = "/admin/django_redlock/heldlock/release/"


def values(masters, key):
    return [m.call("GET", key) for m in masters]


def tokens(masters, key):
    return [v.split(b":", 1)[0].decode() for v in values(masters, key) if v is not None]


@pytest.fixture
def staff(django_user_model):
    """Make a staff user holding the given permission codenames."""

    def make(*codenames: str, name: str = "staff"):
        user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="django_redlock", codename__in=codenames
            )
        )
        assert user.user_permissions.count() == len(codenames)
        return user

    return make


@pytest.fixture
def viewer(client, staff):
    client.force_login(staff("view_held_locks", name="viewer"))
    return client


@pytest.fixture
def releaser(staff):
    """A client that enforces CSRF, logged in with both permissions."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("view_held_locks", "force_release_lock", name="releaser"))
    return client


@pytest.fixture
def engine(redlock_settings):
    return conf.get_redlock()


def release_query(resource, fingerprint):
    query = {"ref": views.resource_ref(resource), "fingerprint": fingerprint}
    return f"{RELEASE_URL}?{urlencode(query)}"


def csrf_token_of(response) -> str:
    match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', response.content)
    assert match, "the confirmation form carries a CSRF token"
    return match.group(1).decode()


def test_urls_are_the_admin_ones():
    assert reverse("admin:django_redlock_heldlock_changelist") == LIST_URL
    assert reverse("admin:django_redlock_heldlock_release") == RELEASE_URL


def test_anonymous_is_sent_to_login(client, engine):
    for url in (LIST_URL, release_query("r", "0123abcd")):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")


def test_staff_without_permission_gets_403(client, staff, engine):
    client.force_login(staff())
    assert client.get(LIST_URL).status_code == 403
    assert client.get(release_query("r", "0123abcd")).status_code == 403
    assert "Held locks" not in client.get("/admin/").content.decode()


def test_view_permission_lists_locks_and_nodes_without_tokens(viewer, engine, masters):
    with engine.lock("invoice:42", ttl=20, label="billing"), engine.lock("report", ttl=20) as rep:
        fence = rep.fence
        response = viewer.get(LIST_URL)
        secret = tokens(masters, engine.lock_key("invoice:42")) + tokens(
            masters, engine.lock_key("report")
        )
        shown = inventory.inspect(engine, "invoice:42")
    assert response.status_code == 200
    html = response.content.decode()
    assert "invoice:42" in html
    assert "report" in html
    assert "label &#x27;billing&#x27;" in html
    assert f"<td>{fence}</td>" in html
    assert shown is not None
    assert shown.fingerprint in html
    assert "5/5" in html
    assert "5 of 5 masters reachable, quorum 3: OK" in html
    for m in masters:
        assert m.url in html
    assert len(secret) == 10
    assert not any(token in html for token in secret)
    assert "Force release" not in html  # no link without the release permission
    assert "Held locks" in viewer.get("/admin/").content.decode()


def test_search_and_pages(viewer, engine, monkeypatch):
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    with engine.lock("a:1"), engine.lock("a:2"), engine.lock("b:1"):
        searched = viewer.get(LIST_URL, {"q": "b:"}).content.decode()
        first = viewer.get(LIST_URL).content.decode()
        second = viewer.get(LIST_URL, {"p": 2}).content.decode()
    assert "b:1" in searched
    assert "a:1" not in searched
    assert ("a:1" in first, "b:1" in first, "page 1 of 2" in first) == (True, False, True)
    assert ("a:1" in second, "b:1" in second, "page 2 of 2" in second) == (False, True, True)


def test_view_permission_alone_cannot_release(viewer, engine):
    with engine.lock("r") as lock:
        response = viewer.get(release_query("r", inventory.inspect(engine, "r").fingerprint))
        assert response.status_code == 403
        response = viewer.post(
            RELEASE_URL, {"ref": views.resource_ref("r"), "fingerprint": "0123abcd"}
        )
        assert response.status_code == 403
        assert lock.held


def test_confirmation_page_names_the_holder_and_changes_nothing(releaser, engine, masters):
    with engine.lock("invoice:42", ttl=20, label="billing"):
        shown = inventory.inspect(engine, "invoice:42")
        before = values(masters, engine.lock_key("invoice:42"))
        response = releaser.get(release_query("invoice:42", shown.fingerprint))
        after = values(masters, engine.lock_key("invoice:42"))
        secret = tokens(masters, engine.lock_key("invoice:42"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "invoice:42" in html
    assert shown.fingerprint in html
    assert str(shown.owner).replace("'", "&#x27;") in html
    assert "held on 5 of 5 masters" in html
    assert 'id="redlock-release-form"' in html
    assert after == before
    assert None not in after
    assert len(secret) == 5
    assert not any(token in html for token in secret)
    assert not LogEntry.objects.exists()


def test_post_without_csrf_token_is_refused(releaser, engine, masters):
    with engine.lock("invoice:42", ttl=20):
        shown = inventory.inspect(engine, "invoice:42")
        before = values(masters, engine.lock_key("invoice:42"))
        response = releaser.post(
            RELEASE_URL, {"ref": views.resource_ref("invoice:42"), "fingerprint": shown.fingerprint}
        )
        assert response.status_code == 403
        assert values(masters, engine.lock_key("invoice:42")) == before
    assert not LogEntry.objects.exists()


def test_post_with_csrf_releases_that_holder_and_logs_it(releaser, engine, masters):
    lock = engine.lock("invoice:42", ttl=30, label="billing").acquire()
    secret = tokens(masters, engine.lock_key("invoice:42"))[0]
    shown = inventory.inspect(engine, "invoice:42")
    page = releaser.get(release_query("invoice:42", shown.fingerprint))
    response = releaser.post(
        RELEASE_URL,
        {
            "ref": views.resource_ref("invoice:42"),
            "fingerprint": shown.fingerprint,
            "csrfmiddlewaretoken": csrf_token_of(page),
        },
    )
    assert response.status_code == 302
    assert response["Location"] == LIST_URL
    assert values(masters, engine.lock_key("invoice:42")) == [None] * 5
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION
    assert entry.user.username == "releaser"
    assert entry.content_type == ContentType.objects.get_for_model(HeldLock)
    assert entry.object_id == "invoice:42"
    assert shown.fingerprint in entry.object_repr
    assert "released on 5 of 5 masters" in entry.change_message
    assert secret not in entry.change_message
    listing = releaser.get(LIST_URL).content.decode()
    assert "released on 5 of 5 masters" in listing  # the success message
    assert secret not in listing
    with pytest.raises(LockLost, match="not released by a quorum"):
        lock.release()  # the holder learns that its lease was taken away


def test_a_new_holder_since_the_confirmation_survives(releaser, engine, masters):
    old = engine.lock("seat:12", ttl=30).acquire()
    shown = inventory.inspect(engine, "seat:12")
    page = releaser.get(release_query("seat:12", shown.fingerprint))
    old.release()
    new = engine.lock("seat:12", ttl=30).acquire()
    before = values(masters, engine.lock_key("seat:12"))
    response = releaser.post(
        RELEASE_URL,
        {
            "ref": views.resource_ref("seat:12"),
            "fingerprint": shown.fingerprint,
            "csrfmiddlewaretoken": csrf_token_of(page),
        },
        follow=True,
    )
    assert response.status_code == 200
    assert values(masters, engine.lock_key("seat:12")) == before
    assert new.held
    assert "nothing released" in response.content.decode()
    assert not LogEntry.objects.exists()
    new.release()


def test_confirmation_for_a_holder_that_is_gone_offers_no_form(releaser, engine):
    response = releaser.get(release_query("gone", "0123abcd"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="redlock-gone"' in html
    assert 'id="redlock-release-form"' not in html


@pytest.mark.parametrize(
    "query",
    [
        {"ref": "cg", "fingerprint": "<script>"},  # "cg" is "r"
        {"ref": "", "fingerprint": "0123abcd"},
        {"ref": "not base64!", "fingerprint": "0123abcd"},
        {"ref": "_w", "fingerprint": "0123abcd"},  # b"\xff": not UTF-8
    ],
)
def test_bad_release_input_is_a_plain_400(releaser, engine, query):
    response = releaser.get(RELEASE_URL, query)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")


def test_the_admin_has_no_add_change_or_delete_views(client, django_user_model, engine):
    admin = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    assert client.get(LIST_URL).status_code == 200
    for url in (f"{LIST_URL}add/", f"{LIST_URL}1/change/", f"{LIST_URL}1/delete/"):
        assert client.get(url).status_code == 404


def test_verdicts_and_unknown_copies_on_the_page(viewer, settings, fresh_masters):
    """The page says OK / DEGRADED / NO QUORUM as the status command does, calls copies on
    masters it could not read unknown (never stale), and says a shared warning once."""
    masters = fresh_masters(5)
    settings.REDLOCK = {"NODES": [m.url for m in masters]}
    conf.get_redlock().lock("invoice:42", ttl=60).acquire()  # left to expire
    verdicts = []
    for master in masters[:3]:
        master.kill()
        html = viewer.get(LIST_URL).content.decode()
        verdicts.append(re.search(r'data-verdict="([^"]+)"', html).group(1))
        assert html.count("appendonly=no") == 1  # one line for every reachable master
    assert verdicts == ["OK", "DEGRADED", "NO QUORUM"]
    assert "2/5 read; 3 masters unread: unknown" in html
    assert "redlock-state-unknown" in html
    assert "redlock-state-stale" not in html
    assert "below quorum" not in html


def test_a_lock_over_two_resources_is_one_holder_listed_and_released_as_one(
    releaser, engine, masters
):
    pair = engine.lock("account:1", "account:2", ttl=30, label="transfer").acquire()
    found = inventory.list_locks(engine)
    assert [lock.names for lock in found.locks] == [("account:1", "account:2")]
    listing = releaser.get(LIST_URL).content.decode()
    assert "account:1 + account:2" in listing
    [link] = re.findall(r'href="([^"]*release/\?[^"]*)"', listing)
    link = link.replace("&amp;", "&")
    assert link.count("ref=") == 2  # both resources, one holder
    confirm = releaser.get(link)
    assert "account:1 + account:2" in confirm.content.decode()
    form = re.findall(r'name="(ref|fingerprint)" value="([^"]*)"', confirm.content.decode())
    assert [name for name, _ in form].count("ref") == 2
    done = releaser.post(
        RELEASE_URL,
        {
            "ref": [v for n, v in form if n == "ref"],
            "fingerprint": form[-1][1],
            "csrfmiddlewaretoken": csrf_token_of(confirm),
        },
    )
    assert done.status_code == 302, done.content
    assert values(masters, pair.keys[0]) == values(masters, pair.keys[1]) == [None] * 5
    assert LogEntry.objects.count() == 2  # one entry per resource released
    with pytest.raises(LockLost):
        pair.release()
