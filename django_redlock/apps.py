from django.apps import AppConfig


class RedlockConfig(AppConfig):
    name = "django_redlock"
    verbose_name = "Redlock"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django.core import checks

        from . import conf  # noqa: F401 (connects the setting_changed receiver)
        from .checks import check_clusters_reachable, check_settings
        from .dbguard import install_everywhere

        checks.register(check_settings)
        checks.register(check_clusters_reachable, deploy=True)
        install_everywhere()  # every connection opened from now on carries the DB guard
