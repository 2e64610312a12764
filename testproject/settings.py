"""The demo site. ``manage.py demo`` starts five local Redis masters and passes their URLs in
``REDLOCK_NODES`` (comma-separated); set it yourself to point the demo at other masters."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DEMO_DIR = Path(os.environ.get("REDLOCK_DEMO_DIR", BASE_DIR / ".demo"))

# Loopback-only demo: a fixed key is fine because the site is never exposed.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")  # noqa: S105
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "testproject.urls"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redlock",
    "testproject.shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DEMO_DIR / "demo.sqlite3",
        # Several runserver threads write at once; wait for SQLite's write lock instead of failing.
        "OPTIONS": {"timeout": 20},
    }
}
STATIC_URL = "/static/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

REDLOCK = {
    "NODES": [n for n in os.environ.get("REDLOCK_NODES", "").split(",") if n],
    "TTL": 10.0,
    "WAIT": 5.0,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # WARNING: contention is normal (INFO), and a refused command already says so itself.
    "loggers": {"django_redlock": {"handlers": ["console"], "level": "WARNING"}},
}
