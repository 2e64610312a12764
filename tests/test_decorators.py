"""``lock_view`` and the key helpers, through Django's test client, on real masters.

Contention is real: the test holds the same lock through ``redlock()``, or several threads send
requests at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import AsyncClient, Client
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_redlock import LockContended, LockLost, QuorumUnavailable, redlock
from django_redlock.conf import get_redlock
from django_redlock.decorators import lock_view, retry_after
from django_redlock.keys import (
    MAX_RESOURCE_LENGTH,
    KeyTemplateError,
    bounded_resource,
    format_key,
)
from django_redlock.signals import lock_contended, lock_lost
from testproject.shop.models import Account
from tests.conftest import until_set

pytestmark = pytest.mark.urls("tests.test_decorators")

# --- views under test ----------------------------------------------------------------------------

inside = threading.Event()  # set by a view once it holds its lock
proceed = threading.Event()  # the view waits for it before answering


@lock_view("order:{order_id}")
def order(request: HttpRequest, order_id: int) -> HttpResponse:
    return HttpResponse(f"order {order_id}")


@lock_view("slow:{name}", wait=10)
def lost_update(request: HttpRequest, name: str) -> HttpResponse:
    """A read, a pause and a write that only the lock keeps from losing updates."""
    seen = COUNTER[name]
    time.sleep(0.01)
    COUNTER[name] = seen + 1
    return HttpResponse(str(seen + 1))


COUNTER: dict[str, int] = {}


@lock_view("held:{name}", ttl=1.0)
def held_while_running(request: HttpRequest, name: str) -> HttpResponse:
    inside.set()
    assert proceed.wait(10)
    return HttpResponse("done")


@lock_view("busy", status=409, on_unavailable=lambda r, e: HttpResponse("later", status=599))
def conflict(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def _custom(request: HttpRequest, error: Exception) -> HttpResponse:
    return HttpResponse(f"custom {type(error).__name__}", status=429)


@lock_view("busy", on_contended=_custom)
def custom(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@lock_view(lambda request, slug: f"callable:{request.GET.get('tenant')}:{slug}")
def by_callable(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse("ok")


@lock_view("huge:{slug}")
def huge(request: HttpRequest, slug: str) -> HttpResponse:
    return HttpResponse("ok")


def _wipe(resource: str) -> None:
    """Delete a lock's keys on every master, as a force release from elsewhere would."""
    engine = get_redlock()
    for node in engine.nodes:
        client = node.client()
        try:
            client.delete(engine.lock_key(resource))
        finally:
            client.close()


def _wipe_until_lost(resource: str) -> None:
    """``_wipe``, then wait until the watchdog's renewal (at a third of the TTL) finds the keys
    gone and says so (``lock_lost``): what a loaded machine delays, not a fixed time."""
    noticed = threading.Event()

    def receiver(sender: object, *, lock: object, error: LockLost, **kwargs: object) -> None:
        if error.resource == resource:
            noticed.set()

    lock_lost.connect(receiver)
    try:
        _wipe(resource)
        assert noticed.wait(10), f"the loss of {resource} was not noticed"
    finally:
        lock_lost.disconnect(receiver)


@lock_view("lose:{name}", ttl=1.0)
def loses_its_lock(request: HttpRequest, name: str) -> HttpResponse:
    _wipe_until_lost(f"lose:{name}")
    return HttpResponse("finished without exclusivity")


@lock_view("atomic:{name}", ttl=1.0, atomic=True)
def atomic_loses(request: HttpRequest, name: str) -> HttpResponse:
    Account.objects.create(name=name, balance=1)
    _wipe_until_lost(f"atomic:{name}")
    return HttpResponse("not committed")


@lock_view("atomic:{name}", atomic=True)
def atomic_keeps(request: HttpRequest, name: str) -> HttpResponse:
    Account.objects.create(name=name, balance=1)
    return HttpResponse("committed")


@lock_view("stream:{name}")
def stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    def body() -> Iterator[bytes]:
        yield b"a"
        yield b"b"

    return StreamingHttpResponse(body())


@lock_view("short-stream:{name}", ttl=1.0)
def short_stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"a", b"b"]))


