"""Bytes to disk that a crash cannot tear: a file's short sha256, and an atomic, fsynced replace (the file is
always either its old or its new bytes; fault points name each step for the crash drills)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from kinv.agent import faults

TMP_MARK = ".kinv-tmp-"


def sha_bytes(data: bytes) -> str:
    """sha256 of bytes, first 16 hex digits."""
    return hashlib.sha256(data).hexdigest()[:16]


def atomic_write(path: Path, data: bytes, fault: str = "write") -> None:
    """Write ``data`` to ``path`` so that ``path`` is always either the old or the new bytes."""
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        faults.point(f"{fault}.tmp-written")  # the temp file is complete, the target untouched
        os.replace(tmp, path)
        faults.point(f"{fault}.replaced")  # the target holds the new bytes
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
