"""Secrets: each one from the environment or a ``*_FILE``, read only by ``config``, never in any output."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from botmesh_admin import config

ROOT = Path(__file__).resolve().parents[2]
CODE = ["botmesh_admin", "inbox", "crm", "campaigns", "hub", "deployments"]

# variable -> (Config attribute, value to read back)
SECRETS = {
    "SECRET_KEY": ("secret_key", "k" * 40),
    "SECRET_KEY_FALLBACKS": ("secret_key_fallbacks", ("old-key-" + "o" * 32,)),
    "BOTMESH_HASH_KEY": ("hash_key", "hash-key-value"),
    "BOTMESH_CREDENTIALS_KEYS": ("credentials_keys", ["new-credentials-key", "old-credentials-key"]),
    "BOTMESH_METRICS_TOKEN": ("metrics_token", "scrape-token-value"),
    "DATABASE_URL": ("database_url", "postgresql://u:p4ss@db:5432/botmesh"),
    "REDIS_URL": ("redis_url", "redis://:p4ss@redis:6379/0"),
    "BOTMESH_KV_URL": ("kv_url", "postgresql://u:p4ss@db:5432/botmesh"),
    "BOTMESH_JOURNAL_URL": ("journal_url", "redis://:p4ss@redis:6379/2"),
    "CELERY_BROKER_URL": ("broker_url", "redis://:p4ss@redis:6379/1"),
}


def as_text(value: object) -> str:
    return value if isinstance(value, str) else ",".join(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("variable", sorted(SECRETS))
def test_every_secret_can_come_from_a_file(variable: str, tmp_path: Path) -> None:
    attribute, value = SECRETS[variable]
    (tmp_path / "secret").write_text(as_text(value) + "\n")  # the trailing newline of `echo` is dropped
    environ = {f"{variable}_FILE": str(tmp_path / "secret")}
    if variable == "SECRET_KEY_FALLBACKS":
        environ["BOTMESH_HASH_KEY"] = "pinned"
    assert getattr(config.load(environ), attribute) == value


def test_an_unreadable_secret_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match=r"^BOTMESH_METRICS_TOKEN_FILE: cannot read"):
        config.load({"BOTMESH_METRICS_TOKEN_FILE": str(tmp_path / "missing")})


def test_no_code_reads_a_secret_from_the_environment_but_config() -> None:
    """Secrets go through ``config.env`` (so ``*_FILE`` works) and nowhere else."""
    names = "|".join(sorted({*SECRETS, "PGPASSWORD", "DJANGO_SUPERUSER_PASSWORD", "BOTMESH_BOT_TOKEN"}))
    direct = re.compile(rf"(environ\b[^\n]*|getenv\([^\n]*)[\"']({names})[\"']")
    offenders = []
    for package in CODE:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "config.py" and path.parent.name == "botmesh_admin":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if direct.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_a_config_error_never_shows_a_password() -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load({"DATABASE_URL": "mysql://admin:hunter2-secret@db/x"})
    assert "hunter2-secret" not in str(err.value) and "***" in str(err.value)


@pytest.mark.services
def test_commands_never_print_or_log_a_secret(tmp_path: Path, postgres_url: str) -> None:
    """Run migrate, check --deploy, backup, restore (and a refused restore) with known secrets.

    The database password (a role made for this test), the secret key, the
    hash key, the credentials key and the metrics token appear in no output.
    """
    import psycopg

    role, password = f"bk_{uuid.uuid4().hex[:8]}", f"pw-{secrets.token_hex(12)}"
    dbs = [f"{role}_a", f"{role}_b"]
    host = postgres_url.split("@", 1)[1].rsplit("/", 1)[0]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        for db in dbs:
            conn.execute(f"CREATE DATABASE {db} OWNER {role}")
    known = {
        "SECRET_KEY": f"sk-{secrets.token_urlsafe(40)}",
        "BOTMESH_HASH_KEY": f"hk-{secrets.token_urlsafe(24)}",
        "BOTMESH_CREDENTIALS_KEYS": f"ck-{secrets.token_urlsafe(24)}",
        "BOTMESH_METRICS_TOKEN": f"mt-{secrets.token_urlsafe(24)}",
    }
    outputs: list[str] = []

    def manage(db: str, *args: str, ok: bool = True) -> None:
        url = f"postgresql://{role}:{password}@{host}/{db}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BOTMESH_", "DJANGO_"))}
        env.update(known, BOTMESH_PROFILE="production", ALLOWED_HOSTS="admin.example.com",
                   DATABASE_URL=url, BOTMESH_KV_URL=url, BOTMESH_JOURNAL_URL=url,
                   BOTMESH_DATA_DIR=str(tmp_path / db), CELERY_BROKER_URL="memory://",
                   DJANGO_SETTINGS_MODULE="botmesh_admin.settings")  # fmt: skip
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        outputs.append(proc.stdout + proc.stderr)
        assert (proc.returncode == 0) == ok, proc.stderr[-2000:]

    try:
        manage(dbs[0], "migrate", "--noinput", "-v", "3")
        manage(dbs[0], "check", "--deploy", "-v", "3")
        manage(dbs[0], "botmesh_tenant", "create", "acme", "--name", "ACME")
        manage(dbs[0], "botmesh_channels_rotate", "-v", "3")
        manage(dbs[0], "backup", str(tmp_path / "backup"), "-v", "3")
        manage(dbs[1], "restore", str(tmp_path / "backup"), "-v", "3")
        manage(dbs[1], "restore", str(tmp_path / "backup"), "-v", "3", ok=False)  # not empty: refused
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for db in dbs:
                conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
    text = "\n".join(outputs)
    assert "not empty" in text and "restored the backup" in text
    for name, value in {**known, "database password": password}.items():
        assert value not in text, f"{name} appears in a command's output"
    for path in (tmp_path / "backup").iterdir():
        if path.suffix in (".json", ".jsonl"):
            assert password not in path.read_text(), f"the database password is in {path.name}"
