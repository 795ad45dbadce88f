"""Settings from the environment, validated at start (ARCHITECTURE §2).

Every variable is read here and nowhere else. A missing or malformed value
raises ``ConfigError`` whose message is one line naming the variable; the entry
points (``manage.py``, ``wsgi.py``, the Celery app) print that line and exit
with status 2 instead of a traceback.

A secret may also come from a file: ``SECRET_KEY_FILE=/run/secrets/key`` is
read when ``SECRET_KEY`` is unset (Docker/systemd credentials style).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

DEV_SECRET_KEY = "botmesh-dev-secret-key-do-not-use-in-production-0123456789"
PROFILES = ("dev", "production")
KV_SCHEMES = ("memory", "file", "sqlite", "postgresql", "postgres", "redis", "rediss", "redis+cluster")
JOURNAL_SCHEMES = ("memory", "file", "sqlite", "postgresql", "postgres", "redis", "rediss")
LOG_ID_MODES = ("hashed", "raw", "omit")


class ConfigError(ValueError):
    """A configuration variable is missing or malformed; ``str()`` is one line naming it."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


def env(name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """Return ``name`` from the environment, or the content of the file named by ``name_FILE``."""
    source: Mapping[str, str] = os.environ if environ is None else environ
    value = source.get(name)
    if value is not None and value != "":
        return value
    path = source.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE", f"cannot read {path}: {exc.strerror}") from None
    return default


def _bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(name, f"expected true/false (1/0), got {raw!r}")


def _int(name: str, raw: str | None, default: int, minimum: int = 0) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(name, f"must be at least {minimum}")
    return value


def _nice(name: str, raw: str | None) -> int:
    """Return a niceness increment 0..19 (``nice(2)``: 19 is the lowest CPU priority), default 10."""
    value = _int(name, raw, 10, minimum=0)
    if value > 19:
        raise ConfigError(name, "must be at most 19 (the lowest CPU priority)")
    return value


def _url(name: str, raw: str | None, schemes: tuple[str, ...]) -> str | None:
    if raw is None:
        return None
    parts = urlsplit(raw)
    if "://" not in raw or parts.scheme.lower() not in schemes:
        raise ConfigError(name, f"expected a URL with scheme {' or '.join(schemes)}, got {_redact(raw)!r}")
    return raw


def _coordination_url(name: str, raw: str | None, redis_url: str | None) -> str:
    """Check a coordination URL (``coordination.runtime``): Redis, ``kv:[<kv url>]`` or ``memory:``.

    Unset: ``redis_url`` when Redis is configured, else ``kv:`` (the Kv of ``BOTMESH_KV_URL``).
    """
    if raw is None:
        return redis_url or "kv:"
    if raw == "memory:" or raw == "kv:":
        return raw
    if raw.startswith("kv:"):
        _url(name, raw[len("kv:") :], KV_SCHEMES)
        return raw
    if urlsplit(raw).scheme.lower() in ("redis", "rediss", "redis+cluster") and "://" in raw:
        return raw
    raise ConfigError(
        name, f"expected redis://…, rediss://…, kv:, kv:<a BOTMESH_KV_URL-style URL> or memory:, got {_redact(raw)!r}"
    )


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


@dataclass(frozen=True)
class Config:
    """The validated configuration (paths absolute, URLs checked)."""

    profile: str
    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    csrf_trusted_origins: list[str]
    data_dir: Path
    database_url: str
    redis_url: str | None
    kv_url: str
    coordination_url: str
    journal_url: str
    broker_url: str
    hash_key: str
    credentials_keys: list[str]
    log_ids: str
    port: int
    secure_proxy: bool
    drain_timeout_s: int
    otel_enabled: bool
    secret_key_fallbacks: tuple[str, ...] = ()
    metrics_token: str | None = None
    journal_retention_days: int = 7
    bulk_worker_nice: int = 10
    tuning: Tuning = field(default_factory=lambda: Tuning())
    metrics_limits: MetricsLimits = field(default_factory=lambda: MetricsLimits())

    @property
    def production(self) -> bool:
        return self.profile == "production"


def load(environ: dict[str, str] | None = None, base_dir: Path | None = None) -> Config:
    """Read and validate every variable; raise ``ConfigError`` on the first bad one."""
    environ = dict(os.environ) if environ is None else environ
    base_dir = base_dir or Path(__file__).resolve().parent.parent

    def get(name: str, default: str | None = None) -> str | None:
        return env(name, default, environ)

    profile = (get("BOTMESH_PROFILE", "dev") or "dev").lower()
    if profile not in PROFILES:
        raise ConfigError("BOTMESH_PROFILE", f"expected one of {', '.join(PROFILES)}, got {profile!r}")
    production = profile == "production"

    debug = _bool("DEBUG", get("DEBUG"), default=not production)
    if production and debug:
        raise ConfigError("DEBUG", "must be off in the production profile")

    secret_key = get("SECRET_KEY")
    if secret_key is None:
        if production:
            raise ConfigError("SECRET_KEY", "required in the production profile")
        secret_key = DEV_SECRET_KEY
    if production and (secret_key == DEV_SECRET_KEY or len(secret_key) < 32):
        raise ConfigError("SECRET_KEY", "the production profile needs your own key of 32+ characters")

    fallbacks = tuple(k.strip() for k in (get("SECRET_KEY_FALLBACKS") or "").split(",") if k.strip())
    if fallbacks and get("BOTMESH_HASH_KEY") is None:
        # The hash key defaults to SECRET_KEY: rotating it would silently change every
        # keyed id hash (the CRM suppression list would stop matching opted-out people).
        raise ConfigError(
            "SECRET_KEY_FALLBACKS",
            "set BOTMESH_HASH_KEY to the previous SECRET_KEY before rotating (README: key rotation)",
        )

    hosts_raw = get("ALLOWED_HOSTS")
    if hosts_raw is None and production:
        raise ConfigError("ALLOWED_HOSTS", "required in the production profile (comma-separated host names)")
    allowed_hosts = [h.strip() for h in (hosts_raw or "localhost,127.0.0.1,[::1],testserver").split(",") if h.strip()]
    origins = [o.strip() for o in (get("CSRF_TRUSTED_ORIGINS") or "").split(",") if o.strip()]
    for origin in origins:
        if not origin.startswith(("http://", "https://")):
            raise ConfigError("CSRF_TRUSTED_ORIGINS", f"{origin!r} must start with http:// or https://")

    data_dir = Path(get("BOTMESH_DATA_DIR") or base_dir / "var").resolve()

    database_url = _url("DATABASE_URL", get("DATABASE_URL"), ("sqlite", "postgres", "postgresql")) or (
        f"sqlite:///{data_dir / 'db.sqlite3'}"
    )
    redis_url = _url("REDIS_URL", get("REDIS_URL"), ("redis", "rediss"))
    kv_url = _url("BOTMESH_KV_URL", get("BOTMESH_KV_URL"), KV_SCHEMES) or f"sqlite:///{data_dir / 'kv.sqlite3'}"
    coordination_url = _coordination_url("BOTMESH_COORDINATION_URL", get("BOTMESH_COORDINATION_URL"), redis_url)
    journal_url = _url("BOTMESH_JOURNAL_URL", get("BOTMESH_JOURNAL_URL"), JOURNAL_SCHEMES) or (
        f"sqlite:///{data_dir / 'journal.sqlite3'}"
    )
    broker_url = get("CELERY_BROKER_URL") or redis_url or "filesystem://"
    _url("CELERY_BROKER_URL", broker_url, ("filesystem", "redis", "rediss", "memory", "amqp"))

    log_ids = (get("BOTMESH_LOG_IDS", "hashed") or "hashed").lower()
    if log_ids not in LOG_ID_MODES:
        raise ConfigError("BOTMESH_LOG_IDS", f"expected one of {', '.join(LOG_ID_MODES)}, got {log_ids!r}")

    creds = [k.strip() for k in (get("BOTMESH_CREDENTIALS_KEYS") or "").split(",") if k.strip()]

    return Config(
        profile=profile,
        debug=debug,
        secret_key=secret_key,
        allowed_hosts=allowed_hosts,
        csrf_trusted_origins=origins,
        data_dir=data_dir,
        database_url=database_url,
        redis_url=redis_url,
        kv_url=kv_url,
        coordination_url=coordination_url,
        journal_url=journal_url,
        broker_url=broker_url,
        hash_key=get("BOTMESH_HASH_KEY") or secret_key,
        credentials_keys=creds,
        log_ids=log_ids,
        port=_int("BOTMESH_PORT", get("BOTMESH_PORT"), 8000, minimum=1),
        secure_proxy=_bool("BOTMESH_SECURE_PROXY", get("BOTMESH_SECURE_PROXY"), default=production),
        drain_timeout_s=_int("BOTMESH_DRAIN_TIMEOUT", get("BOTMESH_DRAIN_TIMEOUT"), 25, minimum=1),
        otel_enabled=bool(get("OTEL_EXPORTER_OTLP_ENDPOINT") or get("OTEL_TRACES_EXPORTER")),
        secret_key_fallbacks=fallbacks,
        metrics_token=get("BOTMESH_METRICS_TOKEN"),
        journal_retention_days=_int(
            "BOTMESH_JOURNAL_RETENTION_DAYS", get("BOTMESH_JOURNAL_RETENTION_DAYS"), 7, minimum=0
        ),
        bulk_worker_nice=_nice("BOTMESH_BULK_WORKER_NICE", get("BOTMESH_BULK_WORKER_NICE")),
        tuning=load_tuning(get),
        metrics_limits=load_metrics_limits(get),
    )


def load_or_exit() -> Config:
    """Return ``load()``; on ``ConfigError`` print one line to stderr and exit with status 2."""
    try:
        return load()
    except ConfigError as exc:
        print(f"botmesh-admin: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


# -- the packages' tunables (campaigns, deployments, coordination, channels, hub) ----------
# Read here like every other variable (settings.py hands them to Django settings, where
# the packages read them when used), so a typo stops the process at start with one line.


@dataclass(frozen=True)
class Tuning:
    """Validated package settings; times in milliseconds, rates in messages per second."""

    campaign_batch: int = 50
    campaign_slot_ttl_ms: int = 60_000
    campaign_max_attempts: int = 3
    campaign_concurrency: int = 8
    campaign_lease_ms: int = 30_000
    campaign_rate_per_s: tuple[tuple[str, float], ...] = ()
    retain_versions: int | None = None
    coordination_prefix: str = "botmesh"
    coordination_lease_ms: int = 15_000
    whatsapp_api_base: str | None = None
    telegram_api_base: str | None = None
    hub_runtime_file: str | None = None
    hub_runtime_version: str | None = None
    crm_max_segments: int = 50  # every contact write judges each saved segment (its membership)


def _bounded(name: str, raw: str | None, default: int, low: int, high: int) -> int:
    value = _int(name, raw, default, minimum=low)
    if value > high:
        raise ConfigError(name, f"must be at most {high}")
    return value


def _rates(name: str, raw: str | None) -> tuple[tuple[str, float], ...]:
    """Parse ``whatsapp=60,telegram=25`` (messages per second per channel kind)."""
    out: dict[str, float] = {}
    for part in (raw or "").split(","):
        if not part.strip():
            continue
        kind, sep, number = part.partition("=")
        kind = kind.strip().lower()
        if not sep or kind not in ("whatsapp", "telegram"):
            raise ConfigError(name, f"expected whatsapp=<rate>,telegram=<rate>, got {part.strip()!r}")
        try:
            rate = float(number)
        except ValueError:
            raise ConfigError(
                name, f"{kind}: expected a number of messages per second, got {number.strip()!r}"
            ) from None
        if not 0 < rate <= 10_000:
            raise ConfigError(name, f"{kind}: must be more than 0 and at most 10000 per second")
        out[kind] = rate
    return tuple(sorted(out.items()))


def _api_base(name: str, raw: str | None) -> str | None:
    if raw is None:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(name, f"expected an http:// or https:// URL, got {_redact(raw)!r}")
    return raw.rstrip("/")


def _semver(name: str, raw: str | None) -> str | None:
    import semver

    if raw is not None and not semver.Version.is_valid(raw):
        raise ConfigError(name, f"expected a SemVer 2.0 version like 2.1.0, got {raw!r}")
    return raw


def _runtime_file(name: str, raw: str | None) -> str | None:
    """Check the hub runtime file now: readable JSON ``{"runtime_version", "known_permissions"}``."""
    import json

    import semver

    if raw is None:
        return None
    try:
        data = json.loads(Path(raw).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(name, f"cannot read {raw}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(name, f"{raw} is not JSON: {exc}") from None
    version = data.get("runtime_version") if isinstance(data, dict) else None
    if not isinstance(version, str) or not semver.Version.is_valid(version):
        raise ConfigError(name, f"{raw}: runtime_version must be a SemVer 2.0 version")
    perms = data.get("known_permissions")
    if not isinstance(perms, list) or not all(isinstance(p, str) and p for p in perms):
        raise ConfigError(name, f"{raw}: known_permissions must be a list of strings")
    return raw


def load_tuning(get: Callable[[str], str | None]) -> Tuning:
    """Read and validate the packages' variables through ``get``; raise ``ConfigError`` naming one."""
    prefix = get("BOTMESH_COORDINATION_PREFIX") or "botmesh"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", prefix):  # coordination.base.PREFIX_RE
        raise ConfigError("BOTMESH_COORDINATION_PREFIX", f"expected 1-63 of a-z 0-9 _ . -, got {prefix!r}")
    retain = get("BOTMESH_RETAIN_VERSIONS")
    return Tuning(
        campaign_batch=_bounded("BOTMESH_CAMPAIGN_BATCH", get("BOTMESH_CAMPAIGN_BATCH"), 50, 1, 1000),
        campaign_slot_ttl_ms=_bounded(
            "BOTMESH_CAMPAIGN_SLOT_TTL_MS", get("BOTMESH_CAMPAIGN_SLOT_TTL_MS"), 60_000, 1000, 86_400_000
        ),
        campaign_max_attempts=_bounded(
            "BOTMESH_CAMPAIGN_MAX_ATTEMPTS", get("BOTMESH_CAMPAIGN_MAX_ATTEMPTS"), 3, 1, 100
        ),
        campaign_concurrency=_bounded("BOTMESH_CAMPAIGN_CONCURRENCY", get("BOTMESH_CAMPAIGN_CONCURRENCY"), 8, 1, 256),
        campaign_lease_ms=_bounded(
            "BOTMESH_CAMPAIGN_LEASE_MS", get("BOTMESH_CAMPAIGN_LEASE_MS"), 30_000, 1000, 3_600_000
        ),
        campaign_rate_per_s=_rates("BOTMESH_CAMPAIGN_RATE_PER_S", get("BOTMESH_CAMPAIGN_RATE_PER_S")),
        retain_versions=None if retain is None else _int("BOTMESH_RETAIN_VERSIONS", retain, 0, minimum=1),
        coordination_prefix=prefix,
        coordination_lease_ms=_bounded(
            "BOTMESH_COORDINATION_LEASE_MS", get("BOTMESH_COORDINATION_LEASE_MS"), 15_000, 100, 600_000
        ),
        whatsapp_api_base=_api_base("BOTMESH_WHATSAPP_API_BASE", get("BOTMESH_WHATSAPP_API_BASE")),
        telegram_api_base=_api_base("BOTMESH_TELEGRAM_API_BASE", get("BOTMESH_TELEGRAM_API_BASE")),
        hub_runtime_file=_runtime_file("BOTMESH_HUB_RUNTIME_FILE", get("BOTMESH_HUB_RUNTIME_FILE")),
        hub_runtime_version=_semver("BOTMESH_HUB_RUNTIME_VERSION", get("BOTMESH_HUB_RUNTIME_VERSION")),
        crm_max_segments=_bounded("BOTMESH_CRM_MAX_SEGMENTS", get("BOTMESH_CRM_MAX_SEGMENTS"), 50, 1, 500),
    )


# -- bot metrics cardinality (observability) ------------------------------------------------
# How many series pushed bots may put on /metrics (issue 18): live bots per tenant, live
# replicas per bot, and how long a replica stays live after its last push.


@dataclass(frozen=True)
class MetricsLimits:
    """Caps on pushed bot metrics: ``max_bots`` live bots per tenant, ``max_replicas`` per bot.

    A replica is live for ``replica_ttl_s`` seconds after its last push; then it
    leaves ``/metrics`` and stops counting against the caps.
    """

    max_bots: int = 20
    max_replicas: int = 20
    replica_ttl_s: int = 300


def load_metrics_limits(get: Callable[[str], str | None]) -> MetricsLimits:
    """Read ``BOTMESH_METRICS_MAX_BOTS``, ``…_MAX_REPLICAS`` and ``…_REPLICA_TTL_S``.

    Raise ``ConfigError`` naming the variable that is wrong.
    """
    return MetricsLimits(
        max_bots=_bounded("BOTMESH_METRICS_MAX_BOTS", get("BOTMESH_METRICS_MAX_BOTS"), 20, 1, 10_000),
        max_replicas=_bounded("BOTMESH_METRICS_MAX_REPLICAS", get("BOTMESH_METRICS_MAX_REPLICAS"), 20, 1, 10_000),
        # at most the 24 h a pushed sample is kept (observability.stores.memory.DEFAULT_RETENTION_MS)
        replica_ttl_s=_bounded("BOTMESH_METRICS_REPLICA_TTL_S", get("BOTMESH_METRICS_REPLICA_TTL_S"), 300, 1, 86_400),
    )
