"""What an operator asks of the masters, answered for the admin, ``manage.py redlock_status``
and the health check: which locks are held (``inventory``, ``held``), how each master is doing
(``health``), freeing one holder's lock by hand (``force_release``), and showing what the masters
say without a raw control byte (``display``).

They read and change the masters through the engine only: no setting, no request, no template
here (tests/test_package_layout.py checks it). The surfaces that show them are ``views`` and
``admin``, ``management/commands/redlock_status``, ``templatetags`` and
``contrib/health_check``; nothing on a lock's own path imports them.
"""
