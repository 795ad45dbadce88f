"""Django settings. Every value comes from ``botmesh_admin.config`` (the environment)."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from botmesh_admin import config as _config

CONFIG = _config.load()
BASE_DIR = Path(__file__).resolve().parent.parent
CONFIG.data_dir.mkdir(parents=True, exist_ok=True)

SECRET_KEY = CONFIG.secret_key
SECRET_KEY_FALLBACKS = list(CONFIG.secret_key_fallbacks)  # old keys: sessions/signatures stay valid
DEBUG = CONFIG.debug
ALLOWED_HOSTS = CONFIG.allowed_hosts
CSRF_TRUSTED_ORIGINS = CONFIG.csrf_trusted_origins
CSRF_FAILURE_VIEW = "botmesh_admin.httperrors.csrf_failure"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",  # serves the API docs' Swagger UI from our static files, not a CDN (no internet needed)
    "botmesh_admin.tenancy",
    "botmesh_admin.events",
    "botmesh_admin.coordination",
    "botmesh_admin.channels",
    "botmesh_admin.observability",
    "botmesh_admin.dashboard",
    "inbox",
    "crm",
    "campaigns",
    "hub",
    "deployments",
]

MIDDLEWARE = [
    "botmesh_admin.httperrors.JsonErrorMiddleware",  # first: it also sees what later middleware refuse
    "botmesh_admin.chunkedbody.ChunkedBodyMiddleware",  # before anything reads a chunked body
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "botmesh_admin.urls"
WSGI_APPLICATION = "botmesh_admin.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "botmesh_admin" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "botmesh_admin.tenancy.context.navigation",
            ],
            # ``{{ value|when }}`` (one time format, the tenant's zone) and the refused-form tags of every page.
            "builtins": ["botmesh_admin.timefmt", "botmesh_admin.formerrors"],
        },
    },
]

DATABASES = {"default": dj_database_url.parse(CONFIG.database_url, conn_max_age=60)}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
# Request bodies (webhooks, API JSON, a ledger push) up to 16 MiB; larger ones get a JSON 413
# (``botmesh_admin.api`` and the webhook views). File uploads (CSV import) stream to disk.
DATA_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "botmesh_admin" / "static"]
STATIC_ROOT = Path(_config.env("BOTMESH_STATIC_ROOT") or CONFIG.data_dir / "static")
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if CONFIG.production
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = not CONFIG.production

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the cookie-less meta tag instead
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if CONFIG.secure_proxy:
    # Behind a TLS-terminating reverse proxy that sets X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    USE_X_FORWARDED_HOST = True
if CONFIG.production:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = _config.env("BOTMESH_SSL_REDIRECT", "1") == "1"
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

if CONFIG.redis_url:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CONFIG.redis_url}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# botmesh kernel
BOTMESH_KV_URL = CONFIG.kv_url
BOTMESH_JOURNAL_URL = CONFIG.journal_url
BOTMESH_REDIS_URL = CONFIG.redis_url
BOTMESH_COORDINATION_URL = CONFIG.coordination_url
BOTMESH_HASH_KEY = CONFIG.hash_key
BOTMESH_LOG_IDS = CONFIG.log_ids
BOTMESH_DATA_DIR = CONFIG.data_dir
BOTMESH_DRAIN_TIMEOUT_S = CONFIG.drain_timeout_s
BOTMESH_BULK_WORKER_NICE = CONFIG.bulk_worker_nice
BOTMESH_METRICS_TOKEN = CONFIG.metrics_token
BOTMESH_JOURNAL_RETENTION_DAYS = CONFIG.journal_retention_days
BOTMESH_LOGIN_MAX_FAILURES = 5
BOTMESH_LOGIN_LOCKOUT_MS = 15 * 60 * 1000

# The packages' tunables (config.Tuning; README: Configuration), read by them when used.
_tuning = CONFIG.tuning
BOTMESH_CAMPAIGN_BATCH = _tuning.campaign_batch
BOTMESH_CAMPAIGN_SLOT_TTL_MS = _tuning.campaign_slot_ttl_ms
BOTMESH_CAMPAIGN_MAX_ATTEMPTS = _tuning.campaign_max_attempts
BOTMESH_CAMPAIGN_CONCURRENCY = _tuning.campaign_concurrency
BOTMESH_CAMPAIGN_LEASE_MS = _tuning.campaign_lease_ms
BOTMESH_CAMPAIGN_RATE_PER_S = dict(_tuning.campaign_rate_per_s)
BOTMESH_RETAIN_VERSIONS = _tuning.retain_versions
BOTMESH_COORDINATION_PREFIX = _tuning.coordination_prefix
BOTMESH_COORDINATION_LEASE_MS = _tuning.coordination_lease_ms
BOTMESH_WHATSAPP_API_BASE = _tuning.whatsapp_api_base
BOTMESH_TELEGRAM_API_BASE = _tuning.telegram_api_base
BOTMESH_HUB_RUNTIME_FILE = _tuning.hub_runtime_file
BOTMESH_HUB_RUNTIME_VERSION = _tuning.hub_runtime_version
BOTMESH_CRM_MAX_SEGMENTS = _tuning.crm_max_segments

# Bot metrics cardinality (config.MetricsLimits; README: Metrics and traces).
BOTMESH_METRICS_MAX_BOTS = CONFIG.metrics_limits.max_bots
BOTMESH_METRICS_MAX_REPLICAS = CONFIG.metrics_limits.max_replicas
BOTMESH_METRICS_REPLICA_TTL_S = CONFIG.metrics_limits.replica_ttl_s

# Celery (ARCHITECTURE §9). The embedded default needs no server: filesystem transport.
CELERY_BROKER_URL = CONFIG.broker_url
_broker_dir = CONFIG.data_dir / "broker"
if CELERY_BROKER_URL.startswith("filesystem://"):
    (_broker_dir / "queue").mkdir(parents=True, exist_ok=True)
    (_broker_dir / "processed").mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport with atomic writes and corrupt messages set aside
    # (a full disk left zero-byte messages that crashed every worker start).
    CELERY_BROKER_TRANSPORT = "botmesh_admin.filesystem_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),  # kombu's default is ./control of the cwd
        "corrupt_folder": str(_broker_dir / "corrupt"),
        "store_processed": False,
        # kombu polls the folder every second by default: a message waited up to a second
        # before a worker saw it (with ``filesystem_broker.Transport.worker_wait_s``, the other
        # wait a worker had). A poll is a listdir of a small folder: ten a second cost nothing.
        "polling_interval": 0.1,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# prefork, but a free process is still used after a broker reconnect (botmesh_admin.celery_pool)
CELERY_WORKER_POOL = "botmesh_admin.celery_pool:TaskPool"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "botmesh_admin.coordination.beat:LeaderScheduler"
CELERY_BEAT_SCHEDULE_FILENAME = str(CONFIG.data_dir / "celerybeat-schedule")
CELERY_TIMEZONE = "UTC"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # The id and secret filters are declared here, not only added by logs.install() from ready():
    # runserver loads wsgi.py, whose django.setup() configures logging again after the apps are
    # ready, and its new handler printed django-ninja's "Unexpected auth - 'Basic …'" in clear.
    "filters": {
        "ids": {"()": "botmesh_admin.observability.logs.IdFilter"},
        "secrets": {"()": "botmesh_admin.observability.logs.RedactFilter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["ids", "secrets"]}},
    "root": {"handlers": ["console"], "level": "INFO"},
    # Every line goes through the root's handler and its id and secret filters (above): Django's
    # defaults give "django" a console handler of its own (with DEBUG) and "django.server"
    # none with propagate off, so Python's last-resort handler printed runserver's 4xx lines —
    # request paths with raw chat keys — unfiltered, and DEBUG printed django.request's twice.
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": [], "level": "WARNING", "propagate": True},
    },
}
