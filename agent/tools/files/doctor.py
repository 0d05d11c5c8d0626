"""``kinv doctor``: what is wrong with a state dir and its kernels' live files, and the command that mends it.

Every check reads; nothing here writes.  The checks do not depend on kinv.db being readable: a missing,
empty or damaged database, or one that lost records the rest of the state dir proves (checkpoints of a
workstream it does not know, a live-patch record of a patch it has no row for), is itself a BAD finding.  The
live-patch records (``<state>/live-patches/``, written beside the journal's intent) then name the file that
differs from its file of record, how, and the exact way back (``kinv revert --to-plan PLAN`` needs no state).
A patch held by a live run (its lock is held) is reported as running, not as left behind.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path

from kinv.agent.store.state import connect_read_only

KEPT = " (kinv.db and the journal keep every decision and sample so far)"


@dataclass
class Finding:
    check: str
    status: str  # ok | warn | bad
    detail: str
    fix: str = ""


def diagnose(state: Path, plans_dir: Path | None = None) -> list[Finding]:
    from kinv.agent.store.state import DB_NAME, earlier_runs, live_markers, lock_held, writable

    out: list[Finding] = []
    db = state / DB_NAME
    if not state.is_dir():
        return [Finding("state dir", "warn", f"{state} does not exist (nothing has run here)",
                        "kinv run plans/3a-attention-occupancy.yaml")]  # fmt: skip
    if not any(not p.name.startswith(".") for p in state.iterdir()):  # a fresh clone's state/ (its .gitkeep)
        return [Finding("state dir", "warn", f"{state} is empty (nothing has run here)",
                        "kinv run plans/3a-attention-occupancy.yaml")]  # fmt: skip
    rows: dict[str, list] = {}
    if not writable(state, db):
        out.append(Finding("state dir", "warn", f"{state} is not writable by this user (its permissions, or a read-only "
                           "mount): reading commands work, runs and decisions cannot", "make it writable for this "
                           "user, or run with another --state-dir"))  # fmt: skip
    markers = live_markers(state)
    way_back = _way_back(markers)
    aside = f"move it aside (mv {db} {db}.damaged) and restore the kernel file: {way_back}; then start again"
    if not db.is_file():
        wal = [p.name for p in (state / f"{DB_NAME}-wal", state / f"{DB_NAME}-shm") if p.exists()]
        seen = earlier_runs(state)
        out.append(Finding("kinv.db", "bad", f"{db} is missing" + (f" (left: {', '.join(wal)})" if wal else "")
                           + (f" although {seen}: its records are lost" if seen else ""),
                           f"restore the kernel file: {way_back}; then start again in a fresh state dir"))  # fmt: skip
    elif db.stat().st_size == 0:
        out.append(Finding("kinv.db", "bad", f"{db} is empty (truncated?)" + (
            f" although {earlier_runs(state)}: its records are lost" if earlier_runs(state) else ""), aside))  # fmt: skip
    else:
        try:
            conn = connect_read_only(db, timeout=5)
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            for table in ("workstreams", "patches", "backups", "locks", "experiments"):
                cur = conn.execute(f"select * from [{table}]")
                cols = [c[0] for c in cur.description]
                rows[table] = [dict(zip(cols, r)) for r in cur.fetchall()]
            known = {w["id"] for w in rows["workstreams"]}
            if conn.execute("select 1 from sqlite_master where type = 'table' and name = 'campaigns'").fetchone():
                camps = conn.execute("select id, plan_path from campaigns").fetchall()
                known |= {r[0] for r in camps}  # a campaign's graph has a thread
                rows["campaign_plans"] = sorted({r[1] for r in camps if r[1]})
            conn.close()
            seen = earlier_runs(state, known)
            ids = {p["id"] for p in rows["patches"]}
            gone = [m for m in markers if m.get("patch") not in ids]
            if not seen and gone:
                seen = f"{gone[0]['marker']} records patch #{gone[0]['patch']} of {Path(gone[0]['path']).name}"
            if seen:
                out.append(Finding("kinv.db", "bad", f"{db} has lost records (its -wal deleted, or rows gone?): "
                                   f"{seen} but kinv.db does not", aside))  # fmt: skip
            else:
                out.append(Finding("kinv.db", "ok", f"{db} reads and passes SQLite's quick_check"))
        except sqlite3.DatabaseError as exc:
            rows = {}
            out.append(Finding("kinv.db", "bad", f"{db} is damaged: {exc}", aside))
    # ---- patches live on disk: the journal's, and those only the live-patch records still know ------------
    live = [p for p in rows.get("patches", []) if p["state"] in ("intent", "applied")]
    running = [p for p in live if lock_held(state, p["workstream"] or "")]
    for p in running:
        pid = next((lk["pid"] for lk in rows.get("locks", []) if lk["workstream"] == p["workstream"]), "?")
        out.append(Finding("patches", "ok", f"{p['workstream']} is running (pid {pid}): its patch #{p['id']} of "
                           f"{Path(p['path']).name} is live while it measures; that run reverts it when it ends"))  # fmt: skip
    left = [p for p in live if p not in running]
    if left:
        names = ", ".join(f"#{p['id']} {Path(p['path']).name} ({p['workstream']}{_variant(rows, p)})" for p in left)
        wss = sorted({(p["workstream"] or "").lstrip("#") for p in left if p["workstream"]})
        fix = " or ".join([*(f"kinv resume {w}" for w in wss), "kinv revert"]) + " (either restores the file from its backup)"
        out.append(Finding("patches", "bad", f"un-reverted patch(es) on disk, left by a run that is gone: {names}", fix))
    elif "patches" in rows and not running:
        adopted = sum(p["state"] == "adopted" for p in rows["patches"])
        out.append(Finding("patches", "ok", "no patch is live" + (f"; {adopted} adopted (final)" if adopted else "")))
    known = {p["id"] for p in rows.get("patches", [])}
    for m in markers:
        if m.get("patch") in known:
            continue  # the journal has it (reported above)
        how = _differs(m)
        if how:
            out.append(Finding(f"live {Path(m['path']).name}", "bad", f"{m['path']} {how}: patch #{m.get('patch')} of "
                               f"{m.get('workstream')}, of which kinv.db has no record", _way_back([m])))  # fmt: skip
    # ---- backups the journal relies on ------------------------------------------------------
    needed = {p["backup"] for p in live}
    missing = [b for b in rows.get("backups", []) if not Path(b["backup_path"]).is_file()]
    bad_missing = [b for b in missing if b["id"] in needed]
    if bad_missing:
        out.append(Finding("backups", "bad", f"{len(bad_missing)} backup(s) a live patch needs are gone: "
                           f"{bad_missing[0]['backup_path']}", "kinv revert --to-plan PLAN (restores the baseline "
                           "from the plan, verified by hash)"))  # fmt: skip
    elif missing:
        out.append(Finding("backups", "warn", f"{len(missing)} old backup file(s) deleted (no live patch needs them)"))
    elif "backups" in rows:
        out.append(Finding("backups", "ok", f"{len(rows['backups'])} backup(s) on disk"))
    out += _checkpoints(state, rows)
    out += _study(state, rows.get("campaign_plans") or ["PLAN"])
    # ---- stale locks --------------------------------------------------------------------------
    stale = [row for row in rows.get("locks", []) if not _alive(row["pid"])]
    if stale:
        out.append(Finding("locks", "warn", "lock row(s) of dead process(es): " + ", ".join(
            f"{r['workstream']} (pid {r['pid']})" for r in stale), "none needed: the next run takes the lock"))
    # ---- live configs against the baselines ----------------------------------------------------------
    out += configs_against_baselines(rows.get("workstreams", []), plans_dir, rows.get("patches", []),
                                     rows.get("experiments"))  # fmt: skip
    return out


def _checkpoints(state: Path, rows: dict) -> list[Finding]:
    """The graph's checkpoints: present, readable, one thread for every workstream that started measuring; or the
    way on (the journal and kinv.db keep every decision)."""
    from kinv.agent.store.state import CHECKPOINTS_NAME

    out: list[Finding] = []
    ck = state / CHECKPOINTS_NAME
    started = [w for w in rows.get("workstreams", []) if w["status"] not in ("open", "closed")]
    ran = {e["workstream"] for e in rows.get("experiments", []) if e["workstream"]}
    open_ws = [w["id"] for w in started if w["id"] in ran]
    plan_of = {w["id"]: w.get("plan_path") for w in rows.get("workstreams", [])}

    def new_version(ws_ids):
        plans = sorted({plan_of.get(w) or "PLAN" for w in ws_ids}) or ["PLAN"]
        return " ; ".join(f"kinv run {p} --new-version" for p in plans) + " (the old version stays in history)"

    if open_ws and not ck.is_file():
        out.append(Finding("checkpoints", "bad", f"{ck} is missing; {', '.join(open_ws)} cannot resume where "
                           f"they stopped{KEPT}", new_version(open_ws)))  # fmt: skip
    elif ck.is_file():
        try:
            c = connect_read_only(ck, timeout=5)
            check = c.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            threads = {r[0] for r in c.execute("select distinct thread_id from checkpoints")}
            c.close()
            lost = [w for w in open_ws if w not in threads and not any(t.startswith(w + "@") for t in threads)]
            if lost:
                out.append(Finding("checkpoints", "bad", f"no checkpoint for {', '.join(lost)}{KEPT}",
                                   new_version(lost)))  # fmt: skip
            else:
                out.append(Finding("checkpoints", "ok", f"{len(threads)} graph thread(s)"))
        except sqlite3.DatabaseError as exc:
            if "no such table" in str(exc):
                out.append(Finding("checkpoints", "ok", "no graph has checkpointed yet"))
            else:
                out.append(Finding("checkpoints", "bad", f"{ck} is damaged: {exc}{KEPT}", new_version(open_ws) +
                                   "; it moves the damaged file aside"))  # fmt: skip
    return out


def _study(state: Path, plans: list[str]) -> list[Finding]:
    """The campaigns' search studies (``optuna.db``, the sampler's memory): readable, or the way back."""
    db = state / "optuna.db"
    if not db.is_file():
        return []
    try:
        c = connect_read_only(db, timeout=5)
        try:
            check = c.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            cut = c.execute("select count(*) from trials where state = 'RUNNING'").fetchone()[0]
        finally:
            c.close()
    except sqlite3.DatabaseError as exc:
        if "no such table" in str(exc):  # created, killed before its tables: the next start creates them
            return [Finding("search study", "ok", f"{db} holds no study yet")]
        again = " ; ".join(f"kinv campaign {p}" for p in plans)
        return [Finding("search study", "bad", f"{db} is damaged: {exc}", f"mv {db} {db}.damaged ; {again} "
                        "(kinv.db keeps what every screened candidate measured: none is timed again)")]  # fmt: skip
    return [Finding("search study", "ok", f"{db} reads" + (f"; {cut} trial(s) asked and not told (a screening "
                    "running, or one killed: the next kinv campaign asks them again)" if cut else ""))]  # fmt: skip


def _variant(rows: dict, patch: dict) -> str:
    exp = next((e for e in rows.get("experiments", []) if e["id"] == patch.get("experiment")), None)
    return f", {exp['variant']}" if exp and exp.get("variant") else ""


def _way_back(markers: list[dict]) -> str:
    """The exact command that restores the kernel files these live-patch records name (any plan: PLAN)."""
    plans = sorted({m.get("plan_path") for m in markers if m.get("plan_path")})
    return " ; ".join(f"kinv revert --to-plan {p}" for p in plans) or "kinv revert --to-plan PLAN"


def _differs(marker: dict) -> str:
    """How a live file differs from its file of record (the bytes kinv backed up before patching it): '' when
    it does not (the patch was reverted after all)."""
    import hashlib
    import json

    path = Path(marker["path"])
    try:
        live = path.read_bytes()
    except OSError:
        return "is missing"
    if hashlib.sha256(live).hexdigest()[:16] == marker.get("sha_before"):
        return ""
    record = Path(marker.get("backup_path") or "")
    where = f"its file of record (the bytes kinv backed up before patching it, sha {marker.get('sha_before')})"
    try:
        before = record.read_bytes()
    except OSError:
        return f"differs from {where}"
    try:
        a, b = json.loads(before), json.loads(live)
    except ValueError:
        n = sum(1 for x, y in zip(before.splitlines(), live.splitlines()) if x != y) + abs(
            len(before.splitlines()) - len(live.splitlines()))
        return f"differs from {where} in {n} line(s)"
    if isinstance(a, dict) and isinstance(b, dict):
        changes = [f"{k} {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}" for k in [*a, *(k for k in b if k not in a)]
                   if a.get(k) != b.get(k)]  # fmt: skip
        return f"differs from {where}: {', '.join(changes) or 'the same values, other bytes'}"
    return f"differs from {where}"


def _alive(pid) -> bool:
    import os

    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def configs_against_baselines(workstreams: list[dict], plans_dir: Path | None,
                              patches: list[dict] | None = None, experiments: list[dict] | None = None) -> list[Finding]:
    """Each registered kernel's live config: a config adopted with ``kinv adopt`` (its latest adoption, and what
    it was measured against), the baseline of a known plan or workstream, or something else.  A workstream whose
    plan measured its own baseline (``baseline_on_disk: false``) ran beside the file, and is named so."""
    from kinv.agent.tools.files import configs
    from kinv.kernels.adapter import get_adapter, registered
    from kinv.kernels.errors import ConfigError, UnknownKernelError
    from kinv.kernels.launch_config import config_hash, load_config

    exps = {e["id"]: e for e in experiments or []}
    measured = {e["workstream"]: e["config_hash"] for e in experiments or [] if e["kind"] == "baseline"}
    known: dict[str, dict[str, str]] = {}  # kernel -> config hash -> where it is a baseline
    beside: dict[str, dict[str, tuple[str, str | None]]] = {}  # kernel -> file sha -> (ws, its baseline's hash)
    for w in workstreams:
        if w.get("baseline_hash"):
            beside.setdefault(w["kernel"], {})[w["baseline_hash"]] = (w["id"], measured.get(w["id"]))
    adopted: dict[Path, dict] = {}
    for p in patches or []:  # the latest adoption of each file
        if p["state"] == "adopted":
            adopted[Path(p["path"]).resolve()] = p
    for p in sorted((plans_dir or Path("plans")).glob("*.yaml")):
        try:
            from kinv.agent.plan_file import load_plan

            plan, _ = load_plan(p)
        except Exception:  # noqa: BLE001 - a broken plan is not the doctor's finding
            continue
        known.setdefault(plan.adapter.name, {})[config_hash({**plan.baseline, "kernel": plan.adapter.name})] = \
            f"the baseline of {p.name}"
    out = []
    for name in sorted(registered()):
        try:
            adapter = get_adapter(name)
            path = adapter.config_path()
        except UnknownKernelError:
            continue
        if not path.is_file():
            if any(w["kernel"] == name for w in workstreams):  # a kernel this state dir investigated
                out.append(Finding(f"config {name}", "bad", f"{path} is missing", "kinv revert --to-plan PLAN"))
            continue
        try:
            cfg = load_config(path, name)
        except (ConfigError, ValueError) as exc:
            out.append(Finding(f"config {name}", "bad", f"{path} is invalid: {exc}", "kinv revert --to-plan PLAN"))
            continue
        editing = _config_lock_holder(path)
        if editing:  # a live run (of this or another state dir) holds the file: its variant is on disk by design
            out.append(Finding(f"config {name}", "ok", f"{path.name} is being measured by the kinv run of state dir "
                               f"{editing.get('state_dir', '?')} (pid {editing.get('pid', '?')}): a variant may be live "
                               "while it runs; that run restores the file when it ends"))  # fmt: skip
            continue
        h = config_hash({k: v for k, v in cfg.items() if k != "description"})
        file_sha = configs.sha(path)
        last = adopted.get(path.resolve())
        where = None
        if last and last.get("sha_after") == file_sha:
            e = exps.get(last.get("experiment")) or {}
            how = {"confirm": f"; confirmed against the file it replaced in experiment {e.get('id')}",
                   "ab": f"; measured in experiment {e.get('id')}"}.get(e.get("kind"), "")  # fmt: skip
            who = f"{last['workstream']} {e['variant']}" if e.get("variant") else last["workstream"]
            where = f"the config adopted from {who} (kinv adopt, patch #{last['id']}{how})"
        ran = beside.get(name, {}).get(file_sha)
        where = where or known.get(name, {}).get(h)
        if not where and ran and (ran[1] is None or ran[1] == h):
            where = f"{ran[0]}'s baseline" if ran[1] == h else f"the file on disk when {ran[0]} ran"
        if not where and ran:
            where = f"the file on disk when {ran[0]} ran ({ran[0]} measured its plan's baseline, not this file)"
        if where:
            out.append(Finding(f"config {name}", "ok", f"{path.name} is {where}"))
        else:
            from kinv.kernels.launch_config import describe

            out.append(Finding(f"config {name}", "warn", f"{path.name} is {describe(cfg)}, the baseline of no known "
                               "plan or workstream (adopted, or edited by hand?)",
                               "kinv revert --to-plan PLAN to restore a plan's baseline"))  # fmt: skip
    return out


def _config_lock_holder(path: Path) -> dict:
    """Who holds the live config's lock right now ({state_dir, pid}), or {} when no live run does."""
    import fcntl

    from kinv.agent.tools.files import configs

    lock = configs.ConfigFileLock(path, ".")
    if not lock.path.is_file():
        return {}
    with open(lock.path) as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock.holder() or {"state_dir": "?"}
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return {}


def as_dicts(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
