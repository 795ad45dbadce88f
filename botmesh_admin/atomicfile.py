"""Replace a file atomically: readers and a crash see the old bytes or the new, never half.

The recipe (POSIX ``rename(2)`` is atomic; ext4/XFS need the fsyncs for it to be
durable, see "Ensuring data reaches disk", LWN 457667): write a temporary file in
the same directory, fsync it, ``os.replace`` it over the target, fsync the
directory so the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(
    path: str | os.PathLike[str], data: bytes, *, tmp: str | os.PathLike[str] | None = None, mode: int = 0o600
) -> None:
    """Replace the file at ``path`` with ``data``, durably and atomically.

    The temporary file is ``tmp`` (in the same directory; a caller holding a lock
    on ``path`` may name a fixed one and remove it at start-up) or a fresh
    ``.<name>.*.tmp`` beside ``path``; it is created with ``mode`` (default
    ``0o600``) and removed if the write fails. Raise ``OSError`` when a step
    fails: ``path`` then still holds its previous content.
    """
    target = Path(path)
    directory = target.parent
    if tmp is None:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        if mode != 0o600:
            os.fchmod(fd, mode)
    else:
        tmp_name = os.fspath(tmp)
        fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


__all__ = ["write_atomic"]
