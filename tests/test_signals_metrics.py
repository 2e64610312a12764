"""Signals, log records and Prometheus metrics of real locks on real masters."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from django_redlock import LockContended, LockLost, QuorumUnavailable, redlock
from django_redlock.conf import get_redlock
from django_redlock.signals import lock_acquired, lock_contended, lock_lost, lock_released

from .conftest import fresh_python, printed_ok, wait_until


def run_out(masters: list, key: str) -> None:
    """Wait until ``key``'s lease ran out on every master (waited out, not guessed)."""
    assert wait_until(lambda: all(m.call("EXISTS", key) == 0 for m in masters), 10), key


class Recorder:
    """Connects to all four signals and keeps what they sent."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._signals = {
            "acquired": lock_acquired,
            "contended": lock_contended,
            "released": lock_released,
            "lost": lock_lost,
        }
        for name, signal in self._signals.items():
            signal.connect(self._receiver(name), weak=False, dispatch_uid=f"recorder-{name}")

    def _receiver(self, name: str) -> Any:
        def receive(sender: object, **kwargs: Any) -> None:
            kwargs.pop("signal")
            self.events.append((name, kwargs))

        return receive

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def close(self) -> None:
        for name, signal in self._signals.items():
            signal.disconnect(dispatch_uid=f"recorder-{name}")


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def contend(resource: str, wait: float = 0.0) -> BaseException | None:
    """Try ``resource`` from another thread (the holder's own thread is refused without asking
    the masters) and return what that raised."""
    raised: list[BaseException | None] = []

    def attempt() -> None:
        try:
            with redlock(resource, wait=wait):
                raised.append(None)
        except Exception as exc:  # noqa: BLE001 (handed back to the test)
            raised.append(exc)

    worker = threading.Thread(target=attempt)
    worker.start()
    worker.join(10)
    return raised[0]


def test_acquire_and_release_send_signals(redlock_settings: list, recorder: Recorder) -> None:
    with redlock("sig:a") as lock:
        time.sleep(0.05)
    assert recorder.names() == ["acquired", "released"]
    acquired, released = recorder.events[0][1], recorder.events[1][1]
    assert acquired["lock"] is lock
    assert acquired["attempts"] == 1
    assert 0 <= acquired["waited"] < 1
    assert released["held"] >= 0.05


def test_contention_sends_lock_contended(redlock_settings: list, recorder: Recorder) -> None:
    with redlock("sig:b"):
        assert isinstance(contend("sig:b", wait=0.2), LockContended)
    contended = [kw for name, kw in recorder.events if name == "contended"]
    assert len(contended) == 1
    assert isinstance(contended[0]["error"], LockContended)
    assert contended[0]["waited"] >= 0.15  # it kept trying for about `wait`


def test_lost_lease_sends_lock_lost_once(redlock_settings: list, recorder: Recorder) -> None:
    lock = redlock("sig:c", ttl=1.0)

    def outlive_the_lease() -> None:
        with lock:
            run_out(redlock_settings, lock.key)
            assert lock.lost
            assert lock.lost

    with pytest.raises(LockLost):
        outlive_the_lease()
    lost = [kw for name, kw in recorder.events if name == "lost"]
    assert len(lost) == 1
    assert lost[0]["lock"] is lock
    assert isinstance(lost[0]["error"], LockLost)


def test_watchdog_reports_a_lease_taken_away(redlock_settings: list, recorder: Recorder) -> None:
    """An auto-extended lock whose keys vanish (a force release): the watchdog's renewal finds
    them gone and ``lock_lost`` fires while the block still runs."""
    noticed_inside: list[bool] = []

    def force_released() -> None:
        with redlock("sig:d", ttl=1.0, auto_extend=True):
            for m in redlock_settings:
                m.client().delete(get_redlock().lock_key("sig:d"))
            deadline = time.monotonic() + 10
            while "lost" not in recorder.names() and time.monotonic() < deadline:
                time.sleep(0.02)
            noticed_inside.append("lost" in recorder.names())

    with pytest.raises(LockLost):
        force_released()
    assert noticed_inside == [True]


def test_async_locks_send_the_same_signals(redlock_settings: list, recorder: Recorder) -> None:
    async def scenario() -> None:
        async with redlock("sig:e"):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert recorder.names() == ["acquired", "released"]


def test_a_failing_receiver_does_not_break_the_lock(
    redlock_settings: list, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: object, **kwargs: object) -> None:
        raise RuntimeError("receiver bug")

    lock_acquired.connect(broken, weak=False, dispatch_uid="broken")
    try:
        with redlock("sig:f") as lock:
            assert lock.held
    finally:
        lock_acquired.disconnect(dispatch_uid="broken")
    assert not lock.held
    assert any("receiver bug" in (r.exc_text or str(r.exc_info)) for r in caplog.records)


def test_logs_name_the_lock_but_never_its_token(
    redlock_settings: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="django_redlock")
    tokens: list[str] = []

    def held_contended_and_lost() -> None:
        with redlock("log:a", ttl=1.0, label="nightly"):
            value = redlock_settings[0].client().get(get_redlock().lock_key("log:a"))
            tokens.append(value.split(b":", 1)[0].decode())
            assert isinstance(contend("log:a"), LockContended)
            run_out(redlock_settings, get_redlock().lock_key("log:a"))

    with pytest.raises(LockLost):
        held_contended_and_lost()
    token = tokens[0]
    ours = [r for r in caplog.records if r.name == "django_redlock"]
    text = "\n".join(r.getMessage() for r in ours)
    assert len(token) == 32
    assert token not in text
    assert "acquired 'log:a' (nightly)" in text
    assert "not acquired 'log:a'" in text
    assert "LOST 'log:a' (nightly)" in text
    assert "released 'log:a'" in text
    assert [r.levelname for r in ours if "LOST" in r.getMessage()] == ["ERROR"]


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_count_waits_holds_contention_and_losses(redlock_settings: list) -> None:
    before = {
        "acquired": sample("redlock_acquire_wait_seconds_count", outcome="acquired"),
        "contended_wait": sample("redlock_acquire_wait_seconds_count", outcome="contended"),
        "contended": sample("redlock_contended_total", reason="contended"),
        "holds": sample("redlock_hold_seconds_count"),
        "held_for": sample("redlock_hold_seconds_sum"),
        "lost": sample("redlock_lost_total"),
    }
    with redlock("m:a"):
        time.sleep(0.1)
        for _ in range(3):
            assert isinstance(contend("m:a"), LockContended)
    with pytest.raises(LockLost), redlock("m:b", ttl=1.0) as lost:
        run_out(redlock_settings, lost.key)
    after = {
        "acquired": sample("redlock_acquire_wait_seconds_count", outcome="acquired"),
        "contended_wait": sample("redlock_acquire_wait_seconds_count", outcome="contended"),
        "contended": sample("redlock_contended_total", reason="contended"),
        "holds": sample("redlock_hold_seconds_count"),
        "held_for": sample("redlock_hold_seconds_sum"),
        "lost": sample("redlock_lost_total"),
    }
    assert after["acquired"] - before["acquired"] == 2
    assert after["contended_wait"] - before["contended_wait"] == 3
    assert after["contended"] - before["contended"] == 3
    assert after["holds"] - before["holds"] == 2
    assert after["held_for"] - before["held_for"] >= 0.3
    assert after["lost"] - before["lost"] == 1


def test_metrics_count_failing_masters_with_passwords_masked(
    settings: Any, fresh_masters: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Two of three masters refuse our password: no quorum, and each one's failure is counted
    under its masked address. The password appears in no label and no log line."""
    masters = fresh_masters(3)
    bad = [f"redis://:hunter2secret@127.0.0.1:{m.port}/0" for m in masters[:2]]
    settings.REDLOCK = {"NODES": [*bad, masters[2].url]}
    labels = [n.label for n in get_redlock().nodes[:2]]
    assert all("hunter2secret" not in label and "***" in label for label in labels)
    before = [sample("redlock_node_failures_total", node=label, reason="error") for label in labels]
    unavailable = sample("redlock_contended_total", reason="unavailable")
    with pytest.raises(QuorumUnavailable):
        redlock("m:c").acquire()
    after = [sample("redlock_node_failures_total", node=label, reason="error") for label in labels]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert sample("redlock_contended_total", reason="unavailable") - unavailable == 1
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "not acquired 'm:c'" in text
    assert "hunter2secret" not in text
    exported = "\n".join(
        f"{s.name}{s.labels}" for metric in REGISTRY.collect() for s in metric.samples
    )
    assert "hunter2secret" not in exported


