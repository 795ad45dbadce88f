"""Settings from the environment: validated at start, one line naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from botmesh_admin import config

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_the_embedded_default(tmp_path: Path) -> None:
    cfg = config.load({"BOTMESH_DATA_DIR": str(tmp_path)})
    assert cfg.profile == "dev" and cfg.debug
    assert cfg.database_url == f"sqlite:///{tmp_path}/db.sqlite3"
    assert cfg.kv_url == f"sqlite:///{tmp_path}/kv.sqlite3"
    assert cfg.broker_url == "filesystem://"
    assert cfg.bulk_worker_nice == 10
    assert config.load({"BOTMESH_BULK_WORKER_NICE": "19"}).bulk_worker_nice == 19


def test_redis_url_becomes_the_broker() -> None:
    cfg = config.load({"REDIS_URL": "redis://127.0.0.1:6379/0"})
    assert cfg.broker_url == "redis://127.0.0.1:6379/0"


def test_coordination_is_redis_when_configured_else_the_kv() -> None:
    """BOTMESH_COORDINATION_URL defaults to REDIS_URL, else kv: (the Kv of BOTMESH_KV_URL); any is accepted."""
    assert config.load({}).coordination_url == "kv:"
    assert config.load({"REDIS_URL": "redis://127.0.0.1:6379/0"}).coordination_url == "redis://127.0.0.1:6379/0"
    for url in ("kv:", "kv:sqlite:///tmp/c.sqlite3", "kv:postgresql://u@h/db", "memory:", "rediss://h:6380/0"):
        cfg = config.load({"BOTMESH_COORDINATION_URL": url, "REDIS_URL": "redis://127.0.0.1:6379/0"})
        assert cfg.coordination_url == url


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"DATABASE_URL": "mysql://x"}, "DATABASE_URL"),
        ({"DATABASE_URL": "not a url"}, "DATABASE_URL"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL"),
        ({"BOTMESH_KV_URL": "ftp://x"}, "BOTMESH_KV_URL"),
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"BOTMESH_PORT": "eighty"}, "BOTMESH_PORT"),
        ({"BOTMESH_LOG_IDS": "loud"}, "BOTMESH_LOG_IDS"),
        ({"BOTMESH_PROFILE": "staging"}, "BOTMESH_PROFILE"),
        ({"CSRF_TRUSTED_ORIGINS": "example.com"}, "CSRF_TRUSTED_ORIGINS"),
        ({"BOTMESH_COORDINATION_URL": "http://x"}, "BOTMESH_COORDINATION_URL"),
        ({"BOTMESH_COORDINATION_URL": "kv:ftp://x"}, "BOTMESH_COORDINATION_URL"),
        ({"BOTMESH_COORDINATION_URL": "memory"}, "BOTMESH_COORDINATION_URL"),
        ({"BOTMESH_BULK_WORKER_NICE": "low"}, "BOTMESH_BULK_WORKER_NICE"),
        ({"BOTMESH_BULK_WORKER_NICE": "20"}, "BOTMESH_BULK_WORKER_NICE"),
        ({"BOTMESH_BULK_WORKER_NICE": "-5"}, "BOTMESH_BULK_WORKER_NICE"),
    ],
)
def test_malformed_value_names_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load(environ)
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")
    assert "\n" not in str(info.value)


def test_password_in_a_bad_url_is_not_echoed() -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load({"DATABASE_URL": "mysql://user:hunter2@db/x"})
    assert "hunter2" not in str(info.value)


def test_production_refuses_debug_and_default_secret() -> None:
    base = {"BOTMESH_PROFILE": "production", "ALLOWED_HOSTS": "a.example", "SECRET_KEY": "k" * 40}
    assert config.load(base).production
    with pytest.raises(config.ConfigError, match="^DEBUG: "):
        config.load({**base, "DEBUG": "1"})
    with pytest.raises(config.ConfigError, match="^SECRET_KEY: "):
        config.load({**base, "SECRET_KEY": config.DEV_SECRET_KEY})
    with pytest.raises(config.ConfigError, match="^SECRET_KEY: "):
        config.load({k: v for k, v in base.items() if k != "SECRET_KEY"})
    with pytest.raises(config.ConfigError, match="^ALLOWED_HOSTS: "):
        config.load({k: v for k, v in base.items() if k != "ALLOWED_HOSTS"})


def test_secret_from_file(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("s" * 48 + "\n")
    cfg = config.load({"SECRET_KEY_FILE": str(secret)})
    assert cfg.secret_key == "s" * 48
    with pytest.raises(config.ConfigError, match="^SECRET_KEY_FILE: cannot read"):
        config.load({"SECRET_KEY_FILE": str(tmp_path / "missing")})


def test_manage_py_stops_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOTMESH_", "DATABASE_URL"))}
    env.update(DATABASE_URL="oracle://nope", BOTMESH_DATA_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "botmesh-admin: configuration error: DATABASE_URL: expected a URL with scheme sqlite or postgres "
        "or postgresql, got 'oracle://nope'"
    ]
