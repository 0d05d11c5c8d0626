"""Read, patch, back up, revert and diff kernel config files and kernel sources, journaled.

Crash safety is the point: no kernel file may ever be left patched.  Every
patch follows the same order, so that a crash at any instant is recoverable:

1. validate the change (nothing is written for a bad one);
2. copy the file into a content-addressed backup (fsynced);
3. write the journal intent (``patches`` row, state ``intent``) naming the
   backup and the file's hash before;
4. write the new bytes atomically (temp file in the same dir, fsync,
   ``os.replace``; :mod:`kinv.agent.tools.files.durable`): the file is always either the old or the new bytes;
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
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kinv.agent import faults
from kinv.agent.errors import LockedElsewhere, PatchError, RevertError
from kinv.agent.tools.files.config_text import (
    apply_unified_diff,
    diff_text,
    edit_config_text,
    render_config,
)
from kinv.agent.tools.files.durable import TMP_MARK, atomic_write, sha_bytes
from kinv.agent.tools.files.record import note_kinv_write
from kinv.kernels.errors import ConfigError
from kinv.kernels.launch_config import validate_config

if TYPE_CHECKING:
    from kinv.agent.store.db import Store


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
    return sha_bytes(Path(path).read_bytes())



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
        return sha_bytes(self.old)

    @property
    def sha_after(self) -> str:
        return sha_bytes(self.new)


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
        atomic_write(path, edit_config_text(path.read_bytes().decode("utf-8", errors="replace"), config).encode())
    else:
        atomic_write(path, render_config(config).encode())


# --------------------------------------------------------------------------- #
# backups (atomic writes: kinv.agent.tools.files.durable; the file of record: kinv.agent.tools.files.record)
# --------------------------------------------------------------------------- #
def _ws_dir(ws_id: str | None) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", (ws_id or "none").lstrip("#")) or "none"


def backup(store: Store, path: str | os.PathLike, ws_id: str | None) -> dict:
    """Copy ``path`` into ``<state>/backups/<ws>/<name>.<sha>`` (content-addressed) and record it."""
    path = Path(path).resolve()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PatchError(f"{path} does not exist; only existing kernel files can be patched") from None
    digest = sha_bytes(data)
    dest = store.dir / "backups" / _ws_dir(ws_id) / f"{path.name}.{digest}"
    if not (dest.is_file() and sha_bytes(dest.read_bytes()) == digest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, data, fault="backup")
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
    if bak["sha"] != sha_bytes(old):
        raise PatchError(f"{path} changed while it was being patched (sha {bak['sha']}); try again")
    if kind == "config":
        note_kinv_write(path, old, new)  # the file of record is kept before the file changes
    patch_id = store.journal_intent(workstream=ws_id, experiment=experiment, path=str(path), kind=kind,
                                    sha_before=bak["sha"], diff=diff, backup=bak["id"])  # fmt: skip
    try:
        atomic_write(path, new, fault="patch")
        store.journal_set(patch_id, "applied", sha_after=sha_bytes(new))
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
    current = sha_bytes(path.read_bytes()) if path.is_file() else None
    action = "unchanged"
    if current != patch["sha_before"]:
        if current is not None and current != patch.get("sha_after") and patch["state"] == "applied":
            # edited by hand while kinv's patch was live: keep that edit beside the backups, and say so
            keep = store.dir / "backups" / _ws_dir(patch["workstream"]) / f"{path.name}.hand-edit.{current}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(keep, path.read_bytes(), fault="hand-edit")
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
        if sha_bytes(data) != patch["sha_before"]:
            raise RevertError(f"backup of {path} has sha {sha_bytes(data)}, expected {patch['sha_before']}")
        atomic_write(path, data, fault="restore")
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
    "backup",
    "edit_diff",
    "patch_config",
    "patch_source",
    "plan_config_edit",
    "recover",
    "revert",
    "sha",
]
