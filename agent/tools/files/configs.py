"""Read, patch, back up, revert and diff kernel config files and kernel sources, journaled.

Crash safety is the point: no kernel file may ever be left patched.  Every
patch follows the same order, so that a crash at any instant is recoverable:

1. validate the change (nothing is written for a bad one);
2. copy the file into a content-addressed backup (fsynced);
3. write the journal intent (``patches`` row, state ``intent``) naming the
   backup and the file's hash before;
4. write the new bytes atomically (temp file in the same dir, fsync,
   ``os.replace``): the file is always either the old or the new bytes;
5. mark the journal row ``applied``.

:func:`recover` (called at every start) restores every ``intent`` or
``applied`` row from its backup and marks it ``reverted``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kinv.agent import faults
from kinv.agent.errors import LockedElsewhere, PatchError, RevertError
from kinv.agent.tools.files.config_text import (  # noqa: F401 - kinv.agent.tools.files.configs keeps exporting them
    apply_unified_diff,
    diff_text,
    edit_config_text,
    render_config,
)
from kinv.kernels.errors import ConfigError
from kinv.kernels.launch_config import validate_config

if TYPE_CHECKING:
    from kinv.agent.store.db import Store

TMP_MARK = ".kinv-tmp-"


# --------------------------------------------------------------------------- #
# hashing and config edits (their text: kinv.agent.tools.files.config_text)
# --------------------------------------------------------------------------- #
class ConfigFileLock:
    """An exclusive OS lock on a kernel's live config file, held for a whole run.

    The live config belongs to the checkout, not to a state dir: two terminals with two state dirs on one
    checkout must never edit it at once.  The lock is keyed by the file's real path (an flock on
    ``$TMPDIR/kinv-locks/<name>-<hash>.lock``, so it dies with its process and adds nothing to the checkout)
    and records who holds it, so a refusal names the other state dir and pid, and a later run can say who
    last edited the file.
    """

    def __init__(self, config_path: str | os.PathLike, state_dir: str | os.PathLike):
        import tempfile

        self.config = Path(config_path)
        key = hashlib.sha256(str(self.config.resolve()).encode()).hexdigest()[:16]
        # one lock per config file on this machine, outside the checkout (nothing new appears beside the file)
        self.path = Path(tempfile.gettempdir()) / "kinv-locks" / f"{self.config.stem}-{key}.lock"
        self.state_dir = str(Path(state_dir).resolve())
        self._fh = None

    def holder(self) -> dict:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def __enter__(self) -> ConfigFileLock:
        import fcntl
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 -- held for the run
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            h = self.holder()
            raise LockedElsewhere(
                f"{self.config} is being edited by the kinv run of state dir {h.get('state_dir', '?')} "
                f"(pid {h.get('pid', '?')}); one checkout's config is edited by one run at a time: wait for it, "
                "or stop that run") from None  # fmt: skip
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"state_dir": self.state_dir, "pid": os.getpid(), "host": socket.gethostname(),
                             "t": time.time()}))  # fmt: skip
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def last_editor(config_path: str | os.PathLike) -> dict:
    """Who last held the config's lock (state dir, pid), or {}."""
    return ConfigFileLock(config_path, ".").holder()


