"""Issue 15 item 10: the packages' variables are validated at start, one line naming the variable.

Before: ``BOTMESH_CAMPAIGN_*`` and ``BOTMESH_COORDINATION_*`` were looked up in the
Django settings, which never set them (so the environment had no effect), and
``BOTMESH_RETAIN_VERSIONS``, ``BOTMESH_*_API_BASE`` and ``BOTMESH_HUB_RUNTIME_*``
were read from the environment when used (a typo failed the first publish, send
or plugin install, not the start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from botmesh_admin import config

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BOTMESH_CAMPAIGN_BATCH", "fifty"),
        ("BOTMESH_CAMPAIGN_BATCH", "0"),
        ("BOTMESH_CAMPAIGN_SLOT_TTL_MS", "10"),
        ("BOTMESH_CAMPAIGN_MAX_ATTEMPTS", "-1"),
        ("BOTMESH_CAMPAIGN_CONCURRENCY", "100000"),
        ("BOTMESH_CAMPAIGN_LEASE_MS", "1.5"),
        ("BOTMESH_CAMPAIGN_RATE_PER_S", "sms=3"),
        ("BOTMESH_CAMPAIGN_RATE_PER_S", "whatsapp=fast"),
        ("BOTMESH_CAMPAIGN_RATE_PER_S", "telegram=0"),
        ("BOTMESH_RETAIN_VERSIONS", "0"),
        ("BOTMESH_RETAIN_VERSIONS", "all"),
        ("BOTMESH_COORDINATION_PREFIX", "has space"),
        ("BOTMESH_COORDINATION_LEASE_MS", "5"),
        ("BOTMESH_WHATSAPP_API_BASE", "graph.facebook.com"),
        ("BOTMESH_TELEGRAM_API_BASE", "ftp://api.telegram.org"),
        ("BOTMESH_HUB_RUNTIME_FILE", "/nonexistent/runtime.json"),
        ("BOTMESH_HUB_RUNTIME_VERSION", "1.6"),
    ],
)
def test_malformed_package_setting_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load({variable: value})
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ") and "\n" not in str(info.value)


def test_runtime_file_of_the_wrong_shape_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps({"runtime_version": "2.0.0", "known_permissions": "all"}))
    with pytest.raises(config.ConfigError, match="^BOTMESH_HUB_RUNTIME_FILE: .*known_permissions"):
        config.load({"BOTMESH_HUB_RUNTIME_FILE": str(path)})


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BOTMESH_") or k == "BOTMESH_FIXTURES"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120
    )


def test_manage_py_stops_at_start_naming_a_package_variable(tmp_path: Path) -> None:
    proc = _manage({"BOTMESH_DATA_DIR": str(tmp_path), "BOTMESH_CAMPAIGN_BATCH": "lots"}, "check")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "botmesh-admin: configuration error: BOTMESH_CAMPAIGN_BATCH: expected an integer, got 'lots'"
    )


def test_package_settings_from_the_environment_reach_the_packages(tmp_path: Path) -> None:
    """The values a process started with are the ones campaigns, coordination and deployments use."""
    env = {
        "BOTMESH_DATA_DIR": str(tmp_path),
        "BOTMESH_CAMPAIGN_BATCH": "7",
        "BOTMESH_CAMPAIGN_RATE_PER_S": "whatsapp=5",
        "BOTMESH_COORDINATION_LEASE_MS": "9000",
        "BOTMESH_COORDINATION_PREFIX": "shop-a",
        "BOTMESH_RETAIN_VERSIONS": "3",
        "BOTMESH_TELEGRAM_API_BASE": "http://127.0.0.1:9/tg/",
    }
    code = (
        "from campaigns.domain import Campaign; from campaigns.services import default_options;"
        "from botmesh_admin.coordination.runtime import coordination_settings;"
        "from botmesh_admin.channels.providers import api_base;"
        "from deployments.services import retain_versions;"
        "import json;"
        "o = default_options(Campaign(id='cmp_x', name='x', segment_id='s', channel='telegram', message=None));"
        "p = default_options(Campaign(id='cmp_y', name='y', segment_id='s', channel='whatsapp', message=None));"
        "print(json.dumps([o.batch_size, p.rate_per_s, list(coordination_settings()[1:]), api_base('telegram'),"
        " retain_versions()]))"
    )
    proc = _manage(env, "shell", "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [7, 5.0, ["shop-a", 9000], "http://127.0.0.1:9/tg", 3]
