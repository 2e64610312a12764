from django.apps import AppConfig


class FencedAppConfig(AppConfig):
    name = "tests.fencedapp"
    label = "fencedapp"
    default_auto_field = "django.db.models.AutoField"