def sha(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, first 16 hex digits."""
    return _sha_bytes(Path(path).read_bytes())


def _sha_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class ConfigEdit:
    """What a config patch will write: the live bytes, the bytes after, and the diff between them."""

    def __init__(self, path: Path, old: bytes, new: bytes, config: dict):
        self.path, self.old, self.new, self.config = path, old, new, config

    @property
    def diff(self) -> str:
        return diff_text(self.old.decode("utf-8", errors="replace"), self.new.decode("utf-8", errors="replace"),
                         self.path.name)  # fmt: skip

    @property
    def sha_before(self) -> str:
        return _sha_bytes(self.old)

    @property
    def sha_after(self) -> str:
        return _sha_bytes(self.new)


def plan_config_edit(path: str | os.PathLike, new_config: dict, kernel: str | None = None) -> ConfigEdit:
    """Validate ``new_config`` and say exactly what writing it to the config file ``path`` would write (nothing
    is written): the diff an approval shows and the bytes :func:`patch_config` then writes are these."""
    path = Path(path).resolve()
    if not path.is_file():
        raise PatchError(f"config file {path} does not exist")
    old_bytes = path.read_bytes()
    old_text = old_bytes.decode("utf-8", errors="replace")
    try:
        old = json.loads(old_text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        old = {}
    name = kernel or (old.get("kernel") if isinstance(old, dict) and isinstance(old.get("kernel"), str) else None)
    if isinstance(new_config, dict) and name and "kernel" not in new_config:
        new_config = {"kernel": name, **new_config}
    try:
        cfg = validate_config(new_config, name)
    except ConfigError as exc:
        raise PatchError(f"{path.name}: {exc}") from None
    return ConfigEdit(path, old_bytes, edit_config_text(old_text, cfg, name).encode(), cfg)


def edit_diff(path: str | os.PathLike, new_config: dict, kernel: str | None = None) -> str:
    """The diff from the live bytes of ``path`` to what writing ``new_config`` would write (what to show)."""
    return plan_config_edit(path, new_config, kernel).diff


def write_config(path: str | os.PathLike, config: dict) -> None:
    """Write a config file atomically: the minimal edit of the file's own bytes when it exists
    (:func:`edit_config_text`), a new file rendered by :func:`render_config` when it does not."""
    path = Path(path)
    if path.is_file():
        _atomic_write(path, edit_config_text(path.read_bytes().decode("utf-8", errors="replace"), config).encode())
    else:
        _atomic_write(path, render_config(config).encode())


# --------------------------------------------------------------------------- #
# atomic writes and backups
# --------------------------------------------------------------------------- #
def _atomic_write(path: Path, data: bytes, fault: str = "write") -> None:
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


def _ws_dir(ws_id: str | None) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", (ws_id or "none").lstrip("#")) or "none"


def backup(store: Store, path: str | os.PathLike, ws_id: str | None) -> dict:
    """Copy ``path`` into ``<state>/backups/<ws>/<name>.<sha>`` (content-addressed) and record it."""
    path = Path(path).resolve()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PatchError(f"{path} does not exist; only existing kernel files can be patched") from None
    digest = _sha_bytes(data)
    dest = store.dir / "backups" / _ws_dir(ws_id) / f"{path.name}.{digest}"
    if not (dest.is_file() and _sha_bytes(dest.read_bytes()) == digest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(dest, data, fault="backup")
    for row in store.backups():
        if (row["path"], row["backup_path"], row["sha"], row["workstream"]) == (str(path), str(dest), digest, ws_id):
            return row
    backup_id = store.add_backup(str(path), str(dest), digest, ws_id)
    return _find(store.backups(), backup_id)


def _find(rows: list[dict], row_id: int) -> dict:
    return next(r for r in rows if r["id"] == row_id)


def _patch_row(store: Store, patch_id: int) -> dict:
    row = next((r for r in store.patches() if r["id"] == patch_id), None)
    if row is None:
        raise RevertError(f"no patch #{patch_id} in the journal")
    return row


# --------------------------------------------------------------------------- #
# the file of record: what the way back restores
# --------------------------------------------------------------------------- #
class FileOfRecord:
    """The bytes a config file is restored to by ``kinv revert --to-plan``, and where they come from."""

    def __init__(self, data: bytes, source: str):
        self.data, self.source = data, source

    @property
    def sha(self) -> str:
        return _sha_bytes(self.data)


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
    if _sha_bytes(data) != rec.get("sha"):
        return None
    return {**rec, "data": data, "patched": list(rec.get("patched") or [])}


def _write_record(path: Path, data: bytes, patched: list[str], taken: float | None = None) -> None:
    rec = {"path": str(path), "sha": _sha_bytes(data), "taken": taken or time.time(),
           "text": data.decode("utf-8", errors="surrogateescape"),
           "patched": list(dict.fromkeys(patched))[-64:]}  # fmt: skip
    dest = record_path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}{TMP_MARK}*"):  # a write killed half-way
        with contextlib.suppress(OSError):
            stale.unlink()
    _atomic_write(dest, (json.dumps(rec, indent=2) + "\n").encode(), fault="record")


def note_kinv_write(path: str | os.PathLike, before: bytes, after: bytes) -> None:
    """Called before kinv writes ``after`` over ``before`` (a patch, or a plan's baseline restored by name):
    keeps the file of record of an untracked file.  ``before`` becomes the file of record unless it is itself
    a kinv write (a patch a lost state dir left live is never taken for the shipped file); ``after`` is
    remembered as a kinv write.  A file git tracks needs no copy: its record is git HEAD."""
    path = Path(path).resolve()
    if _git_head_bytes(path) is not None:
        return
    rec = _read_record(path)
    sha_before = _sha_bytes(before)
    if rec is None or (sha_before != rec["sha"] and sha_before not in rec["patched"]):
        _write_record(path, before, [_sha_bytes(after)])
    elif _sha_bytes(after) not in rec["patched"] and _sha_bytes(after) != rec["sha"]:
        _write_record(path, rec["data"], rec["patched"] + [_sha_bytes(after)], rec.get("taken"))


def keep_record(path: str | os.PathLike) -> None:
    """The file's current bytes are its new file of record (an adoption just wrote them)."""
    path = Path(path).resolve()
    if _git_head_bytes(path) is None and path.is_file():
        data = path.read_bytes()
        rec = _read_record(path)
        _write_record(path, data, [s for s in (rec or {}).get("patched", []) if s != _sha_bytes(data)])


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
    if path.is_file() and _sha_bytes(path.read_bytes()) == rec.sha:
        return "unchanged", rec
    _atomic_write(path, rec.data, fault="restore")
    if sha(path) != rec.sha:
        raise RevertError(f"{path} has sha {sha(path)} after the restore, expected {rec.sha}")
    return "restored", rec


# --------------------------------------------------------------------------- #
# patching
# --------------------------------------------------------------------------- #
def _apply_journaled(store: Store, path: Path, old: bytes, new: bytes, kind: str, diff: str, ws_id,
                     experiment) -> dict:  # fmt: skip
    """Backup, journal intent, atomic write, journal applied; roll back on any failure."""
    for row in store.dangling_patches():
        if row["path"] == str(path):
            raise PatchError(
                f"{path} already has un-reverted patch #{row['id']} (state {row['state']}); revert it or recover first"
            )
    bak = backup(store, path, ws_id)
    if bak["sha"] != _sha_bytes(old):
        raise PatchError(f"{path} changed while it was being patched (sha {bak['sha']}); try again")
    if kind == "config":
        note_kinv_write(path, old, new)  # the file of record is kept before the file changes
    patch_id = store.journal_intent(workstream=ws_id, experiment=experiment, path=str(path), kind=kind,
                                    sha_before=bak["sha"], diff=diff, backup=bak["id"])  # fmt: skip
    try:
        _atomic_write(path, new, fault="patch")
        store.journal_set(patch_id, "applied", sha_after=_sha_bytes(new))
    except BaseException as exc:
        with contextlib.suppress(Exception):  # recover() at the next start covers a failed rollback
            _restore(store, _patch_row(store, patch_id))
            store.event(ws_id, "patch.failed", f"patch #{patch_id} of {path.name} failed and was rolled back: {exc}",
                        {"patch": patch_id, "path": str(path)})  # fmt: skip
        raise
    store.event(ws_id, "patch.applied", f"patched {path.name} ({kind}, patch #{patch_id})",
                {"patch": patch_id, "path": str(path), "experiment": experiment})  # fmt: skip
    return _patch_row(store, patch_id)


def patch_config(store: Store, path: str | os.PathLike, new_config: dict, ws_id: str | None,
                 experiment: int | None = None) -> dict:  # fmt: skip
    """Validate ``new_config`` and write it to the config file ``path``, journaled; returns the patch row.

    What is written is :func:`plan_config_edit`'s bytes: the minimal edit of the live file (its key order,
    description, layout and unchanged values kept) whose config is ``new_config``; the journaled diff is from
    the live bytes to those bytes."""
    edit = plan_config_edit(path, new_config)
    return _apply_journaled(store, edit.path, edit.old, edit.new, "config", edit.diff, ws_id, experiment)


def patch_source(store: Store, path: str | os.PathLike, unified_diff: str, ws_id: str | None,
                 experiment: int | None = None) -> dict:  # fmt: skip
    """Apply a single-file unified diff to the source ``path``, journaled; every hunk must match exactly."""
    path = Path(path).resolve()
    if not path.is_file():
        raise PatchError(f"source file {path} does not exist")
    old_bytes = path.read_bytes()
    try:
        old_text = old_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"{path} is not UTF-8 text; only text sources can be patched") from None
    new_text = apply_unified_diff(old_text, unified_diff, path)
    if path.suffix == ".py":
        try:
            compile(new_text, str(path), "exec")
        except SyntaxError as exc:
            raise PatchError(f"patched {path.name} is not valid Python: line {exc.lineno}: {exc.msg}") from None
    return _apply_journaled(store, path, old_bytes, new_text.encode(), "source", diff_text(old_text, new_text, path.name),
                            ws_id, experiment)  # fmt: skip


# --------------------------------------------------------------------------- #
# reverting and recovery
# --------------------------------------------------------------------------- #
def _restore(store: Store, patch: dict) -> str:
    """Put the backup bytes of ``patch`` back if the file differs; returns 'restored' or 'unchanged'."""
    path = Path(patch["path"])
    current = _sha_bytes(path.read_bytes()) if path.is_file() else None
    action = "unchanged"
    if current != patch["sha_before"]:
        if current is not None and current != patch.get("sha_after") and patch["state"] == "applied":
            # edited by hand while kinv's patch was live: keep that edit beside the backups, and say so
            keep = store.dir / "backups" / _ws_dir(patch["workstream"]) / f"{path.name}.hand-edit.{current}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(keep, path.read_bytes(), fault="hand-edit")
            action = f"restored over a hand edit (sha {current}, kinv had written {patch.get('sha_after')}; the " \
                     f"edited file is kept at {keep})"
            store.event(patch["workstream"], "patch.hand_edit", f"{path.name} was edited by hand while patch "
                        f"#{patch['id']} was live; restored from the backup, the edit kept at {keep}",
                        {"patch": patch["id"], "kept": str(keep), "sha": current})  # fmt: skip
        bak = next((b for b in store.backups() if b["id"] == patch["backup"]), None)
        if bak is None or not Path(bak["backup_path"]).is_file():
            raise RevertError(f"cannot revert patch #{patch['id']} of {path}: its backup is missing (backups/ "
                              "deleted?); restore the file of record: kinv revert --to-plan PLAN")  # fmt: skip
        data = Path(bak["backup_path"]).read_bytes()
        if _sha_bytes(data) != patch["sha_before"]:
            raise RevertError(f"backup of {path} has sha {_sha_bytes(data)}, expected {patch['sha_before']}")
        _atomic_write(path, data, fault="restore")
        action = action if action.startswith("restored over") else "restored"
    after = sha(path)
    if after != patch["sha_before"]:
        raise RevertError(f"{path} has sha {after} after revert, expected {patch['sha_before']}")
    for stale in path.parent.glob(f".{path.name}{TMP_MARK}*"):  # temp files of a crashed write
        with contextlib.suppress(OSError):
            stale.unlink()
    store.journal_set(patch["id"], "reverted")
    return action


def revert(store: Store, patch_id: int) -> dict:
    """Restore the file of ``patch_id`` from its backup and verify its hash; idempotent."""
    patch = _patch_row(store, patch_id)
    if patch["state"] == "reverted":
        return patch
    action = _restore(store, patch)
    store.event(patch["workstream"], "patch.reverted", f"reverted {Path(patch['path']).name} (patch #{patch_id})",
                {"patch": patch_id, "action": action, "sha": patch["sha_before"]})  # fmt: skip
    return {**_patch_row(store, patch_id), "action": action}


def recover(store: Store) -> list[dict]:
    """Revert every patch left in state intent or applied (newest first); returns what was done.

    Every dangling patch is attempted; if any cannot be restored, RevertError is
    raised after the others were handled, naming the first failure.
    """
    done, failures = [], []
    for patch in reversed(store.dangling_patches()):
        try:
            action = _restore(store, patch)
        except (RevertError, OSError) as exc:
            failures.append(str(exc))
            continue
        item = {"patch": patch["id"], "path": patch["path"], "state_was": patch["state"], "action": action,
                "sha": patch["sha_before"]}  # fmt: skip
        store.event(patch["workstream"], "patch.recovered",
                    f"recovered {Path(patch['path']).name}: {action} (patch #{patch['id']} was {patch['state']})",
                    item)  # fmt: skip
        done.append(item)
    if failures:
        raise RevertError(f"recovery failed for {len(failures)} patch(es): {failures[0]}")
    store.prune_live_records()
    faults.point("recover.done")  # every kernel file is at its baseline, the journal has no dangling row
    return done


__all__ = [
    "apply_unified_diff",
    "backup",
    "edit_diff",
    "file_of_record",
    "keep_record",
    "note_kinv_write",
    "patch_config",
    "patch_source",
    "plan_config_edit",
    "recover",
    "restore_file_of_record",
    "revert",
    "sha",
]
