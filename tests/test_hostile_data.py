"""Whatever sits under the lock prefix, the operator pages answer: each hostile key becomes a row
marked unreadable (its type and size, and why), the master's other keys are still listed, the
admin page answers 200 and ``redlock_status`` gives its verdict. Real masters throughout."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from django_redlock import conf
from django_redlock.operations.inventory import list_locks

pytestmark = pytest.mark.django_db

TOKEN = b"0123456789abcdef0123456789abcdef"
LIST_URL = "/admin/django_redlock/heldlock/"

#: name -> how to write it on one master (a redis-py client, the full key)
HOSTILE = {
    "not-ours": lambda c, k: c.set(k, b"somebody else's value"),
    "not-json": lambda c, k: c.set(k, TOKEN + b":not json at all"),
    "nested": lambda c, k: c.set(k, TOKEN + b":" + b'{"a":' * 1300 + b"1" + b"}" * 1300),
    "deep-array": lambda c, k: c.set(k, TOKEN + b':{"a":' + b"[" * 3000 + b"]" * 3000 + b"}"),
    "huge": lambda c, k: c.set(k, TOKEN + b':{"label":"' + b"x" * 4_000_000 + b'"}'),
    "not-utf8": lambda c, k: c.set(k, TOKEN + b':{"host":"\xff\xfe"}'),
    "a-hash": lambda c, k: c.hset(k, mapping={"f1": "v", "f2": "v"}),
    "a-list": lambda c, k: c.rpush(k, "a", "b", "c"),
    "a-set": lambda c, k: c.sadd(k, "a"),
    "a-zset": lambda c, k: c.zadd(k, {"a": 1}),
    "a-stream": lambda c, k: c.xadd(k, {"a": "1"}),
    "no-expiry-json-array": lambda c, k: c.set(k, TOKEN + b":[1,2]"),
    "ctrl\x1b[2J\r\nname": lambda c, k: c.set(k, b"x"),
}


def inject(master, prefix: str) -> None:
    client = master.client()
    try:
        for name, write in HOSTILE.items():
            write(client, prefix.encode() + name.encode())
        client.set(prefix.encode() + b"bad-\xff-name", TOKEN + b":{}")  # a key that is not UTF-8
        # The fencing counter of a held lock, hostile too: a hash, and a number too long to parse.
        client.hset(prefix.replace("lock:", "fence:").encode() + b"held", "x", "1")
    finally:
        client.close()


@pytest.fixture
def hostile(redlock_settings):
    """Every hostile key on master 0, and one real lock ("held") on all five masters."""
    masters = redlock_settings
    engine = conf.get_redlock()
    inject(masters[0], engine.lock_key(""))
    masters[1].call("SET", engine.fence_key("held"), "9" * 5000)
    with engine.lock("held", ttl=30, label="real"):
        yield engine


def test_each_hostile_key_is_an_unreadable_row_and_the_real_lock_is_listed(hostile):
    found = list_locks(hostile)
    assert [lock.resource for lock in found.locks] == ["held"]
    assert found.locks[0].held_on == 5  # master 0's other keys did not hide this one
    assert not found.failures
    rows = {key.resource: key for key in found.unreadable}
    assert set(rows) == {*HOSTILE, "bad-\udcff-name"}
    assert rows["a-hash"].kind == "hash"
    assert rows["a-hash"].size_text == "2 elements"
    assert rows["a-list"].size_text == "3 elements"
    assert rows["huge"].kind == "string"
    assert rows["huge"].size > 4_000_000
    assert "longer than a lock value" in rows["huge"].reason
    assert "not a flat JSON object" in rows["nested"].reason
    assert "not a flat JSON object" in rows["deep-array"].reason
    assert "not a django-redlock lock value" in rows["not-ours"].reason
    assert "not UTF-8" in rows["not-utf8"].reason
    assert "name is not UTF-8" in rows["bad-\udcff-name"].reason


def test_the_admin_page_answers_200_with_every_row(hostile, admin_client):
    response = admin_client.get(LIST_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="redlock-unreadable-key"') == len(HOSTILE) + 1
    assert "ctrl\\x1b[2J\\r\\nname" in html  # escaped, never raw
    assert "\x1b" not in html
    assert "bad-\\udcff-name" in html
    assert 'class="redlock-lock"' in html


def test_redlock_status_gives_its_verdict_in_text_and_json(hostile):
    out = StringIO()
    call_command("redlock_status", stdout=out)
    text = out.getvalue()
    assert "quorum 3: OK" in text
    assert f"Unreadable keys under the lock prefix: {len(HOSTILE) + 1}" in text
    assert "\x1b" not in text
    assert "\r" not in text
    out = StringIO()
    call_command("redlock_status", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert len(data["locks"]["unreadable"]) == len(HOSTILE) + 1
    assert [item["resource"] for item in data["locks"]["items"]] == ["held"]
