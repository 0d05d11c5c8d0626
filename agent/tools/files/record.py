"""The file of record: the bytes ``kinv revert --to-plan`` restores a config file to -- git HEAD where the checkout
tracks the file, else the copy kinv kept before its first write to it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from kinv.agent.errors import RevertError
from kinv.agent.tools.files.durable import TMP_MARK, atomic_write, sha_bytes


# the file of record: what the way back restores
# --------------------------------------------------------------------------- #
class FileOfRecord:
    """The bytes a config file is restored to by ``kinv revert --to-plan``, and where they come from."""

    def __init__(self, data: bytes, source: str):
        self.data, self.source = data, source

    @property
    def sha(self) -> str:
        return sha_bytes(self.data)


def _git(path: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(path.parent), *args], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None


def _git_head_bytes(path: Path) -> tuple[bytes, str] | None:
    """The file's bytes at git HEAD of its checkout and HEAD's short commit id, or None (untracked, no git)."""
    shown = _git(path, "show", f"HEAD:./{path.name}")
    if shown is None or shown.returncode != 0:
        return None
    head = _git(path, "rev-parse", "--short", "HEAD")
    return shown.stdout, (head.stdout.decode().strip() if head is not None and head.returncode == 0 else "HEAD")


def record_path(path: str | os.PathLike) -> Path:
    """kinv's kept copy of an untracked config file's bytes of record, outside the checkout and outside any
    state dir (it must outlive a lost one): ``$XDG_STATE_HOME/kinv/records/<name>-<hash of its path>.json``
    (``~/.local/state`` when XDG_STATE_HOME is unset); nothing appears beside the file."""
    path = Path(path).resolve()
    home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    key = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return Path(home) / "kinv" / "records" / f"{path.stem}-{key}.json"


def _read_record(path: Path) -> dict | None:
    try:
        rec = json.loads(record_path(path).read_text())
        data = rec["text"].encode("utf-8", errors="surrogateescape")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if sha_bytes(data) != rec.get("sha"):
        return None
    return {**rec, "data": data, "patched": list(rec.get("patched") or [])}


def _write_record(path: Path, data: bytes, patched: list[str], taken: float | None = None) -> None:
    rec = {"path": str(path), "sha": sha_bytes(data), "taken": taken or time.time(),
           "text": data.decode("utf-8", errors="surrogateescape"),
           "patched": list(dict.fromkeys(patched))[-64:]}  # fmt: skip
    dest = record_path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}{TMP_MARK}*"):  # a write killed half-way
        with contextlib.suppress(OSError):
            stale.unlink()
    atomic_write(dest, (json.dumps(rec, indent=2) + "\n").encode(), fault="record")


def note_kinv_write(path: str | os.PathLike, before: bytes, after: bytes) -> None:
    """Called before kinv writes ``after`` over ``before`` (a patch, or a plan's baseline restored by name):
    keeps the file of record of an untracked file.  ``before`` becomes the file of record unless it is itself
    a kinv write (a patch a lost state dir left live is never taken for the shipped file); ``after`` is
    remembered as a kinv write.  A file git tracks needs no copy: its record is git HEAD."""
    path = Path(path).resolve()
    if _git_head_bytes(path) is not None:
        return
    rec = _read_record(path)
    sha_before = sha_bytes(before)
    if rec is None or (sha_before != rec["sha"] and sha_before not in rec["patched"]):
        _write_record(path, before, [sha_bytes(after)])
    elif sha_bytes(after) not in rec["patched"] and sha_bytes(after) != rec["sha"]:
        _write_record(path, rec["data"], rec["patched"] + [sha_bytes(after)], rec.get("taken"))


def keep_record(path: str | os.PathLike) -> None:
    """The file's current bytes are its new file of record (an adoption just wrote them)."""
    path = Path(path).resolve()
    if _git_head_bytes(path) is None and path.is_file():
        data = path.read_bytes()
        rec = _read_record(path)
        _write_record(path, data, [s for s in (rec or {}).get("patched", []) if s != sha_bytes(data)])


def file_of_record(path: str | os.PathLike) -> FileOfRecord | None:
    """What ``kinv revert --to-plan`` restores: the bytes of git HEAD when the checkout tracks the file, else
    kinv's kept copy taken before kinv's first write to it; None when neither is known."""
    path = Path(path).resolve()
    head = _git_head_bytes(path)
    if head is not None:
        return FileOfRecord(head[0], f"the shipped bytes of git HEAD ({head[1]})")
    rec = _read_record(path)
    if rec is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(rec["taken"]))
        return FileOfRecord(rec["data"], f"the bytes kinv kept before its first write to it ({when}, "
                                         f"{record_path(path)})")  # fmt: skip
    return None


def restore_file_of_record(path: str | os.PathLike) -> tuple[str, FileOfRecord]:
    """Write the file of record back over ``path`` (atomic, verified by hash); returns ('restored' or
    'unchanged', the record).  RevertError when no file of record is known."""
    path = Path(path).resolve()
    rec = file_of_record(path)
    if rec is None:
        raise RevertError(f"{path} is not tracked by git and kinv kept no copy of its bytes (kinv never wrote it): "
                          "there is no file of record to restore")  # fmt: skip
    if path.is_file() and sha_bytes(path.read_bytes()) == rec.sha:
        return "unchanged", rec
    atomic_write(path, rec.data, fault="restore")
    if sha_bytes(path.read_bytes()) != rec.sha:
        raise RevertError(f"{path} has sha {sha_bytes(path.read_bytes())} after the restore, expected {rec.sha}")
    return "restored", rec
