from django_redlock import redlock


def test_redlock_acquires_and_releases_on_all_masters(redlock_settings):
    with redlock("smoke") as lock:
        assert lock.validity > 0
        holders = [m.client().get("redlock:lock:smoke") for m in redlock_settings]
        assert all(h is not None for h in holders)
    assert all(m.client().get("redlock:lock:smoke") is None for m in redlock_settings)
