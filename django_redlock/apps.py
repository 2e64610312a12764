from django.apps import AppConfig


class RedlockConfig(AppConfig):
    name = "django_redlock"
    verbose_name = "Redlock"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django.core import checks

        from . import (
            conf,  # noqa: F401 (connects the setting_changed receiver)
            locks,  # noqa: F401 (``redlock()``'s handle and observer: imported now, see below)
            observer,  # noqa: F401
            signals,  # noqa: F401
        )
        from .checks import check_clusters_reachable, check_settings
        from .contrib import otel, prometheus
        from .dbguard import install_everywhere
        from .transactions import install as notice_transactions

        checks.register(check_settings)
        checks.register(check_clusters_reachable, deploy=True)
        install_everywhere()  # every connection opened from now on carries the DB guard
        notice_transactions()  # locks taken inside a transaction wait for its end
        # The handle's modules and the exporters' libraries, when installed, are imported now
        # rather than inside a worker's first lock (about 0.1 s for prometheus_client, 0.05 s
        # for OpenTelemetry's API, 5 ms for ours on a busy 2-CPU machine: the longest waits of
        # freshly started workers racing for a lock). Nothing is registered or exported by this.
        prometheus.warm()
        otel.warm()
