"""Settings of the example project. Everything deployment-specific comes from the environment."""

from importlib.util import find_spec
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    SECRET_KEY=(str, "insecure-example-key-change-me"),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]", "testserver"]),
    DATABASE_URL=(str, f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
)

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ultimat3_jobs",
    "testproject.demo",
]

if find_spec("health_check") is not None:
    # django-health-check (the `health` extra): its page's template; urls.py mounts the checks.
    INSTALLED_APPS.append("health_check")

if env.bool("ULTIMAT3_ACCEPTANCE", default=False):
    # Per-second tasks for the multi-process tests.
    INSTALLED_APPS.append("testproject.acceptance")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

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
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The scheduler, the worker and the admin share one file: take the write lock when a
    # transaction begins (no lock upgrades to deadlock on), wait for it, and let readers read.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # Tests run threads and processes against it: a file, not a shared-cache in-memory database
    # whose table locks ignore the timeout.
    DATABASES["default"]["TEST"] = {"NAME": f"{DATABASES['default']['NAME']}.test"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

ULTIMAT3_JOBS = env.json("ULTIMAT3_JOBS", default={})

# OpenTelemetry (the `otel` extra and an SDK): ULTIMAT3_TRACES=- prints every span, a path
# appends them to that file (testproject/tracing.py).
if env.str("ULTIMAT3_TRACES", default=""):
    from testproject.tracing import configure as configure_tracing

    configure_tracing(env.str("ULTIMAT3_TRACES"))

# Django Tasks (the django-tasks backport, the `tasks` extra) as job rows. A project without
# the extra has no TASKS setting, and neither has this one then.
if find_spec("django_tasks") is not None:
    TASKS = {
        "default": {
            "BACKEND": "ultimat3_jobs.backends.JobsBackend",
            "QUEUES": ["default", "emails"],
        },
        # Keeps what it is given in memory and runs nothing: relayed, never done.
        "elsewhere": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"},
        # Runs each task inside enqueue(): a second backend the relay hands occurrences to.
        "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"},
        # Keeps results in memory and says so: a backend the relay asks whether a task finished.
        "reporting": {"BACKEND": "testproject.demo.reporting.ReportingBackend"},
    }

# Celery (testproject/celery.py reads the CELERY_ settings). The tests start Redis and point
# CELERY_BROKER_URL at it. Late acks and rejection on a lost worker bring a killed worker's
# message back; the short visibility timeout and restore interval bring it back in seconds.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.float("CELERY_VISIBILITY_TIMEOUT", default=60.0),
    "unacked_restore_interval": env.float("CELERY_UNACKED_RESTORE_INTERVAL", default=5.0),
    "unacked_restore_throttle": 1,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# Sentry, for the tests of the check-ins: every envelope goes to the file this names, nothing
# to the network (testproject/sentry_envelopes.py).
if env.str("ULTIMAT3_SENTRY_ENVELOPES", default=""):
    import sentry_sdk

    from testproject.sentry_envelopes import EnvelopeFile

    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=EnvelopeFile(env.str("ULTIMAT3_SENTRY_ENVELOPES")),
        default_integrations=False,
        auto_enabling_integrations=False,
        environment="test",
    )