def test_a_metric_that_cannot_register_is_logged_and_the_locks_still_work(fresh_masters) -> None:
    """The collectors register when ``redlock()`` first builds the engine: a project's metric of
    the same name makes that fail, which is logged (as an observer's failure would be), never
    raised: the locks work without their metrics. A fresh process: the registry is its own."""
    masters = fresh_masters(1)
    code = (
        "import django\n"
        "from django.conf import settings\n"
        f"settings.configure(INSTALLED_APPS=['django_redlock'], "
        f"REDLOCK={{'NODES': [{masters[0].url!r}]}})\n"
        "django.setup()\n"
        "import prometheus_client\n"
        "prometheus_client.Counter('redlock_contended', 'a project metric of the same name')\n"
        "from django_redlock import redlock\n"
        "for _ in range(2):\n"
        "    with redlock('clash', ttl=5):\n"
        "        pass\n"
        "print('ok')\n"
    )
    done = printed_ok(code)
    assert "django_redlock metrics not registered" in done.stderr
    assert "redlock_contended" in done.stderr  # the clash, named


def test_metrics_are_no_ops_without_prometheus_client() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from django_redlock import LockContended\n"
        "from django_redlock.contrib import prometheus\n"
        "assert not prometheus.enabled()\n"
        "prometheus.acquired(0.1); prometheus.released(1.0); prometheus.lost()\n"
        "prometheus.not_acquired(0.1, LockContended('r', 'held'))\n"
        "print('ok')\n"
    )
    printed_ok(code)


def test_the_exporters_libraries_are_imported_by_the_app_not_by_the_first_lock():
    """A freshly started worker's first lock must not pay for importing prometheus_client and
    OpenTelemetry's API (about 0.15 s on a busy machine, inside its first wait): the app's
    ready() imports them; it registers no metric (they register on first use)."""
    code = (
        "import sys\n"
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django_redlock'], REDLOCK={'NODES': []})\n"
        "assert 'prometheus_client' not in sys.modules\n"
        "django.setup()\n"
        "print('prometheus_client' in sys.modules, 'opentelemetry.trace' in sys.modules)\n"
        "from prometheus_client import REGISTRY\n"
        "names = {m.name for m in REGISTRY.collect()}\n"
        "assert not any(n.startswith('redlock') for n in names), names\n"
    )
    done = fresh_python(code)
    assert done.stdout.split() == ["True", "True"], done.stderr
