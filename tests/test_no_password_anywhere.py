"""No password in any output: a password given in a URL's query string (``?password=``,
``ssl_password=``) authenticates, and is shown nowhere (reprs, errors, logs, signals' failures,
``redlock_status`` text and JSON, the admin, metrics); and a URL whose password holds an
unescaped ``#``, ``?``, ``/`` or ``&`` is refused, or shown, without any piece of it. Real
redis-server processes with ``requirepass``."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
import redis
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from django_redlock import LockLost, QuorumUnavailable, conf, redlock
from django_redlock.engine import Redlock
from django_redlock.testing.masters import free_port

pytestmark = pytest.mark.django_db

#: The masters' password, and the TLS key's (given to a member that is down).
PASSWORD = "Qs-4417-hunter"
TLS_KEY_PASSWORD = "Tk-9031-swordfish"
#: Pieces of a password with reserved characters: none may be shown, not even one piece.
PIECES = ("Ab1xq", "Cd2yr", "Ef3zs", "Gh4wt")


def assert_no_secret(texts: list[str], secrets: tuple[str, ...]) -> None:
    assert texts, "nothing collected: the check would prove nothing"
    leaked = [(s, t[:500]) for t in texts for s in secrets if s in t]
    assert not leaked, f"secret shown: {leaked}"


@pytest.fixture
def guarded(fresh_masters):
    """Three masters that want ``PASSWORD``."""
    masters = fresh_masters(3)
    for m in masters:
        m.call("CONFIG", "SET", "requirepass", PASSWORD)
    return masters


def status(*args: str) -> str:
    """``redlock_status``'s output (it exits non-zero: a member is down)."""
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError):
        call_command("redlock_status", *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def keys_removed(masters, key: str) -> None:
    for m in masters:
        client = redis.Redis(host="127.0.0.1", port=m.port, password=PASSWORD)
        try:
            client.delete(key)
        finally:
            client.close()


def test_a_query_string_password_authenticates_and_is_shown_nowhere(
    guarded, settings, caplog, client, django_user_model
):
    first, second, third = guarded
    settings.REDLOCK = {
        "NODES": [
            f"redis://127.0.0.1:{first.port}/0?password={PASSWORD}",
            f"redis://127.0.0.1:{second.port}/0?socket_timeout=5&password={PASSWORD}",
            f"rediss://127.0.0.1:{free_port()}/0?ssl_password={TLS_KEY_PASSWORD}",  # down
        ],
        "NODE_TIMEOUT": 0.2,
    }
    secrets = (PASSWORD, TLS_KEY_PASSWORD)
    caplog.set_level(logging.DEBUG)
    engine = conf.get_redlock()
    shown = [repr(conf.get_config()), repr(engine.nodes)]
    shown += [repr(node.spec) for node in engine.nodes]

    with redlock("pw:held", ttl=20, label="report"):  # 2 of 3: the password worked
        text, data = status(), status("--json")
        assert "2 of 3 masters reachable" in text
        shown += [text, json.dumps(json.loads(data))]
        client.force_login(django_user_model.objects.create_superuser("root", password="x"))
        page = client.get("/admin/django_redlock/heldlock/").content.decode()
        assert "pw:held" in page
        shown.append(page)

    lost = redlock("pw:lost", ttl=20).acquire()
    keys_removed(guarded, lost.key)
    with pytest.raises(LockLost) as caught_lost:
        lost.release()
    shown += [str(caught_lost.value), repr(caught_lost.value), repr(caught_lost.value.failures)]

    second.kill()
    with pytest.raises(QuorumUnavailable) as caught:
        redlock("pw:unavailable").acquire()
    error = caught.value
    shown += [str(error), repr(error), repr(error.failures), *map(str, error.failures)]
    assert "&password=***" in str(error)
    assert "?ssl_password=***" in str(error)

    shown += [r.getMessage() + repr(r.args) + (r.exc_text or "") for r in caplog.records]
    assert any("failed during" in r.getMessage() for r in caplog.records)  # masters_failed
    exported = StringIO()
    try:
        from prometheus_client import REGISTRY, generate_latest
    except ImportError:
        pass
    else:
        exported.write(generate_latest(REGISTRY).decode())
        shown.append(exported.getvalue())
    assert_no_secret(shown, secrets)


def reserved(form: str) -> str:
    """A password made of ``PIECES`` joined by reserved characters, in a URL of ``form``."""
    return form.format(secret=f"{PIECES[0]}#{PIECES[1]}?{PIECES[2]}/{PIECES[3]}", port=free_port())


BAD_URLS = [
    "redis://:{secret}@127.0.0.1:{port}/0",
    "redis://user:{secret}@127.0.0.1:{port}/0",
    "rediss://user:{secret}@127.0.0.1:{port}/0?ssl_cert_reqs=none",
    "redis+sentinel://:{secret}@127.0.0.1:{port}/mymaster/0",
    "redis+cluster://:{secret}@127.0.0.1:{port}/",
    "redis://127.0.0.1:{port}/0?password={secret}",
    "redis://127.0.0.1:{port}/0?socket_timeout=1&ssl_password={secret}&db=0",
    "unix://:{secret}@/tmp/redis.sock?db=0",
    "http://:{secret}@127.0.0.1:{port}/0",
]


@pytest.mark.parametrize("form", BAD_URLS)
def test_a_url_with_an_unescaped_reserved_character_in_its_password_is_refused_masked(
    form, settings
):
    url = reserved(form)
    with pytest.raises(ValueError, match=r"\*\*\*") as caught:
        Redlock([url])
    assert "%23" in str(caught.value) or "is not a redis://" in str(caught.value)
    settings.REDLOCK = {"NODES": [url]}
    problems = [p for p in conf.problems() if p.id == "E003"]
    assert len(problems) == 1
    checks = [m for m in run_checks() if m.id == "django_redlock.E003"]
    assert len(checks) == 1
    with pytest.raises(ImproperlyConfigured) as improper:
        conf.get_config()
    shown = [str(caught.value), problems[0].message, str(checks[0]), str(improper.value)]
    assert_no_secret(shown, PIECES)


@pytest.mark.parametrize(
    "form",
    [
        "redis://127.0.0.1:notaport/0?password={secret}",
        "redis://user:{secret}@127.0.0.1:notaport/0",
        "redis+sentinel://127.0.0.1:26379/mymaster/x?password={secret}",
        "redis+cluster://127.0.0.1:7000/3?password={secret}",
        "redis://127.0.0.1:{port}/0?password={secret}&wait_replicas=x",
    ],
)
def test_an_invalid_url_is_named_with_its_password_masked(form, settings):
    """Wrong for another reason; the password (with an unescaped ``&`` in a query option) is
    masked in the message."""
    url = form.format(secret=f"{PIECES[0]}&{PIECES[1]}", port=free_port())
    with pytest.raises(ValueError, match=r"password=\*\*\*|:\*\*\*@") as caught:
        Redlock([url])
    settings.REDLOCK = {"NODES": [url]}
    (problem,) = (p for p in conf.problems() if p.id == "E003")
    assert_no_secret([str(caught.value), problem.message], PIECES)


def test_nodes_given_as_one_string_is_named_masked(settings):
    settings.REDLOCK = {"NODES": f"redis://:{PASSWORD}@127.0.0.1:6379/0?ssl_password=x{PASSWORD}"}
    (problem,) = (p for p in conf.problems() if p.id == "E003")
    assert "redis://:***@127.0.0.1:6379/0?ssl_password=***" in problem.message
    assert_no_secret([problem.message], (PASSWORD,))


def test_a_node_entry_that_is_not_text_is_named_without_its_contents(settings):
    for entry in (f"redis://:{PASSWORD}@h:1/0".encode(), [f"redis://:{PASSWORD}@h:1/0"]):
        with pytest.raises(ValueError, match="a node must be") as caught:
            Redlock([entry])  # type: ignore[list-item]
        assert_no_secret([str(caught.value)], (PASSWORD,))


def test_a_password_written_without_its_colon_is_masked_too(guarded):
    """``redis://secret@host``: redis-py reads a user with no password, and Redis has no such
    login: most likely a password missing its ``:``. It is masked as one."""
    url = f"redis://{PASSWORD}@127.0.0.1:{guarded[0].port}/0"
    engine = Redlock([url], node_timeout=0.5)
    try:
        with pytest.raises(QuorumUnavailable) as caught:
            engine.lock("pw:nocolon", ttl=5).acquire()
    finally:
        engine.close()
    assert "redis://***@127.0.0.1" in str(caught.value)
    assert_no_secret([str(caught.value), repr(engine.nodes)], (PASSWORD,))


def test_a_percent_encoded_option_name_is_read_as_redis_py_reads_it(guarded):
    """``?pass%77ord=``: redis-py decodes the name (``password``) and authenticates with it; the
    masking reads it the same way."""
    url = f"redis://127.0.0.1:{guarded[0].port}/0?pass%77ord={PASSWORD}"
    engine = Redlock([url], node_timeout=0.5)
    try:
        with engine.lock("pw:encoded", ttl=5):
            pass  # authenticated
        shown = [repr(engine.nodes), engine.nodes[0].label]
    finally:
        engine.close()
    assert shown[1].endswith("?pass%77ord=***")
    assert_no_secret(shown, (PASSWORD,))
