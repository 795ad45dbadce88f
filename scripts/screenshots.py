"""``./dev screenshots``: every page of the admin, as the demo's admin and agent see it, in PNGs.

Starts the embedded stack with the demo (``manage.py botmesh_run`` on a free
port, over a fresh data folder, never the one of ``./dev run``), logs in as
``admin`` and as ``agent`` in Debian's Chromium (Playwright), opens every page
of the navigation and, from each, the first page of every kind it links to (a
conversation, a contact, a segment, a campaign, a plugin, a bot, a trace, a
journal record …), and saves a full-page screenshot of each at 1440×900, plus
the inbox list and a conversation at 390×844 (a phone). Then it stops the stack.

Writes ``var/screenshots/ui/<role>/NN-<page>.png``,
``var/screenshots/ui/phone/<role>-inbox*.png`` and ``var/screenshots/ui/index.html``
(every picture on one page, titled with its address), replacing an earlier set.
Prints the count, the folder and the seconds taken. Exits 1 naming what failed
(the stack did not start within ``START_TIMEOUT_S``, a page answered an error status).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from playwright.sync_api import ViewportSize

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "var" / "screenshots" / "ui"
TENANT = "tienda"
ROLES = {"admin": "botmesh-demo", "agent": "botmesh-agent"}
DESKTOP: ViewportSize = {"width": 1440, "height": 900}
BROWSER_ZONE = "America/Bogota"
"""The browsers' zone (the demo shop is in Colombia): the admin's first page gives it to the tenant."""
PHONE: ViewportSize = {"width": 390, "height": 844}
START_TIMEOUT_S = 420
MAX_PAGES = 60
"""Pages per role at most (the navigation and one page of each kind it links to)."""
SKIP_RE = re.compile(r"(/export|\.csv|/logout|/erase/?$|/metrics$|/api/)")
"""Links not opened: downloads, log-out, the Prometheus text, the API."""
ID_RE = re.compile(r"^(?=.*[\d.])[A-Za-z0-9_.:@-]+$")
"""A path segment that is an id (holds a digit or a dot: ``cv_3d84…``, ``1.2.0``, ``acme.order-status``).

