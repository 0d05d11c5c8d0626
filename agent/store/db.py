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
from kinv.agent.store.regressions import RegressRows
from kinv.agent.store.screened import ScreenedRows
from kinv.agent.store.state import (
    CHECKPOINTS_NAME,
    DB_NAME,
    LIVE_DIR,
    _db_error,
    _write_json,
    earlier_runs,
    live_markers,
    live_patch_line,
    lock_path,
    now,
    state_dir,
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


class Store(ScreenedRows, RegressRows):
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
            self.conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
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

    # ---- devices, experiments, samples -----------------------------------------
    def device(self, fingerprint: dict) -> str:
        import hashlib

        stable = {k: fingerprint.get(k) for k in ("gpu", "arch", "sms", "driver", "torch", "triton", "cuda")}
        dev_id = hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:12]
        if self._one("devices", dev_id) is None:
            faults.point("store.insert.devices.before")
            self.db["devices"].insert(
                {"id": dev_id, "gpu": fingerprint.get("gpu", "?"), "fingerprint": json.dumps(fingerprint),
                 "first_seen": now()}, replace=True)  # fmt: skip
            faults.point("store.insert.devices.after")
        return dev_id

    def new_experiment(self, **row) -> int:
        row.setdefault("status", "running")
        row.setdefault("started", now())
        for k in ("resources", "correctness"):
            if isinstance(row.get(k), dict | list):
                row[k] = json.dumps(row[k])
        return self._insert("experiments", row)

    def update_experiment(self, exp_id: int, **values) -> None:
        for k in ("resources", "correctness"):
            if isinstance(values.get(k), dict | list):
                values[k] = json.dumps(values[k])
        self._update("experiments", exp_id, values)

    def merge_resources(self, exp_id: int, **parts) -> None:
        """Add keys to an experiment's resources (the compiled figures its arms reported, what its timing read)."""
        row = self._one("experiments", exp_id) or {}
        res = json.loads(row.get("resources") or "{}")
        res.update(parts)
        self._update("experiments", exp_id, {"resources": json.dumps(res)})

    def running_experiment(self, ws_id: str, todo: str, kind: str) -> dict | None:
        """The newest experiment of a todo still 'running' (a node killed mid-way resumes it)."""
        rows = self._rows("experiments", "workstream = ? and todo = ? and kind = ? and status = 'running'",
                          [ws_id, todo, kind], order_by="id desc")  # fmt: skip
        return rows[0] if rows else None

    def done_experiment(self, ws_id: str, todo: str, kind: str, version: int) -> dict | None:
        """The newest finished experiment of a todo in this plan version: a node re-run after a kill between its
        commit and the graph's checkpoint reuses it instead of measuring again."""
        rows = self._rows("experiments", "workstream = ? and todo = ? and kind = ? and status = 'done' and "
                          "coalesce(version, 1) = ?", [ws_id, todo, kind, version], order_by="id desc")  # fmt: skip
        return rows[0] if rows else None

    def discard_experiment(self, exp_id: int) -> None:
        """Delete an experiment that measured nothing usable (a refused confirming A/B): its samples and
        verdicts with it, in one transaction."""
        with self.db.conn:
            for table, col in (("samples", "experiment"), ("verdicts", "experiment"), ("experiments", "id")):
                self.db.execute(f"delete from {table} where {col} = ?", [exp_id])

    def device_fingerprint(self, dev_id: str | None) -> dict:
        """The fingerprint recorded for a device id ({} when unknown)."""
        row = self._one("devices", dev_id) if dev_id else None
        return json.loads(row["fingerprint"]) if row and row.get("fingerprint") else {}

    def experiment(self, exp_id: int) -> dict | None:
        return self._one("experiments", exp_id)

    def experiments(self, ws_id: str | None = None) -> list[dict]:
        if ws_id is None:
            return self._rows("experiments", order_by="id")
        return self._rows("experiments", "workstream = ?", [ws_id], order_by="id")

    def add_samples(self, rows: list[dict]) -> None:
        """Insert samples in one transaction (all or none)."""
        rows = [{**r, "env": json.dumps(r["env"]) if isinstance(r.get("env"), dict) else r.get("env")} for r in rows]
        faults.point("store.samples.before")
        with self.db.conn:
            self.db["samples"].insert_all(rows)
        faults.point("store.samples.after")

    def places(self, exp_ids: list[int]) -> dict[str, list[str]]:
        """Which place (a Ray actor's GPU) timed which levels of these experiments: place -> levels, in the
        order first timed.  Empty when every sample was timed in one process."""
        if not exp_ids:
            return {}
        marks = ",".join("?" * len(exp_ids))
        rows = self._query(f"select place, level, min(id) as first from samples where experiment in ({marks}) "
                           "and place is not null group by place, level order by first", list(exp_ids))  # fmt: skip
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["place"], []).append(r["level"])
        return out

    def samples(self, exp_id: int) -> list[dict]:
        return self._rows("samples", "experiment = ?", [exp_id], order_by="id")

    def sample_count(self, exp_id: int | None = None) -> int:
        if exp_id is None:
            return self.conn.execute("select count(*) from samples").fetchone()[0]
        return self.conn.execute("select count(*) from samples where experiment = ?", [exp_id]).fetchone()[0]

    def add_verdicts(self, exp_id: int, rows: list[dict]) -> None:
        faults.point("store.verdicts.before")
        with self.db.conn:
            self.db.execute("delete from verdicts where experiment = ?", [exp_id])
            self.db["verdicts"].insert_all([{**r, "experiment": exp_id, "t": now()} for r in rows])
        faults.point("store.verdicts.after")

    def add_profile(self, ws_id: str | None, exp_id: int, arm: str, config_hash: str, level: str, figures: dict,
                    source: str, seconds: float) -> None:  # fmt: skip
        with self.db.conn:
            self.db.execute("delete from profiles where experiment = ? and arm = ? and level = ?", [exp_id, arm, level])
            self.db["profiles"].insert({"workstream": ws_id, "experiment": exp_id, "arm": arm, "config_hash": config_hash,
                                        "level": level, "figures": json.dumps(figures), "source": source,
                                        "seconds": seconds, "t": now()})  # fmt: skip

    def profiles(self, ws_id: str | None = None, exp_id: int | None = None) -> list[dict]:
        rows = self._filtered("profiles", "id", workstream=ws_id, experiment=exp_id)
        return [{**r, "figures": json.loads(r["figures"] or "{}")} for r in rows]

    def verdicts(self, exp_id: int) -> list[dict]:
        return self._rows("verdicts", "experiment = ?", [exp_id], order_by="id")

    def add_noise(self, exp_id: int, ws_id: str | None, rows: list[dict]) -> None:
        faults.point("store.noise.before")
        with self.db.conn:
            self.db.execute("delete from noise where experiment = ?", [exp_id])
            self.db["noise"].insert_all([{**r, "experiment": exp_id, "workstream": ws_id, "t": now()} for r in rows])
        faults.point("store.noise.after")

    def noise(self, ws_id: str | None = None, exp_id: int | None = None) -> list[dict]:
        return self._filtered("noise", "id", experiment=exp_id, workstream=None if exp_id is not None else ws_id)

    def add_measurements(self, exp_id: int, rows: list[dict]) -> None:
        faults.point("store.measurements.before")
        with self.db.conn:
            self.db["measurements"].insert_all([{**r, "experiment": exp_id, "t": now()} for r in rows])
        faults.point("store.measurements.after")

    def measurements(self, exp_id: int) -> list[dict]:
        return self._rows("measurements", "experiment = ?", [exp_id], order_by="id")

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

    # ---- campaigns ----------------------------------------------------------------
    _CAMPAIGN_JSON = ("start_config", "incumbent", "steps", "summary")

    def upsert_campaign(self, row: dict) -> None:
        row = {k: json.dumps(v) if k in self._CAMPAIGN_JSON and not isinstance(v, str) else v for k, v in row.items()}
        row["updated"] = now()
        if self._one("campaigns", row["id"]) is None:
            self._insert("campaigns", {"created": now(), **row})
        else:
            self._update("campaigns", row["id"], row)

    def campaign(self, campaign_id: str) -> dict | None:
        row = self._one("campaigns", campaign_id)
        if row is None:
            return None
        return {k: json.loads(v) if k in self._CAMPAIGN_JSON and v else v for k, v in row.items()}

    def campaigns(self) -> list[dict]:
        return [self.campaign(r["id"]) for r in self._rows("campaigns", order_by="created")]

    def ledger_sums(self, experiments: list[int], workstreams: list[str]) -> tuple[float, int, float, int]:
        """kinv.db's side of the GPU-second ledger (agent.tools.protocol.Ledger) of these experiments, or of every
        experiment of these workstreams (screening included): the stored samples' GPU s and count, and the GPU s
        and count of the lost samples' events (a level of a round that lost a sample: nothing of it is stored)."""
        if not experiments and not workstreams:
            return 0.0, 0, 0.0, 0
        marks = ",".join("?" * (len(experiments) or len(workstreams)))
        which = (f"e.id in ({marks})" if experiments else f"e.workstream in ({marks})")
        args = experiments or workstreams
        if experiments:  # summed here in the order stored, as each experiment's own ledger always was
            got = [r[0] for r in self.conn.execute(f"select gpu_s from samples where experiment in ({marks}) order by "
                                                   "experiment, id", args)]  # fmt: skip
            kept = (sum(g or 0.0 for g in got), len(got))
        else:
            kept = self.conn.execute(f"select coalesce(sum(s.gpu_s), 0), count(*) from samples s join experiments e "
                                     f"on s.experiment = e.id where {which}", args).fetchone()  # fmt: skip
        lost = self.conn.execute(f"select coalesce(sum(json_extract(v.data, '$.gpu_s')), 0), count(*) from events v "
                                 f"join experiments e on json_extract(v.data, '$.experiment') = e.id where "
                                 f"v.kind = 'sample.lost' and {which}", args).fetchone()  # fmt: skip
        return float(kept[0]), int(kept[1]), float(lost[0]), int(lost[1])

    def campaign_wall_s(self, ws_ids: list[str]) -> float:
        """Wall seconds these workstreams spent running: their screenings (a running one until now) and their graph
        nodes (node_runs, which end where a node pauses for a person), never the time paused between them."""
        if not ws_ids:
            return 0.0
        marks = ",".join("?" * len(ws_ids))
        nodes = self.conn.execute(f"select coalesce(sum(finished - started), 0) from node_runs where workstream in "
                                  f"({marks})", ws_ids).fetchone()[0]  # fmt: skip
        screens = self.conn.execute(f"select coalesce(sum(coalesce(finished, ?) - started), 0) from experiments where "
                                    f"kind = 'screen' and workstream in ({marks})", [now(), *ws_ids]).fetchone()[0]  # fmt: skip
        return float(nodes) + float(screens)

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
