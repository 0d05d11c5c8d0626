"""The :class:`Store`: every read and write of kinv.db."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kinv.agent import faults
from kinv.agent.errors import NoState, StateDamaged, StoreError
from kinv.agent.store import schema
from kinv.agent.store.campaigns import CampaignRows
from kinv.agent.store.experiments import ExperimentRows
from kinv.agent.store.regressions import RegressRows
from kinv.agent.store.screened import ScreenedRows
from kinv.agent.store.state import (
    CHECKPOINTS_NAME,
    DB_NAME,
    LIVE_DIR,
    _db_error,
    _write_json,
    connect_read_only,
    earlier_runs,
    live_markers,
    live_patch_line,
    lock_path,
    now,
    state_dir,
    writable,
)
from kinv.kernels.errors import BadInput

if TYPE_CHECKING:
    import sqlite_utils

log = logging.getLogger("kinv.agent.store")


def _while_locked(fn, seconds: float = 30.0):
    """Run ``fn``, again while SQLite answers "database is locked": switching a fresh file to WAL needs the
    database to itself and does not always wait on the busy timeout, so two first opens can collide there."""
    deadline = time.time() + seconds
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.time() > deadline:
                raise
            time.sleep(0.05)


class Store(ExperimentRows, CampaignRows, ScreenedRows, RegressRows):
    """All reads and writes of kinv.db."""

    def __init__(self, directory: str | os.PathLike | None = None, *, create: bool = True):
        self.dir = state_dir(directory)
        self.path = self.dir / DB_NAME
        existed = self.path.exists()
        if not existed:
            seen = earlier_runs(self.dir) if self.dir.is_dir() else ""
            if seen:  # deleted: the journal of what kinv patched went with it
                raise StateDamaged(f"{self.path} is missing although {seen}: its records are lost; "
                                   f"{live_patch_line(self.dir)}; then start again in a fresh state dir")  # fmt: skip
            if not create:
                raise NoState(
                    f"no kinv state at {self.dir}: start an investigation with "
                    "`kinv run plans/3a-attention-occupancy.yaml`, or point --state-dir / KINV_STATE_DIR at one"
                )
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except (PermissionError, FileExistsError, NotADirectoryError) as exc:  # a dir a user named
                raise BadInput(f"cannot create the state dir {self.dir}: {exc.strerror or exc}; name a "
                                    "directory kinv can create or write (--state-dir or KINV_STATE_DIR)") from None
        elif self.path.stat().st_size == 0 and (seen := earlier_runs(self.dir)):
            raise StateDamaged(f"{self.path} is empty (truncated?) although {seen}: its records are lost; "
                               f"{live_patch_line(self.dir)}")  # fmt: skip
        self._db = None
        self._locks: dict = {}
        try:
            if create or writable(self.dir, self.path):
                self.conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
            else:  # a state dir this process may only read: the reading commands still read it
                self.conn = connect_read_only(self.path)
            self.conn.execute("PRAGMA busy_timeout = 30000")
            if existed:
                self._check_records()  # before anything writes to it
            if create:
                _while_locked(lambda: self.conn.execute("PRAGMA journal_mode = WAL"))
            self.conn.execute("PRAGMA foreign_keys = ON")
            _while_locked(self.migrate)
        except sqlite3.DatabaseError as exc:
            raise _db_error(self.path, exc) from None
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)

    def _check_records(self) -> None:
        """Refuse a kinv.db that has lost records the rest of the state dir proves (its -wal deleted, rows gone):
        a run on it would start over while a kernel file may hold a patch it has no record of."""
        tables = {r[0] for r in self.conn.execute("select name from sqlite_master where type = 'table'")}
        known = {r[0] for r in self.conn.execute("select id from workstreams")} if "workstreams" in tables else set()
        if "campaigns" in tables:  # a campaign's graph checkpoints on its own thread, named after the campaign
            known |= {r[0] for r in self.conn.execute("select id from campaigns")}
        seen = earlier_runs(self.dir, known)
        if not seen and "patches" in tables:
            ids = {r[0] for r in self.conn.execute("select id from patches")}
            gone = [m for m in live_markers(self.dir) if m.get("patch") not in ids]
            if gone:
                seen = f"{gone[0]['marker']} records patch #{gone[0]['patch']} of {Path(gone[0]['path']).name}"
        if seen:
            raise StateDamaged(f"{self.path} has lost records (its -wal deleted, or rows gone?): {seen} but kinv.db "
                               f"does not; {live_patch_line(self.dir)}")  # fmt: skip

    def check_intact(self) -> None:
        """Raise StateDamaged if kinv.db was deleted or replaced under this open store (checked at every graph
        node and at the close-out): the run's records would go nowhere."""
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            raise StateDamaged(f"{self.path} was deleted or replaced during the run: its records are lost (the kernel "
                               "file is restored from its backup as the run stops); start again in a fresh state dir")

    @property
    def db(self) -> sqlite_utils.Database:
        """sqlite-utils over the same connection, imported on first use (writes)."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    @property
    def checkpoints_path(self) -> Path:
        return self.dir / CHECKPOINTS_NAME

    def migrate(self) -> None:
        """Apply the migrations not yet applied, all in one transaction that holds the database's write lock
        (BEGIN IMMEDIATE): a crash or a full disk midway leaves none of them, and two first runs in a fresh state
        dir take turns instead of both creating tables.  sqlite-utils is imported only if there is work to do."""
        try:
            done = {r[0] for r in self.conn.execute("select name from _migrations")}
        except sqlite3.OperationalError:
            done = set()
        if all(name in done for name, _ in schema.MIGRATIONS):
            return
        db = self.db
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.execute("create table if not exists _migrations (name text primary key, applied float)")
            done = {r[0] for r in self.conn.execute("select name from _migrations")}  # a racer may have done them
            for name, fn in schema.MIGRATIONS:
                if name in done:
                    continue
                fn(db)
                self.conn.execute("insert into _migrations values (?, ?)", [name, now()])
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise

    def close(self) -> None:
        self.conn.close()

    # ---- generic helpers ---------------------------------------------------
    def _insert(self, table: str, row: dict, fault: str | None = None) -> int:
        faults.point(f"{fault or 'store.insert.' + table}.before")
        pk = self.db[table].insert(row).last_pk
        faults.point(f"{fault or 'store.insert.' + table}.after")
        return pk

    def _update(self, table: str, pk, values: dict, fault: str | None = None) -> None:
        faults.point(f"{fault or 'store.update.' + table}.before")
        self.db[table].update(pk, values)
        faults.point(f"{fault or 'store.update.' + table}.after")

    def _query(self, sql: str, args=()) -> list[dict]:
        cur = self.conn.execute(sql, list(args))
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def _one(self, table: str, pk) -> dict | None:
        rows = self._query(f"select * from [{table}] where id = ?", [pk])
        return rows[0] if rows else None

    def _rows(self, table: str, where: str | None = None, args=None, order_by: str | None = None) -> list[dict]:
        sql = f"select * from [{table}]" + (f" where {where}" if where else "") + (f" order by {order_by}" if order_by else "")
        return self._query(sql, args or [])

    def _filtered(self, table: str, order_by: str, **equal) -> list[dict]:
        """Rows whose columns equal the given values (None = no filter on that column)."""
        pairs = [(k, v) for k, v in equal.items() if v is not None]
        where = " and ".join(f"{k} = ?" for k, _ in pairs) or None
        return self._rows(table, where, [v for _, v in pairs], order_by=order_by)

    # ---- workstreams and todos -----------------------------------------------
    def upsert_workstream(self, row: dict) -> None:
        row = {**row, "updated": now()}
        if self._one("workstreams", row["id"]) is None:
            faults.point("store.insert.workstreams.before")
            self.db["workstreams"].insert({**row, "created": now()})
            faults.point("store.insert.workstreams.after")
        else:
            self._update("workstreams", row["id"], row)

    def workstream(self, ws_id: str) -> dict | None:
        return self._one("workstreams", ws_id)

    def workstreams(self) -> list[dict]:
        return self._rows("workstreams", order_by="created")

    def archive_version(self, ws_id: str) -> int:
        """Keep the workstream's current version in plan_versions (its plan, outcome and todos), clear its todos
        for the next version, and return the new version number."""
        row = self.workstream(ws_id)
        version = int(row.get("version") or 1)
        todos = self.todos(ws_id)
        with self.db.conn:
            self.db["plan_versions"].insert({
                "workstream": ws_id, "version": version, "plan_path": row.get("plan_path"),
                "plan_hash": row.get("plan_hash"), "plan_json": row.get("plan_json"), "status": row.get("status"),
                "report_path": row.get("report_path"), "recommendation": row.get("recommendation"),
                "todos_json": json.dumps(todos), "closed": row.get("closed"), "archived": now(),
            })  # fmt: skip
            self.db.execute("delete from todos where workstream = ?", [ws_id])
            self.db.execute("update experiments set status = 'superseded', reason = coalesce(reason, ?) "
                            "where workstream = ? and status = 'running'",
                            [f"superseded by plan version {version + 1}", ws_id])  # fmt: skip
            self._update("workstreams", ws_id, {"version": version + 1, "status": "open", "report_path": None,
                                                "recommendation": None, "closed": None, "updated": now()})  # fmt: skip
        return version + 1

    def plan_versions(self, ws_id: str) -> list[dict]:
        return self._rows("plan_versions", "workstream = ?", [ws_id], order_by="version")

    def update_workstream(self, ws_id: str, **values) -> None:
        self._update("workstreams", ws_id, {**values, "updated": now()})

    def upsert_todo(self, row: dict) -> None:
        row = {**row, "updated": now()}
        if self._one("todos", row["id"]) is None:
            faults.point("store.insert.todos.before")
            self.db["todos"].insert({**row, "created": now()})
            faults.point("store.insert.todos.after")
        else:
            self._update("todos", row["id"], row)

    def todos(self, ws_id: str | None = None) -> list[dict]:
        if ws_id is None:
            return self._rows("todos", order_by="workstream, position")
        return self._rows("todos", "workstream = ?", [ws_id], order_by="position")

    def todo(self, todo_id: str) -> dict | None:
        return self._one("todos", todo_id)

    # ---- backups and the patch journal ------------------------------------------
    def add_backup(self, path: str, backup_path: str, sha: str, ws_id: str | None) -> int:
        return self._insert("backups", {"path": path, "backup_path": backup_path, "sha": sha, "workstream": ws_id,
                                        "t": now()})  # fmt: skip

    def backups(self) -> list[dict]:
        return self._rows("backups", order_by="id")

    def journal_intent(self, **row) -> int:
        """Write the intent to patch a file BEFORE the file is touched, and its live-patch record beside kinv.db
        (which names the file of record even if kinv.db is later lost)."""
        row.update(state="intent", created=now(), updated=now())
        patch_id = self._insert("patches", row, fault="journal.intent")
        ws = self.workstream(row["workstream"]) if row.get("workstream") else None
        bak = self._one("backups", row.get("backup")) if row.get("backup") is not None else None
        _write_json(self._marker(patch_id, row["path"]), {
            "patch": patch_id, "path": row["path"], "sha_before": row.get("sha_before"), "workstream": row.get("workstream"),
            "experiment": row.get("experiment"), "backup_path": (bak or {}).get("backup_path"),
            "plan_path": (ws or {}).get("plan_path"), "state_dir": str(self.dir), "pid": os.getpid(), "t": now()})  # fmt: skip
        return patch_id

    def _marker(self, patch_id: int, path: str) -> Path:
        return self.dir / LIVE_DIR / f"{Path(path).name}.{patch_id}.json"

    def journal_set(self, patch_id: int, state: str, **values) -> None:
        self._update("patches", patch_id, {**values, "state": state, "updated": now()}, fault=f"journal.{state}")
        if state in ("reverted", "adopted"):  # final: the file is its backup again, or the adopted bytes
            for f in (self.dir / LIVE_DIR).glob(f"*.{patch_id}.json"):
                f.unlink(missing_ok=True)

    def prune_live_records(self) -> None:
        """Drop live-patch records whose journal row is final (a kill came between the row and the file's removal)."""
        final = {r[0] for r in self.conn.execute("select id from patches where state in ('reverted', 'adopted')")}
        for m in live_markers(self.dir):
            if m.get("patch") in final:
                Path(m["marker"]).unlink(missing_ok=True)

    def patches(self, ws_id: str | None = None, state: str | None = None) -> list[dict]:
        return self._filtered("patches", "id", workstream=ws_id, state=state)

    def dangling_patches(self) -> list[dict]:
        """Patches whose file may differ from the baseline: intent or applied, never reverted."""
        return self._rows("patches", "state in ('intent', 'applied')", order_by="id")

    # ---- graph history -------------------------------------------------------------
    def add_node_run(self, ws_id: str, version: int, node: str, started: float, decision: str | None,
                     outcome: str) -> int:  # fmt: skip
        """One graph node's run: its decision (what it concluded) and outcome (ok, the next node, paused, error)."""
        step = 1 + (self.conn.execute("select count(*) from node_runs where workstream = ? and version = ?",
                                      [ws_id, version]).fetchone()[0])  # fmt: skip
        return self._insert("node_runs", {"workstream": ws_id, "version": version, "node": node, "step": step,
                                          "started": started, "finished": now(), "decision": decision,
                                          "outcome": outcome, "pid": os.getpid()}, fault="history.node_run")  # fmt: skip

    def node_runs(self, ws_id: str, version: int | None = None) -> list[dict]:
        return self._filtered("node_runs", "id", workstream=ws_id, version=version)

    # ---- env checks, approvals, events -------------------------------------------
    def add_env_check(self, **row) -> int:
        for k in ("expected", "seen"):
            if isinstance(row.get(k), dict):
                row[k] = json.dumps(row[k])
        return self._insert("env_checks", {**row, "t": now()})

    def env_checks(self, ws_id: str | None = None, exp_id: int | None = None) -> list[dict]:
        return self._filtered("env_checks", "id", experiment=exp_id,
                              workstream=None if exp_id is not None else ws_id)  # fmt: skip

    def add_approval(self, **row) -> None:
        if isinstance(row.get("resources"), dict):
            row["resources"] = json.dumps(row["resources"])
        row.setdefault("status", "pending")
        faults.point("store.insert.approvals.before")
        if self.approval(row["id"]) is not None:  # recorded once: a re-run node never overwrites a decision
            faults.point("store.insert.approvals.after")
            return
        self.db["approvals"].insert({**row, "created": now()})
        faults.point("store.insert.approvals.after")

    def approval(self, approval_id: str) -> dict | None:
        return self._one("approvals", approval_id)

    def approvals(self, status: str | None = None, ws_id: str | None = None) -> list[dict]:
        return self._filtered("approvals", "created", status=status or None, workstream=ws_id or None)

    def decide_approval(self, approval_id: str, status: str, reason: str = "", via: str = "") -> bool:
        """Decide a pending approval, once: a compare-and-set on status = 'pending'.  False when it was already
        decided (the loser of an approve/reject race, or a second decision).  The decision and its ``approval``
        event are one transaction: a kill leaves both or neither."""
        faults.point("store.update.approvals.before")
        with self.conn:
            cur = self.conn.execute("update approvals set status = ?, reason = ?, decided = ? "
                                    "where id = ? and status = 'pending'", [status, reason, now(), approval_id])  # fmt: skip
            if cur.rowcount == 1:
                ws = self.conn.execute("select workstream from approvals where id = ?", [approval_id]).fetchone()[0]
                self.conn.execute("insert into events (workstream, t, kind, message, data) values (?, ?, ?, ?, ?)",
                                  [ws, now(), "approval", f"{approval_id} {status}" + (f" {via}" if via else "")
                                   + (f": {reason}" if reason else ""), json.dumps({"reason": reason})])  # fmt: skip
        faults.point("store.update.approvals.after")
        return cur.rowcount == 1

    def event(self, ws_id: str | None, kind: str, message: str, data: dict | None = None) -> None:
        log.info("%s %s: %s", ws_id or "-", kind, message)  # patches, reverts, checks, approvals: kinv.log too
        self._insert("events", {"workstream": ws_id, "t": now(), "kind": kind, "message": message,
                                "data": json.dumps(data or {}, default=str)})  # fmt: skip

    def events(self, ws_id: str | None = None, limit: int = 200) -> list[dict]:
        if ws_id is None:
            return self._query("select * from events order by id desc limit ?", [limit])[::-1]
        return self._query("select * from events where workstream = ? order by id desc limit ?", [ws_id, limit])[::-1]

    # ---- the run lock ---------------------------------------------------------------
    # An flock on <state>/locks/<name>.lock, held for the life of the run, is the lock: the kernel
    # releases it when the process dies, even by SIGKILL, so pid reuse cannot fake a live holder.
    # The locks table only records who holds it, for the message.
    def _lock_file(self, name: str) -> Path:
        path = lock_path(self.dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _held_elsewhere(self, name: str) -> bool:
        import fcntl

        with open(self._lock_file(name), "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return name not in self._locks
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    def acquire_lock(self, ws_id: str, pid: int) -> None:
        """One writer per workstream (and per kernel file); a second is refused naming the holder's pid."""
        import fcntl
        import socket

        if ws_id in self._locks:
            return
        fh = open(self._lock_file(ws_id), "a")  # noqa: SIM115 - held until release_lock
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            row = self.conn.execute("select pid from locks where workstream = ?", [ws_id]).fetchone()
            what = (f"kernel {ws_id[7:]}" if ws_id.startswith("kernel:") else
                    f"campaign {ws_id[9:]}" if ws_id.startswith("campaign:") else f"workstream {ws_id}")  # fmt: skip
            holder = f"pid {row[0]}" if row else "another process"
            raise StoreError(f"{what} is already being run by {holder}; wait for it or stop it") from None
        self._locks[ws_id] = fh
        with self.conn:
            self.conn.execute("insert or replace into locks values (?, ?, ?, ?)", [ws_id, pid, socket.gethostname(), now()])
        faults.point("lock.acquired")

    def release_lock(self, ws_id: str, pid: int) -> None:
        faults.point("lock.release")
        with self.conn:
            self.conn.execute("delete from locks where workstream = ? and pid = ?", [ws_id, pid])
        fh = self._locks.pop(ws_id, None)
        if fh is not None:
            fh.close()  # closing releases the flock

    def live_locks(self) -> list[dict]:
        """Locks held right now by other processes: {workstream, pid}."""
        rows = self._query("select workstream, pid from locks")
        return [r for r in rows if self._held_elsewhere(r["workstream"])]

    def lock_holder(self, ws_id: str) -> int | None:
        row = self.conn.execute("select pid from locks where workstream = ?", [ws_id]).fetchone()
        return row[0] if row and self._held_elsewhere(ws_id) else None