Pages whose paths differ only in ids are one kind: one of each is shown."""
# Backends of a production configuration: never the screenshots' target.
SERVER_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "BOTMESH_KV_URL",
    "BOTMESH_JOURNAL_URL",
    "BOTMESH_COORDINATION_URL",
    "CELERY_BROKER_URL",
    "BOTMESH_PROFILE",
    "BOTMESH_PORT",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_stack(data_dir: Path, port: int) -> subprocess.Popen[str]:
    """Migrate a fresh data folder and start ``botmesh_run`` with the demo; return it once it serves."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARIABLES}
    env.update(BOTMESH_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    py = sys.executable
    subprocess.run([py, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    log = (data_dir / "botmesh_run.log").open("w")
    proc = subprocess.Popen(
        [py, "manage.py", "botmesh_run", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,  # Ctrl-C of ./dev screenshots reaches it through stop_stack only
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        if "is running at" in line:
            return proc
        if time.monotonic() > deadline:
            break
    stop_stack(proc)
    raise SystemExit(f"the stack did not start within {START_TIMEOUT_S} s; see {data_dir / 'botmesh_run.log'}")


def stop_stack(proc: subprocess.Popen[str]) -> None:
    """SIGINT (botmesh_run's Ctrl-C: workers drain and stop), then SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def kind_of(path: str) -> str:
    """The page's kind: its path with ids as ``_`` (``/t/tienda/crm/contacts/_/``)."""
    path = path.rstrip("/") + "/"  # /crm/contacts/c_1 redirects to /crm/contacts/c_1/: one page
    return "/".join("_" if ID_RE.match(part) and i > 2 else part for i, part in enumerate(path.split("/")))


def slug(path: str) -> str:
    """The file name's part for ``path``: ``crm-contacts-id`` for ``/t/tienda/crm/contacts/c_01…/``."""
    rest = kind_of(path).removeprefix(f"/t/{TENANT}").strip("/") or "overview"
    return re.sub(r"[^A-Za-z0-9]+", "-", "/".join("id" if p == "_" else p for p in rest.split("/"))).strip("-")


def settle(page) -> None:  # type: ignore[no-untyped-def]
    """Let the page draw: fonts, charts (their animation) and a first htmx swap."""
    page.wait_for_load_state("load")
    page.wait_for_timeout(1200 if page.locator("canvas").count() else 400)


def crawl(page, role: str, base: str) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    """Screenshot every page of ``role``; return (file, path, status) rows."""
    folder = OUT / role
    folder.mkdir(parents=True, exist_ok=True)
    queue = [f"/t/{TENANT}/"]
    page.goto(base + queue[0])
    queue += [urlsplit(h).path for h in page.eval_on_selector_all("nav.sidenav a", "els => els.map(e => e.href)")]
    seen_kinds: set[str] = set()
    shots: list[tuple[str, str, int]] = []
    while queue and len(shots) < MAX_PAGES:
        path = queue.pop(0)
        if kind_of(path) in seen_kinds or SKIP_RE.search(path) or not path.startswith(f"/t/{TENANT}/"):
            continue
        seen_kinds.add(kind_of(path))
        response = page.goto(base + path)
        status = response.status if response is not None else 0
        settle(page)
        name = f"{len(shots) + 1:02d}-{slug(path)}.png"
        page.screenshot(path=str(folder / name), full_page=True)
        shots.append((f"{role}/{name}", path, status))
        links = page.eval_on_selector_all("main a[href]", "els => els.map(e => e.href)")
        for href in links:
            parts = urlsplit(href)
            if parts.netloc == urlsplit(base).netloc and not parts.query and kind_of(parts.path) not in seen_kinds:
                queue.append(parts.path)
    return shots


def phone(chromium, base: str, role: str) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    """The inbox list, then its first conversation, at 390×844."""
    context = chromium.new_context(
        viewport=PHONE, base_url=base, device_scale_factor=1, is_mobile=True, timezone_id=BROWSER_ZONE
    )
    shots: list[tuple[str, str, int]] = []
    try:
        page = context.new_page()
        log_in(page, role)
        folder = OUT / "phone"
        folder.mkdir(parents=True, exist_ok=True)
        response = page.goto(f"/t/{TENANT}/inbox/")
        settle(page)
        page.screenshot(path=str(folder / f"{role}-inbox.png"))
        shots.append((f"phone/{role}-inbox.png", f"/t/{TENANT}/inbox/", response.status if response else 0))
        first = page.locator(".inbox-row a").first
        if first.count():
            path = urlsplit(first.get_attribute("href") or "").path
            response = page.goto(path)
            settle(page)
            page.screenshot(path=str(folder / f"{role}-inbox-conversation.png"))
            shots.append((f"phone/{role}-inbox-conversation.png", path, response.status if response else 0))
    finally:
        context.close()
    return shots


def log_in(page, role: str) -> None:  # type: ignore[no-untyped-def]
    page.goto("/login/")
    page.fill("#id_username", role)
    page.fill("#id_password", ROLES[role])
    page.click("button[type=submit]")
    page.wait_for_url(f"**/t/{TENANT}/")


def wait_for_demo(page) -> None:  # type: ignore[no-untyped-def]
    """Wait (up to 120 s) until the worker has projected the demo's conversations into the inbox."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page.goto(f"/t/{TENANT}/inbox/")
        if page.locator(".inbox-row").count() >= 10:
            return
        page.wait_for_timeout(2000)


def write_index(shots: list[tuple[str, str, int]]) -> None:
    cards = "\n".join(
        f"<figure><figcaption>{html.escape(name)} · <code>{html.escape(path)}</code>"
        f"{'' if status == 200 else f' · <b>{status}</b>'}</figcaption>"
        f'<a href="{html.escape(name)}"><img src="{html.escape(name)}" loading="lazy" alt="{html.escape(path)}"></a>'
        "</figure>"
        for name, path, status in shots
    )
    (OUT / "index.html").write_text(
        "<!doctype html><meta charset=utf-8><title>botmesh-admin screenshots</title>"
        "<style>body{font:14px system-ui;margin:16px}main{display:grid;"
        "grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:16px}"
        "figure{margin:0;border:1px solid #ddd;padding:6px}img{width:100%;max-height:420px;object-fit:cover;"
        "object-position:top}figcaption{margin-bottom:4px}</style>"
        f"<h1>botmesh-admin: {len(shots)} screenshots</h1><main>{cards}</main>"
    )


def chromium_path() -> str:
    path = os.environ.get("BOTMESH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise SystemExit("chromium not found: apt-get install chromium (or set BOTMESH_CHROMIUM)")
    return path


def main() -> int:
    started = time.monotonic()
    from playwright.sync_api import sync_playwright

    from tests.conftest import CHROMIUM_ARGS

    executable = chromium_path()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="botmesh-screenshots-") as data:
        print(f"starting the demo stack on {base} (data in {data}) ...", flush=True)
        proc = start_stack(Path(data), port)
        shots: list[tuple[str, str, int]] = []
        try:
            with sync_playwright() as pw:
                chromium = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
                for role in ROLES:
                    context = chromium.new_context(viewport=DESKTOP, base_url=base, timezone_id=BROWSER_ZONE)
                    page = context.new_page()
                    page.set_default_timeout(30000)
                    log_in(page, role)
                    if role == "admin":  # the first admin page gives the tenant the browser's zone, then reloads
                        page.wait_for_selector(f"[data-testid=time-zone]:text-is('{BROWSER_ZONE}')", timeout=15000)
                    wait_for_demo(page)
                    shots += crawl(page, role, base)
                    context.close()
                    shots += phone(chromium, base, role)
                chromium.close()
        finally:
            stop_stack(proc)
    write_index(shots)
    failed = [(name, path, status) for name, path, status in shots if status >= 400]
    took = time.monotonic() - started
    print(f"{len(shots)} screenshots in {OUT.relative_to(ROOT)}/ (open index.html) in {took:.0f} s")
    for name, path, status in failed:
        print(f"  {path} answered {status} ({name})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
