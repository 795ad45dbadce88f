"""Schemathesis against the live OpenAPI document, as an admin, an agent and a bot (issue 18, item 4).

A live test server (free port) serves its own ``/api/v1/openapi.json``;
schemathesis (pinned in the test extras) generates requests from it with a
fixed seed and a bounded number of examples per operation, follows the
document's links (stateful phase) and checks every answer:
``not_a_server_error``, ``status_code_conformance``, ``content_type_conformance``
and ``response_schema_conformance``. The run uses a tenant of its own (seeded
like the sweep's tenant A), so it deletes no demo data; tenant erasure is left
out (it would end the run's own tenant). Bounded: 3 examples per operation
and ``--max-time`` 35 s per role (fuzzing and stateful testing repeat until it is
spent), about 2 minutes in all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_api_sweep import seed_tenant

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
SEED = 18
MAX_EXAMPLES = 3
MAX_TIME_S = 35  # per role: the coverage phase alone outgrows --max-examples; three roles stay under 3 minutes


def _st() -> list[str]:
    exe = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if exe is None:
        pytest.fail("schemathesis is not installed: pip install -e '.[test]'")
    return [exe]


@pytest.mark.django_db(transaction=True)
def test_the_api_is_what_its_openapi_says_for_every_role(live_server, tmp_path: Path) -> None:
    world = seed_tenant("schemathesis")
    config = tmp_path / "schemathesis.toml"
    config.write_text(f'[parameters]\n"path.tenant" = "{world.a}"\n')
    started = time.monotonic()
    failed = []
    for role in ("bot", "agent", "admin"):  # the admin's writes and deletes last
        argv = _st() + [
            "--config-file", str(config), "run", f"{live_server.url}/api/v1/openapi.json",
            "--checks", CHECKS, "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES),
            "--max-time", str(MAX_TIME_S), "--phases", "examples,coverage,fuzzing,stateful",
            "--workers", "1", "--request-timeout", "20", "--no-color", "--generation-database", "none",
            "--exclude-path-regex", r"/erase$", "-H", f"Authorization: Bearer {world.tokens[role]}",
            "--report", "junit", "--report-dir", str(tmp_path / role),
        ]  # fmt: skip
        # cwd: st keeps a .schemathesis/ cache folder where it runs, not in the repository
        run = subprocess.run(argv, capture_output=True, text=True, timeout=MAX_TIME_S + 30, cwd=tmp_path)
        (tmp_path / f"{role}.txt").write_text(run.stdout + run.stderr)
        summary = [line for line in run.stdout.splitlines() if "passed" in line or "failed" in line or "tested" in line]
        print(f"schemathesis as {role}: exit {run.returncode}; " + " | ".join(summary[-4:]))
        if run.returncode != 0:
            failed.append(f"--- as {role} (exit {run.returncode}):\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}")
    took = time.monotonic() - started
    print(f"schemathesis: 3 roles in {took:.0f} s")
    assert not failed, "\n".join(failed)
    assert took < 180
