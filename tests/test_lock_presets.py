"""``redlock()`` checks a set of options once per engine and keeps it (``locks.plain``): every
later lock with the same options is made from what was kept, its resources alone checked. What
was kept must never outlive what it was checked against (the settings' engine), never stand in
for a value that is equal but not valid (``True == 1``), and never be changed through one lock
for the others. On real masters: the locks made from kept options are acquired, and what the
masters store is read back."""

from __future__ import annotations

import math
import re
import sys
import threading

import pytest

import django_redlock
from django_redlock import locks, metrics, redlock
from django_redlock.conf import get_redlock
from django_redlock.engine.handles import Handle
from django_redlock.locks import DjangoLock

from .callers import stored_owners, stored_values


def _fields(lock: DjangoLock) -> dict[str, object]:
    """Every slot of the handle (``_callers``: whom it holds for, which is nobody yet)."""
    names = {n for cls in type(lock).__mro__ for n in getattr(cls, "__slots__", ())}
    fields = {n: getattr(lock, n) for n in names - {"__weakref__", "_callers"}}
    fields["_callers"] = (type(lock._callers), lock._callers._one, lock._callers._many)
    return fields


def test_a_lock_made_from_kept_options_is_the_lock_made_from_scratch(redlock_settings):
    options = {"ttl": 10, "wait": 0.25, "label": "nightly", "template": "job:{id}"}
    first = redlock("job:1", **options)  # checked from scratch (DjangoLock(...)), and kept
    second = redlock("job:1", **options)  # made from what was kept
    assert _fields(first) == _fields(second)
    assert second.key == get_redlock().lock_key("job:1")
    several = [redlock("job:a", "job:b", **options) for _ in range(2)]
    assert _fields(several[0]) == _fields(several[1])
    assert several[1].keys == tuple(map(get_redlock().lock_key, ("job:a", "job:b")))
    with second:  # a working lock: on the masters under its key, with its label
        assert [o["label"] for o in stored_owners(redlock_settings, second.key)] == ["nightly"] * 5


def test_a_settings_change_reaches_locks_with_kept_options(settings, redlock_settings):
    urls = [m.url for m in redlock_settings]
    assert redlock("cfg").ttl == 30.0  # the default TTL, kept for redlock("...") with no option
    settings.REDLOCK = {"NODES": urls, "TTL": 7, "WAIT": 0.5, "KEY_PREFIX": "other:"}
    lock = redlock("cfg")
    assert (lock.ttl, lock.wait, lock.key) == (7.0, 0.5, "other:lock:cfg")
    with lock:
        assert None not in stored_values(redlock_settings, "other:lock:cfg")
    assert redlock("cfg", ttl=20).ttl == 20.0  # kept, for this engine
    settings.REDLOCK = {"NODES": urls, "TTL": 10, "MAX_TTL": 15}
    with pytest.raises(ValueError, match=re.escape("ttl 20 is over max_ttl=15")):
        redlock("cfg", ttl=20)
    assert redlock("cfg", ttl=15).ttl == 15.0
    assert redlock("cfg").ttl == 10.0


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ({"ttl": 1}, {"ttl": True}, "ttl must be a number of seconds, got True"),
        ({"ttl": 1.0}, {"ttl": True}, "ttl must be a number of seconds, got True"),
        ({"wait": 0}, {"wait": False}, "wait must be a number of seconds, got False"),
        ({"wait": 1}, {"wait": True}, "wait must be a number of seconds, got True"),
        ({"db_guard": True}, {"db_guard": 1}, "db_guard must be True or False, got 1"),
        ({"db_guard": False}, {"db_guard": 0}, "db_guard must be True or False, got 0"),
        ({"label": None}, {"label": ["a"]}, "label must be a non-empty str, got ['a']"),
        ({"template": None}, {"template": {}}, "template must be a non-empty str or None"),
        ({"ttl": 1}, {"ttl": 1, "resource": ""}, "resource must not be empty"),
        ({"ttl": 1}, {"ttl": 1, "resource": 7}, "resource must be a str, got int 7"),
        ({"ttl": 1}, {"ttl": 1, "resource": "a\udcffb"}, "resource has a lone surrogate"),
    ],
)
def test_an_equal_value_is_checked_as_itself(redlock_settings, good, bad, message):
    """``True == 1 == 1.0`` as dictionary keys: a kept ``ttl=1`` must not let ``ttl=True`` by."""
    assert redlock("job", **good).held is False  # kept
    options = {"resource": "job", **bad}
    resource = options.pop("resource")
    with pytest.raises(ValueError, match=re.escape(message)):
        redlock(resource, **options)


