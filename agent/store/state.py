"""The state dir around kinv.db: its paths, the live-patch records kept beside it, run locks, and the errors a
user reads about it.  Read-only probes of checkpoints.db live here too; kinv.db itself is :mod:`.db`'s."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from kinv.agent.errors import StateDamaged, StoreError
from kinv.kernels.errors import BadInput

DB_NAME = "kinv.db"
CHECKPOINTS_NAME = "checkpoints.db"


LIVE_DIR = "live-patches"  # one JSON file per live patch, kept beside kinv.db: it outlives a lost journal


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(data, default=str))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def live_markers(directory: str | os.PathLike) -> list[dict]:
    """The live-patch records of a state dir (read from files, no SQL): a patch whose journal row said intent or
    applied when it was written, and was not yet reverted or adopted.  Each names the file, its bytes before
    (``sha_before``, ``backup_path``: the file of record), the workstream and its plan."""
    out = []
    for f in sorted((Path(directory) / LIVE_DIR).glob("*.json")):
        try:
            out.append({**json.loads(f.read_text()), "marker": str(f)})
        except (OSError, ValueError):
            continue
    return out


def checkpoint_threads(directory: str | os.PathLike) -> set[str] | None:
    """The graph threads in checkpoints.db (read-only), or None when it is missing or unreadable."""
    ck = Path(directory) / CHECKPOINTS_NAME
    if not ck.is_file() or ck.stat().st_size == 0:
        return None
    try:
        conn = connect_read_only(ck, timeout=5)
        try:
            return {r[0] for r in conn.execute("select distinct thread_id from checkpoints")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return set() if "no such table" in str(exc) else None


def earlier_runs(directory: str | os.PathLike, known_ws: set[str] | None = None) -> str:
    """What in a state dir shows that runs were recorded here which kinv.db (whose workstreams are ``known_ws``)
    does not know of: '' when nothing does."""
    d = Path(directory)
    threads = checkpoint_threads(d)
    ck = d / CHECKPOINTS_NAME
    unknown = sorted({t.split("@")[0] for t in threads or ()} - (known_ws or set()))
    if unknown:
        return f"{ck} holds the graph of {', '.join(unknown)}"
    if known_ws is None and ck.is_file() and ck.stat().st_size > 0 and threads is None:
        return f"{ck} is there"
    lost = live_markers(d) if known_ws is None else []  # with a journal, its patch ids are compared instead
    if lost:
        return f"{lost[0]['marker']} records a live patch of {Path(lost[0]['path']).name} by {lost[0].get('workstream')}"
    return ""


def live_patch_line(directory: str | os.PathLike) -> str:
    """One sentence on the patches kinv left live (from the live-patch records) and the exact way back."""
    parts = []
    for m in live_markers(directory):
        path = Path(m["path"])
        try:
            import hashlib

            now_sha = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        except OSError:
            now_sha = None
        if now_sha is None or now_sha == m.get("sha_before"):
            continue
        plan = m.get("plan_path") or "PLAN"
        parts.append(f"{path.name} still holds patch #{m.get('patch')} of {m.get('workstream')} (sha {now_sha}, "
                     f"before it {m.get('sha_before')}): restore it with kinv revert --to-plan {plan}")  # fmt: skip
    return "; ".join(parts) or "if a kernel file holds a live patch (kinv doctor), restore it with kinv revert --to-plan PLAN"


def lock_path(directory: str | os.PathLike, name: str) -> Path:
    """The flock file of a run lock (a workstream, ``kernel:NAME``, ``campaign:ID``) in a state dir."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(directory) / "locks" / f"{safe}.lock"


def lock_held(directory: str | os.PathLike, name: str) -> bool:
    """Whether a live process holds that run lock right now (read-only probe; the kernel drops a dead one's)."""
    import fcntl

    path = lock_path(directory, name)
    if not path.is_file():
        return False
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def writable(directory: Path, path: Path) -> bool:
    """Whether this process may write the state dir and kinv.db (permissions and a read-only mount both count)."""
    return os.access(directory, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def connect_read_only(path: Path, timeout: float = 30) -> sqlite3.Connection:
    """A database of the state dir opened only to read (SQLite's ``mode=ro``).  In a state dir this process cannot
    write, with no ``-wal`` left by a writer, also ``immutable=1``: a WAL reader would otherwise need to create the
    ``-shm`` file, and nothing is created or changed there."""
    from urllib.parse import quote

    immutable = not writable(path.parent, path) and not path.with_name(path.name + "-wal").exists()
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else ""), uri=True,
                           timeout=timeout, check_same_thread=False)  # fmt: skip


def not_writable(path: Path, why: str) -> StoreError:
    """One line for a state dir kinv cannot write (permissions or a read-only mount), not a full disk."""
    return StoreError(f"cannot write the kinv state in {path.parent}: {why}; make it writable for this user (or "
                      "name another state dir with --state-dir or KINV_STATE_DIR) and run again; reading "
                      "commands (status, todos, report, ...) work without write access")  # fmt: skip


def _db_error(path: Path, exc: sqlite3.DatabaseError) -> StoreError | StateDamaged:
    msg = str(exc)
    if "readonly" in msg or ("unable to open" in msg and not writable(path.parent, path)):
        return not_writable(path, f"permission denied or a read-only file system ({msg})")
    if "full" in msg or "disk I/O" in msg:
        return StoreError(f"cannot write the kinv state in {path.parent}: the disk is full or failing ({msg}); free "
                          "space there and run again (what was recorded before is kept)")  # fmt: skip
    return StateDamaged(f"{path} is damaged ({msg}): move it aside (mv {path} {path}.damaged); "
                        f"{live_patch_line(path.parent)}")


def state_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The state dir: explicit > $KINV_STATE_DIR > ./state.  One that names a regular file is refused."""
    named = Path(explicit or os.environ.get("KINV_STATE_DIR") or "state")
    path = named.resolve()
    how = "--state-dir" if explicit else ("KINV_STATE_DIR" if os.environ.get("KINV_STATE_DIR") else "the state dir")
    for up in (path, *path.parents):
        if up.is_dir():
            break
        if (up.exists() or up.is_symlink()) and not up.is_dir():  # is_dir again: another opener may have just made it
            raise BadInput(f"{how} {str(named)!r} is not a directory: {up} is a file; name a directory "
                                "(kinv creates it if it does not exist)" if up != path else
                                f"{how} {str(named)!r} is a file, not a directory; name a directory "
                                "(kinv creates it if it does not exist)")  # fmt: skip
    return path


def now() -> float:
    return time.time()
