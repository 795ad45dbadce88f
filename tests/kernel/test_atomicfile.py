"""``write_atomic``: a reader, and a writer killed at any moment, see the old bytes or the new, never half."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from botmesh_admin.atomicfile import write_atomic


def test_replaces_the_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "snapshot.json"
    write_atomic(target, b"first")
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.json"]
    assert target.stat().st_mode & 0o777 == 0o600


def test_a_named_temporary_file_is_used_and_consumed(tmp_path: Path) -> None:
    target, tmp = tmp_path / "s", tmp_path / ".s.tmp"
    write_atomic(target, b"x", tmp=tmp)
    assert target.read_bytes() == b"x" and not tmp.exists()


def test_a_failed_write_keeps_the_old_content_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "s"
    write_atomic(target, b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


_WRITER = """
import sys
from botmesh_admin.atomicfile import write_atomic
target = sys.argv[1]
n = 0
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    n += 1
    byte = b"ab"[n % 2 : n % 2 + 1]
    write_atomic(target, byte * 200_000)
"""


def test_a_writer_killed_mid_write_never_leaves_a_half_file(tmp_path: Path) -> None:
    """SIGKILL a process rewriting a 200 kB file in a loop, ten times at random moments: always whole."""
    target = tmp_path / "snapshot"
    write_atomic(target, b"a" * 200_000)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    for round_ in range(10):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
            time.sleep(0.02 + 0.013 * round_)
            # Meanwhile a reader only ever sees a whole file.
            data = target.read_bytes()
            assert len(data) == 200_000 and len(set(data)) == 1
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        data = target.read_bytes()
        assert len(data) == 200_000 and data in (b"a" * 200_000, b"b" * 200_000)