def test_nan_and_a_float_subclass_are_checked(redlock_settings):
    class Seconds(float):
        pass

    assert redlock("job", ttl=5.0).ttl == 5.0
    assert redlock("job", ttl=Seconds(5.0)).ttl == 5.0  # valid (a float), kept as its own key
    for _ in range(2):  # NaN is never equal to itself: checked (and refused) every time
        with pytest.raises(ValueError, match="ttl must be finite, got nan"):
            redlock("job", ttl=math.nan)


def test_setting_an_option_of_one_lock_leaves_the_others_as_made(redlock_settings):
    options = {"ttl": 10, "label": "batch", "template": "batch:{n}"}
    one, other = redlock("batch:1", **options), redlock("batch:2", **options)
    one.label, one.template, one.db_guard, one.ttl = "changed", "changed:{n}", False, 3
    assert (one.label, one.template, one.db_guard, one.ttl) == ("changed", "changed:{n}", False, 3)
    later = redlock("batch:3", **options)
    for lock in (other, later):
        assert (lock.label, lock.template, lock.db_guard, lock.ttl) == (
            "batch",
            "batch:{n}",
            True,
            10,
        )
    with later:
        assert [o["label"] for o in stored_owners(redlock_settings, later.key)] == ["batch"] * 5


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("template", 5, "template must be a non-empty str or None, got 5"),
        ("template", "", "template must be a non-empty str or None, got ''"),
        ("db_guard", "yes", "db_guard must be True or False, got 'yes'"),
        ("db_guard", 1, "db_guard must be True or False, got 1"),
    ],
)
def test_a_bad_option_set_on_a_lock_is_refused_and_changes_nothing(
    redlock_settings, name, value, message
):
    """The template is a metric label, read by the observer as it is: checked when set, as
    ``redlock()`` checks it, and the lock keeps what it had."""
    lock = redlock("report:1", ttl=10, template="report:{id}")
    with pytest.raises(ValueError, match=re.escape(message)):
        setattr(lock, name, value)
    assert (lock.template, lock.db_guard) == ("report:{id}", True)
    lock.template = None
    assert lock.template == metrics.UNTEMPLATED


def test_options_set_on_one_lock_from_two_threads_at_once_all_stay_set(redlock_settings):
    """Setting an option copies the lock's record (shared with other locks) into one of its own:
    a read, a copy and a write. Two threads setting different options of one lock at once must
    not lose either (switching threads every microsecond, this lost one in most trials)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(60):
            lock = redlock("report:1", ttl=10)
            start = threading.Barrier(2)

            def label_and_guard(lock: DjangoLock = lock, start: threading.Barrier = start) -> None:
                start.wait()
                for n in range(200):
                    lock.label, lock.db_guard = f"label {n}", n % 2 == 0

            def hold_and_template(
                lock: DjangoLock = lock, start: threading.Barrier = start
            ) -> None:
                start.wait()
                for n in range(200):
                    lock.max_hold, lock.template = float(n + 1), f"report:{{n{n}}}"

            threads = [threading.Thread(target=f) for f in (label_and_guard, hold_and_template)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            set_last = (lock.label, lock.db_guard, lock.max_hold, lock.template)
            assert set_last == ("label 199", False, 200.0, "report:{n199}")
    finally:
        sys.setswitchinterval(interval)


def test_the_kept_options_are_bounded(redlock_settings):
    """A TTL computed per call makes a set of options per call: the table starts again when full."""
    for i in range(locks.PRESETS_KEPT + 10):
        assert redlock("job", ttl=1 + i / 1000).ttl == 1 + i / 1000
    assert len(locks._presets[1]) <= locks.PRESETS_KEPT


def test_a_lock_with_other_options_is_made_from_scratch(redlock_settings):
    """Options that ``plain()`` does not take still make their own kind of lock, checked."""
    reader = redlock("doc", shared=True, ttl=5)
    assert type(reader) is locks.DjangoReaderLock
    assert reader.ttl == 5.0
    assert redlock("doc", reentrant=True).reentrant is True
    with pytest.raises(ValueError, match="shared must be True or False, got 1"):
        redlock("doc", shared=1)
    assert isinstance(django_redlock.redlock("doc"), Handle)


class _UnhashableSeconds(float):
    """A valid number of seconds that cannot be a key (``__eq__`` without ``__hash__``)."""

    def __eq__(self, other: object) -> bool:
        return float.__eq__(self, other)


def test_a_valid_value_that_cannot_be_kept_makes_each_lock_in_full(redlock_settings):
    ttl = _UnhashableSeconds(5.0)
    locks_made = [redlock("unkept", ttl=ttl) for _ in range(2)]  # neither kept nor refused
    assert [lock.ttl for lock in locks_made] == [5.0, 5.0]
    with locks_made[1]:
        assert None not in stored_values(redlock_settings, locks_made[1].key)