@lock_view("lost-stream:{name}", ttl=1.0)
def lost_stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    def body() -> Iterator[bytes]:
        yield b"first"
        _wipe_until_lost(f"lost-stream:{name}")  # taken away while the body is being sent
        yield b"last"

    return StreamingHttpResponse(body())


@lock_view("astream:{name}")
async def astream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    async def body() -> AsyncIterator[bytes]:
        yield b"x"
        await asyncio.sleep(0)
        yield b"y"

    return StreamingHttpResponse(body())


@lock_view("order:{order_id}")
async def async_order(request: HttpRequest, order_id: int) -> HttpResponse:
    await asyncio.sleep(0)
    return HttpResponse(f"async order {order_id}")


@lock_view("cbv:{pk}")
class ClassView(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse(f"class {pk}")


@method_decorator(lock_view("cbv:{pk}"), name="dispatch")
class MethodDecoratedView(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse(f"method {pk}")


class DispatchDecoratedView(View):
    @lock_view("cbv:{pk}")
    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        return super().dispatch(request, *args, **kwargs)  # type: ignore[return-value]

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse(f"dispatch {pk}")


@lock_view("cbv:{pk}")
class AsyncClassView(View):
    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        await asyncio.sleep(0)
        return HttpResponse(f"async class {pk}")


@method_decorator(lock_view("cbv:{pk}"), name="get")
class AsyncHandlerDecoratedView(View):
    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse(f"async handler {pk}")


@method_decorator(lock_view("cbv:{pk}"), name="dispatch")
class AsyncMisdecoratedView(View):
    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse("never")


urlpatterns = [
    path("order/<int:order_id>/", order),
    path("async-order/<int:order_id>/", async_order),
    path("count/<str:name>/", lost_update),
    path("held/<str:name>/", held_while_running),
    path("conflict/", conflict),
    path("custom/", custom),
    path("callable/<slug:slug>/", by_callable),
    path("huge/<str:slug>/", huge),
    path("lose/<str:name>/", loses_its_lock),
    path("atomic-lose/<str:name>/", atomic_loses),
    path("atomic-keep/<str:name>/", atomic_keeps),
    path("stream/<str:name>/", stream),
    path("astream/<str:name>/", astream),
    path("short-stream/<str:name>/", short_stream),
    path("lost-stream/<str:name>/", lost_stream),
    path("cbv/<int:pk>/", ClassView.as_view()),
    path("method/<int:pk>/", MethodDecoratedView.as_view()),
    path("dispatch/<int:pk>/", DispatchDecoratedView.as_view()),
    path("async-cbv/<int:pk>/", AsyncClassView.as_view()),
    path("async-handler/<int:pk>/", AsyncHandlerDecoratedView.as_view()),
    path("async-misdecorated/<int:pk>/", AsyncMisdecoratedView.as_view()),
]


@contextlib.contextmanager
def held_elsewhere(resource: str) -> Iterator[None]:
    """Hold ``resource`` from another thread: the masters then refuse the view's lock. (Held in
    the view's own thread or task, the engine would refuse at once without asking them.)"""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with redlock(resource, label="test holder"):
            taken.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        done.set()
        holder.join(10)


@pytest.fixture(autouse=True)
def _events() -> Iterator[None]:
    inside.clear()
    proceed.clear()
    yield
    proceed.set()  # never leave a view thread waiting


# --- keys ----------------------------------------------------------------------------------------


def test_short_names_are_kept_and_long_ones_hashed_to_the_cap() -> None:
    assert bounded_resource("order:42") == "order:42"
    exact = "x" * MAX_RESOURCE_LENGTH
    assert bounded_resource(exact) == exact
    long_a, long_b = "q:" + "a" * 5000, "q:" + "a" * 4999 + "b"
    bounded_a, bounded_b = bounded_resource(long_a), bounded_resource(long_b)
    assert len(bounded_a) == len(bounded_b) == MAX_RESOURCE_LENGTH
    assert bounded_a.startswith("q:aaaa")
    assert "~sha256:" in bounded_a
    assert bounded_a != bounded_b  # same prefix, different names: different locks
    assert bounded_resource(long_a) == bounded_a  # stable
    assert len(bounded_resource("\udcff" * 300)) == MAX_RESOURCE_LENGTH  # lone surrogates hash


@pytest.mark.parametrize("bad", ["", None, 42, b"bytes"])
def test_bounded_resource_rejects_non_names(bad: object) -> None:
    with pytest.raises(ValueError, match="resource must"):
        bounded_resource(bad)  # type: ignore[arg-type]


def test_format_key_names_the_missing_kwarg() -> None:
    assert format_key("order:{order_id}:{line}", {"order_id": 7, "line": "b"}) == "order:7:b"
    assert format_key("static", {}) == "static"
    with pytest.raises(KeyTemplateError, match=r"needs URL kwarg 'order_id'.*URL kwargs: pk"):
        format_key("order:{order_id}", {"pk": 1})


def test_a_field_the_view_cannot_take_fails_when_decorating() -> None:
    """Was: only at request time, while @locked checks at decoration."""
    with pytest.raises(KeyTemplateError, match=r"needs URL kwarg 'order_id', which view .*pay"):

        @lock_view("order:{order_id}")
        def pay(request: object, pk: int) -> None: ...

    @lock_view("order:{order_id}")  # a view taking **kwargs: checked per request, as before
    def anything(request: object, **kwargs: object) -> None: ...

    @lock_view("order:{order_id}", "account:{pk}", lambda request, **kw: "cart")
    def fine(request: object, order_id: int, *, pk: int) -> None: ...

    assert callable(anything)
    assert callable(fine)


@pytest.mark.parametrize(
    "template", ["x:{}", "x:{0}", "x:{a.b}", "x:{a[0]}", "x:{a!r}", "x:{a:>9}", "x:{", ""]
)
def test_templates_beyond_plain_kwargs_fail_when_decorating(template: str) -> None:
    with pytest.raises(KeyTemplateError, match="template"):
        lock_view(template)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": float("nan")}, "ttl"),
        ({"wait": -1}, "wait"),
        ({"status": 200}, "status"),
        ({"status": True}, "status"),
        ({"on_contended": "nope"}, "on_contended"),
        ({"label": ""}, "label"),
        ({"atomic": 1}, "atomic"),
    ],
)
def test_bad_options_fail_when_decorating(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lock_view("k", **options)  # type: ignore[arg-type]


def test_async_views_refuse_atomic() -> None:
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    with pytest.raises(ValueError, match="sync views only"):
        lock_view("k", atomic=True)(view)


def test_retry_after_rounds_the_hint_up_and_falls_back() -> None:
    assert retry_after(LockContended("r", "m", retry_after=2.3), 1) == 3
    assert retry_after(LockContended("r", "m", retry_after=0.2), 1) == 1
    assert retry_after(LockContended("r", "m"), 1) == 1
    assert retry_after(QuorumUnavailable("r", "m", retry_after=float("nan")), 5) == 5


# --- sync function views -------------------------------------------------------------------------


def test_free_lock_runs_the_view_and_releases(redlock_settings: list) -> None:
    response = Client().get("/order/7/")
    assert response.status_code == 200
    assert response.content == b"order 7"
    key = get_redlock().lock_key("order:7")
    assert all(m.client().get(key) is None for m in redlock_settings)


def test_held_lock_answers_423_with_retry_after(redlock_settings: list) -> None:
    client = Client()
    refusals: list[Exception] = []

    def receiver(sender: object, *, error: Exception, **kwargs: object) -> None:
        refusals.append(error)

    lock_contended.connect(receiver)
    try:
        with held_elsewhere("order:7"):
            response = client.get("/order/7/")
            assert response.status_code == 423
            assert response["Retry-After"] == "1"
            assert client.get("/order/8/").status_code == 200  # another order: another lock
    finally:
        lock_contended.disconnect(receiver)
    assert client.get("/order/7/").status_code == 200
    # Refused by the masters themselves, each one saying "held":
    assert [f.reason for f in refusals[0].failures] == ["held"] * 5  # type: ignore[attr-defined]


def test_status_and_handlers_are_configurable(redlock_settings: list) -> None:
    with held_elsewhere("busy"):
        response = Client().get("/conflict/")
        assert response.status_code == 409
        assert response["Retry-After"] == "1"
        custom_response = Client().get("/custom/")
        assert custom_response.status_code == 429
        assert custom_response.content == b"custom LockContended"


def test_no_quorum_answers_503_with_retry_after(settings, fresh_masters) -> None:
    masters = fresh_masters(3)
    settings.REDLOCK = {"NODES": [m.url for m in masters], "NODE_TIMEOUT": 0.05}
    masters[0].kill()
    masters[1].kill()
    response = Client().get("/order/1/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"127.0.0.1" not in response.content  # which masters failed is for the log only
    assert Client().get("/conflict/").status_code == 599  # on_unavailable


def test_key_from_a_callable_and_bounded(redlock_settings: list) -> None:
    with held_elsewhere("callable:acme:x"):
        assert Client().get("/callable/x/?tenant=acme").status_code == 423
        assert Client().get("/callable/x/?tenant=other").status_code == 200
    long_slug = "s" * 3000
    with held_elsewhere(bounded_resource(f"huge:{long_slug}")):
        assert Client().get(f"/huge/{long_slug}/").status_code == 423


def test_concurrent_requests_are_serialized(redlock_settings: list) -> None:
    """20 threads, one read-pause-write each: without exclusion updates would be lost."""
    COUNTER["t"] = 0
    statuses: list[int] = []

    def one() -> None:
        statuses.append(Client().get("/count/t/").status_code)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert statuses == [200] * 20
    assert COUNTER["t"] == 20


def test_lease_is_extended_while_the_view_runs(redlock_settings: list) -> None:
    """ttl=1, the view runs more than 1.2 s: still held at the end, and no LockLost."""
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(Client().get("/held/a/").status_code))
    worker.start()
    assert inside.wait(10)
    time.sleep(1.2)  # past the TTL: unrenewed, the lock would be free by now
    assert Client().get("/held/a/").status_code == 423
    proceed.set()
    worker.join(10)
    assert results == [200]
    assert Client().get("/held/a/").status_code == 200  # released at the end


def test_lost_lease_fails_the_request(redlock_settings: list) -> None:
    seen: list[LockLost] = []

    def receiver(sender: object, *, lock: object, error: LockLost, **kwargs: object) -> None:
        seen.append(error)

    lock_lost.connect(receiver)
    try:
        with pytest.raises(LockLost, match="lose:a"):
            Client().get("/lose/a/")
    finally:
        lock_lost.disconnect(receiver)
    assert [e.resource for e in seen] == ["lose:a"]


@pytest.mark.django_db
def test_atomic_rolls_back_when_the_lease_is_lost(redlock_settings: list) -> None:
    with pytest.raises(LockLost):
        Client().get("/atomic-lose/zed/")
    assert not Account.objects.filter(name="zed").exists()
    assert Client().get("/atomic-keep/ann/").content == b"committed"
    assert Account.objects.filter(name="ann").exists()


# --- streaming -----------------------------------------------------------------------------------


def test_streaming_body_is_sent_under_the_lock(redlock_settings: list) -> None:
    client = Client()
    response = client.get("/stream/s/")
    assert response.status_code == 200
    assert client.get("/stream/s/").status_code == 423  # body not sent yet: still held
    assert b"".join(response.streaming_content) == b"ab"  # type: ignore[arg-type]
    assert client.get("/stream/s/").status_code == 200  # consumed (and closed) by the client


@pytest.mark.django_db  # response.close() sends request_finished, which looks at the database
def test_streaming_response_closed_early_releases(redlock_settings: list) -> None:
    client = Client()
    response = client.get("/stream/c/")
    assert client.get("/stream/c/").status_code == 423
    response.close()  # what a WSGI server does when the client goes away
    assert client.get("/stream/c/").status_code == 200


def test_lease_lost_during_a_stream_fails_it_after_the_last_chunk(redlock_settings: list) -> None:
    response = Client().get("/lost-stream/l/")
    chunks: list[bytes] = []
    with pytest.raises(LockLost, match="lost-stream:l"):
        chunks.extend(response.streaming_content)  # type: ignore[arg-type]
    assert chunks == [b"first", b"last"]  # all sent, but the response is cut before its end


@pytest.mark.django_db
def test_stream_closed_by_another_thread_expires_within_its_ttl(
    redlock_settings: list, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the owner may release: closed from elsewhere, the lock stops being renewed and
    expires (ttl=1) instead of being held for as long as the response object lives."""
    client = Client()
    response = client.get("/short-stream/x/")
    closer = threading.Thread(target=response.close)
    closer.start()
    closer.join()
    assert "no longer renewed" in caplog.text
    deadline = time.monotonic() + 5
    while (again := client.get("/short-stream/x/")).status_code == 423:
        assert time.monotonic() < deadline, "still held long after its TTL"
        time.sleep(0.1)
    assert again.status_code == 200
    assert b"".join(again.streaming_content) == b"ab"  # type: ignore[arg-type]
    assert response is not None  # the first response object is still alive


def test_async_streaming_body_is_sent_under_the_lock(redlock_settings: list) -> None:
    async def scenario() -> None:
        client = AsyncClient()
        response = await client.get("/astream/s/")
        assert response.status_code == 200
        assert (await client.get("/astream/s/")).status_code == 423
        body = b"".join([chunk async for chunk in response.streaming_content])  # type: ignore[union-attr]
        assert body == b"xy"
        assert (await client.get("/astream/s/")).status_code == 200

    asyncio.run(scenario())


# --- async function views ------------------------------------------------------------------------


def test_async_view_is_locked(redlock_settings: list) -> None:
    async def scenario() -> tuple[int, int, bytes]:
        client = AsyncClient()
        free = await client.get("/async-order/3/")
        with held_elsewhere("order:3"):
            held = await client.get("/async-order/3/")
        return free.status_code, held.status_code, free.content

    free, held, content = asyncio.run(scenario())
    assert (free, held, content) == (200, 423, b"async order 3")


def test_async_requests_at_once_one_wins(redlock_settings: list) -> None:
    """Two async requests on one loop, the first still inside: the second gets 423."""
    entered, leave = asyncio.Event(), asyncio.Event()

    @lock_view("gate")
    async def gate(request: HttpRequest) -> HttpResponse:
        entered.set()
        await asyncio.wait_for(leave.wait(), 10)  # inside until the second was answered
        return HttpResponse("in")

    async def scenario() -> list[int]:
        from django.test import AsyncRequestFactory

        factory = AsyncRequestFactory()
        first = asyncio.create_task(gate(factory.get("/")))
        await until_set(entered, first)
        second = await gate(factory.get("/"))
        leave.set()
        return [(await first).status_code, second.status_code]

    assert asyncio.run(scenario()) == [200, 423]


# --- class-based views ---------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["cbv", "method", "dispatch"])
def test_sync_class_based_views(redlock_settings: list, prefix: str) -> None:
    client = Client()
    assert client.get(f"/{prefix}/5/").content.decode().endswith(" 5")
    with held_elsewhere("cbv:5"):
        assert client.get(f"/{prefix}/5/").status_code == 423
        assert client.get(f"/{prefix}/6/").status_code == 200


@pytest.mark.parametrize("prefix", ["async-cbv", "async-handler"])
def test_async_class_based_views(redlock_settings: list, prefix: str) -> None:
    async def scenario() -> list[int]:
        client = AsyncClient()
        free = await client.get(f"/{prefix}/5/")
        with held_elsewhere("cbv:5"):
            held = await client.get(f"/{prefix}/5/")
        return [free.status_code, held.status_code]

    assert asyncio.run(scenario()) == [200, 423]


def test_sync_wrapper_refuses_an_async_dispatch(redlock_settings: list) -> None:
    async def scenario() -> None:
        await AsyncClient().get("/async-misdecorated/1/")

    with pytest.raises(TypeError, match="decorate the View subclass itself"):
        asyncio.run(scenario())
    assert Client().get("/cbv/1/").status_code == 200  # and the lock was released


def test_decorating_something_else_is_an_error() -> None:
    with pytest.raises(TypeError, match="View subclass"):
        lock_view("k")(int)
