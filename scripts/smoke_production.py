"""Production smoke test (run by .ci/run through scripts/smoke_production.sh).

Migrates, checks ``check --deploy``, starts gunicorn + a Celery worker + beat over
PostgreSQL and Redis, then: ``/readyz``, a login, an API call with a token, a
foreign tenant's 404, and ``manage.py backup`` of the running stack.
"""

from __future__ import annotations

import http.cookies
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

PY = sys.executable
BASE = ""  # http://127.0.0.1:<port>, set by main()


def choose_port(environ: dict[str, str] | os._Environ[str]) -> int:
    """Return ``BOTMESH_SMOKE_PORT`` if set and free, else a port the kernel says is free now.

    Raise ``SystemExit`` naming the port if ``BOTMESH_SMOKE_PORT`` is taken: the
    test must not talk to whatever else listens there (it used a fixed 8765).
    """
    raw = environ.get("BOTMESH_SMOKE_PORT")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", int(raw) if raw else 0))
        except OSError as exc:
            raise SystemExit(
                f"smoke test: port {raw} (BOTMESH_SMOKE_PORT) is taken by another process "
                f"({exc.strerror}); free it or unset BOTMESH_SMOKE_PORT to use a free port"
            ) from None
        except ValueError:
            raise SystemExit(f"smoke test: BOTMESH_SMOKE_PORT must be a port number, got {raw!r}") from None
        return int(probe.getsockname()[1])


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None


opener = urllib.request.build_opener(NoRedirect)


def request(method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None):
    # Behind a TLS proxy in production: say so, as the proxy would.
    hdrs = {"X-Forwarded-Proto": "https", "Host": "127.0.0.1"}
    hdrs.update(headers or {})
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=hdrs)
    try:
        resp = opener.open(req, timeout=15)
    except urllib.error.HTTPError as exc:
        resp = exc
    return (
        resp.status,
        dict(resp.headers),
        resp.read().decode(errors="replace"),
        resp.headers.get_all("Set-Cookie") or [],
    )


def main() -> int:
    global BASE
    port = choose_port(os.environ)
    BASE = f"http://127.0.0.1:{port}"
    data_dir = tempfile.mkdtemp(prefix="botmesh-prod-")
    pg = os.environ["BOTMESH_PROD_DATABASE_URL"]
    redis = os.environ["BOTMESH_TEST_REDIS_URL"].rsplit("/", 1)[0] + "/1"
    env = dict(
        os.environ,
        BOTMESH_PROFILE="production",
        SECRET_KEY=secrets.token_urlsafe(48),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DATABASE_URL=pg,
        REDIS_URL=redis,
        BOTMESH_KV_URL=pg,
        BOTMESH_JOURNAL_URL=pg,
        BOTMESH_DATA_DIR=data_dir,
        DJANGO_SUPERUSER_PASSWORD="smoke-password-123",
    )
    env.pop("DEBUG", None)

    def manage(*args: str) -> str:
        return subprocess.run([PY, "manage.py", *args], env=env, check=True, capture_output=True, text=True).stdout

    manage("migrate", "--noinput")
    manage("collectstatic", "--noinput", "-v", "0")
    manage("check", "--deploy", "--fail-level", "WARNING")
    subprocess.run(
        [
            PY,
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "smoke-admin",
            "--email",
            "smoke@example.invalid",
        ],
        env=env,
        capture_output=True,
    )
    manage("botmesh_tenant", "create", "smoke", "--name", "Smoke", "--admin", "smoke-admin")
    token = manage("botmesh_token", "create", "smoke", "--name", "smoke").strip()

    procs = [
        subprocess.Popen(
            [
                PY,
                "-m",
                "gunicorn",
                "botmesh_admin.wsgi",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                "2",
                "--threads",
                "4",  # as the deploy files run it: threads, so a slow upload leaves room for webhooks
                "--graceful-timeout",
                "30",
            ],
            env=env,
        ),
        subprocess.Popen(
            [PY, "-m", "celery", "-A", "botmesh_admin", "worker", "-l", "WARNING", "-c", "2", "-n", "smoke-worker@%h"],
            env=env,
        ),
        subprocess.Popen(
            [
                PY,
                "-m",
                "celery",
                "-A",
                "botmesh_admin",
                "beat",
                "-l",
                "WARNING",
                "-s",
                os.path.join(data_dir, "beat-schedule"),
            ],
            env=env,
        ),
    ]
    try:
        deadline = time.monotonic() + 60
        status = 0
        body = ""
        while time.monotonic() < deadline:
            # gunicorn that could not bind (the port was taken meanwhile) exits: say so, rather
            # than read another server's answers.
            if procs[0].poll() is not None:
                raise SystemExit(
                    f"smoke test: gunicorn exited with status {procs[0].returncode} before "
                    f"/readyz answered (is port {port} taken?)"
                )
            try:
                status, _, body, _ = request("GET", "/readyz")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert status == 200, f"/readyz answered {status}: {body}"
        print("readyz: 200", body)

        status, _, body, cookies = request("GET", "/login/")
        assert status == 200, f"GET /login/ -> {status}"
        jar = http.cookies.SimpleCookie()
        for c in cookies:
            jar.load(c)
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body).group(1)  # type: ignore[union-attr]
        form = urllib.parse.urlencode(
            {"username": "smoke-admin", "password": "smoke-password-123", "csrfmiddlewaretoken": csrf}
        ).encode()
        status, headers, _, cookies = request(
            "POST",
            "/login/",
            form,
            {
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": f"csrftoken={jar['csrftoken'].value}",
                "Referer": "https://127.0.0.1/login/",
            },
        )
        assert status == 302, f"login answered {status}"
        for c in cookies:
            jar.load(c)
        assert "sessionid" in jar, "login set no session cookie"
        status, _, body, _ = request("GET", "/t/smoke/", headers={"Cookie": f"sessionid={jar['sessionid'].value}"})
        assert status == 200 and "smoke" in body, f"tenant page after login -> {status}"
        print("login: 302, tenant page: 200")

        status, _, body, _ = request(
            "GET", "/api/v1/tenants/smoke/whoami", headers={"Authorization": f"Bearer {token}"}
        )
        assert status == 200 and '"role": "admin"' in body.replace('":"', '": "'), f"API whoami -> {status} {body}"
        status, _, _, _ = request("GET", "/api/v1/tenants/other/whoami", headers={"Authorization": f"Bearer {token}"})
        assert status == 404, f"foreign tenant answered {status}, expected 404"
        print("api with token: 200; foreign tenant: 404")
        backup = os.path.join(data_dir, "backup.tar.gz")
        out = manage("backup", backup)  # while gunicorn, the worker and beat keep running
        assert os.path.getsize(backup) > 0 and "backup written" in out, out
        print("backup of the running stack:", out.strip().splitlines()[-1])
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[:4]} exited early"
        print("production smoke test passed")
        return 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
