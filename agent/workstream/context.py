"""What the workstream graph's nodes share (agent/workstream/graph.py): the run's Context, the helpers that patch, revert
and record, the node recorder that writes kinv.db's history, and LangGraph's SQLite checkpointer."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from langgraph.runtime import Runtime
from langgraph.types import Command

from kinv.agent.errors import PatchError
from kinv.agent.plan import Plan
from kinv.agent.store.db import Store
from kinv.agent.tools.backends import base
from kinv.agent.tools.files import configs
from kinv.agent.tools.runners import bench
from kinv.agent.tools.worker import hashes
from kinv.agent.words import MEASURED_VERDICTS, Approval
from kinv.agent.workstream import planner
from kinv.kernels.adapter import Level, get_adapter
from kinv.kernels.launch_config import config_hash, describe, load_config

RECURSION_LIMIT = 200


@dataclass
class Context:
    """What every node needs and the graph state must not hold."""

    store: Store
    plan: Plan
    plan_path: str
    plan_hash: str
    backend_name: str
    approval: str
    progress: object = None  # callable(kind, **info) for the CLI's progress display
    version: int = 1  # the plan version of the workstream (kinv run --new-version)
    _backend: base.Backend | None = field(default=None, repr=False)
    checkpoints: CheckpointWatch | None = field(default=None, repr=False)  # checked at every node

    @property
    def backend(self) -> base.Backend:
        if self._backend is None:
            self._backend = bench.get_backend(self.backend_name)
            self.say("backend", message=self._backend.loud)
        return self._backend

    @property
    def adapter(self):
        return get_adapter(self.plan.kernel)

    @property
    def config_path(self) -> Path:
        return self.adapter.ensure_config()

    def levels(self) -> list[Level]:
        return self.plan.levels()

    def heartbeat(self, what: str, every: float = 10.0):
        """A context manager for a long step (a correctness check compiling in the interpreter, a worker's
        first compile): says the step started, then a line every ``every`` seconds while it runs."""
        import contextlib
        import threading

        @contextlib.contextmanager
        def beat():
            done = threading.Event()
            t0 = time.time()
            if self.progress:
                self.progress("step", message=f"{what} ...")

            def tick():
                while not done.wait(every):
                    if self.progress:
                        self.progress("heartbeat", message=f"{what}: still running ({time.time() - t0:.0f} s)")

            th = threading.Thread(target=tick, daemon=True, name="kinv-heartbeat")
            th.start()
            try:
                yield
            finally:
                done.set()
                th.join(timeout=1)

        return beat()

    def say(self, kind: str, **info) -> None:
        from kinv.agent import signals

        signals.check()  # a SIGTERM/SIGHUP whose first KeyboardInterrupt was swallowed stops the run here
        msg = info.get("message")
        if msg:
            self.store.event(self.plan.ws, kind, msg, {k: v for k, v in info.items() if k != "message"})
        if self.progress:
            self.progress(kind, **info)




def _baseline_config(ctx: Context) -> dict:
    return {**ctx.plan.baseline, "kernel": ctx.adapter.name}


def source_patch_of(adapter, variant) -> tuple[Path, str] | None:
    """(target file, diff text) of a variant's source patch.  The diff is found beside the plan's project
    (the current directory) or under the adapter's root; it may only target one of the adapter's
    ``kernel_files``, which are relative to the adapter's root."""
    if not variant.source_patch:
        return None
    from kinv.agent.plan import source_patch_text

    root = adapter.root()
    try:
        _path, diff = source_patch_text(adapter, variant.source_patch)
    except ValueError as exc:
        raise PatchError(f"source_patch {exc}") from None
    target = next((ln[4:].strip() for ln in diff.splitlines() if ln.startswith("+++ ")), "")
    target = target[2:] if target.startswith("b/") else target
    if target not in adapter.kernel_files:
        raise PatchError(f"source_patch {variant.source_patch} targets {target!r}; a variant may only patch "
                                 f"the kernel's files: {', '.join(adapter.kernel_files)}")  # fmt: skip
    return root / target, diff


def _source_patch(ctx: Context, variant) -> tuple[Path, str] | None:
    return source_patch_of(ctx.adapter, variant)


def _ensure_applied(ctx: Context, variant, exp_id: int) -> None:
    """The variant is what is on disk: its config and its source patch (re-applied after a recovery)."""
    cfg = ctx.plan.variant_config(variant)
    live = load_config(ctx.config_path, ctx.adapter.name)
    if config_hash(live) != config_hash(cfg):
        configs.patch_config(ctx.store, ctx.config_path, cfg, ctx.plan.ws, exp_id)
    src = _source_patch(ctx, variant)
    if src:
        live_patches = ctx.store.patches(ctx.plan.ws, state="applied")
        if not any(p["path"] == str(src[0].resolve()) and p["experiment"] == exp_id for p in live_patches):
            configs.patch_source(ctx.store, src[0], src[1], ctx.plan.ws, exp_id)


def _experiment(ctx: Context, item: str, variant: str, kind: str, cfg: dict) -> int:
    """The todo's experiment: the one a killed run left 'running' (its committed rounds are kept), or a new one."""
    todo = planner.todo_id(ctx.plan.ws, item)
    row = ctx.store.running_experiment(ctx.plan.ws, todo, kind)
    if row is not None:
        return row["id"]
    return ctx.store.new_experiment(workstream=ctx.plan.ws, todo=todo, variant=variant, kind=kind, version=ctx.version,
                                    backend=ctx.backend.name, config_hash=config_hash(cfg),
                                    base_config_hash=config_hash(_baseline_config(ctx)), config_json=str(cfg))


def _revert_all(ctx: Context) -> None:
    for p in ctx.store.patches(ctx.plan.ws):
        if p["state"] in ("intent", "applied"):
            done = configs.revert(ctx.store, p["id"])
            if done.get("action", "").startswith("restored over a hand edit"):
                ctx.say("warning", message=f"{Path(p['path']).name}: {done['action']}")


def _thresholds(ctx: Context) -> dict[str, float]:
    """The plan's practical threshold at each level: fixed before any data are seen."""
    return {lv.key: ctx.plan.stats.threshold_at(lv.label) for lv in ctx.levels()}



def _edit_sha(cfg: dict, src: tuple | None, edit: configs.ConfigEdit | None = None) -> str:
    """Hash of exactly what a variant changes (what an approval pins): its config, its source diff, and the
    config file's bytes before and after the edit, so a live file that moved since the approval is refused."""
    import hashlib

    from kinv.kernels.launch_config import canonical_json

    files = f"\n{edit.sha_before}->{edit.sha_after}" if edit is not None else ""
    return hashlib.sha256((canonical_json(cfg) + "\n" + (src[1] if src else "") + files).encode()).hexdigest()[:12]


def _config_edit(ctx: Context, cfg: dict) -> configs.ConfigEdit:
    """What patching ``cfg`` writes to the live file, from its exact bytes (what the approval shows)."""
    return configs.plan_config_edit(ctx.config_path, cfg, ctx.adapter.name)


def _baseline_note(ctx: Context, vid: str, cfg: dict) -> str:
    """One line, when the plan measures against a baseline that is not the live file: the diff below it is
    the live file's real replacement while the variant is patched."""
    if ctx.plan.baseline_on_disk:
        return ""
    live = load_config(ctx.config_path, ctx.adapter.name)
    if config_hash(live) == config_hash(_baseline_config(ctx)):
        return ""
    return (f"note: {ctx.plan.ws} measures against its plan's baseline {describe(_baseline_config(ctx))}, not the "
            f"live file's {describe(live)}: while {vid} is patched, the live file is replaced by "
            f"{describe(cfg)}, as below\n")  # fmt: skip


def _needs_approval(ctx: Context, cfg: dict, source_patch: bool) -> bool:
    if ctx.approval == Approval.AUTO:
        return False
    if ctx.approval == Approval.ASK or source_patch:
        return True
    bounds = ctx.plan.allowed_values()
    items = [cfg] + list(cfg.get("overrides", []))
    for item in items:
        for k in ctx.adapter.spec.names:
            if k in item and k in bounds and item[k] not in bounds[k]:
                return True
    return False




def _integrity(store: Store, exp: int, baseline: dict) -> str | None:
    """The sequential A/B's integrity rule (agent/tools/measure/sequential.py)."""
    from kinv.agent.tools.measure.sequential import integrity

    return integrity(store, exp, baseline)


def todo_reason(res: dict) -> str:
    """``verdict: reason`` with the verdict said once (a reason may begin with it already: "incorrect: ...")."""
    verdict, reason = res.get("verdict") or "", res.get("reason") or ""
    if verdict and reason.lower().startswith(verdict.lower() + ":"):
        return reason
    return f"{verdict}: {reason}" if verdict else reason


def _failed(store: Store, state: dict, verdict: str, reason: str, **ledger) -> dict:
    """Record a variant that never got a verdict from timing (patch, compile, crash, wrong, unmeasurable)."""
    store.update_experiment(state["exp_id"], status="rejected", verdict=verdict, reason=reason, **ledger)
    return {"verdict": verdict, "reason": reason, "levels": {}, "exp_id": state["exp_id"]}


def _failure_kind(result: dict) -> tuple[str, str]:
    """Name a failed correctness check (agent/tools/measure/sequential.py says how)."""
    from kinv.agent.tools.measure.sequential import failure_kind

    return failure_kind(result)


def _snapshot(ctx: Context) -> Path:
    """A copy of the baseline kernel package (sources and configs) under the state dir, laid out under its
    dotted name (``snapshots/<kernel hash>/kinv/kernels``); the baseline arm puts it first on PYTHONPATH
    while a variant's source patch is on disk, and its worker proves that it imported the copy (the kernel
    hash it reports must be the snapshot's name)."""
    from kinv.agent.tools.files.snapshot import materialize, package_files

    dest = ctx.store.dir / "snapshots" / hashes.kernel_hash(ctx.plan.kernel)
    return materialize(package_files(ctx.adapter.package_dir()), dest, ctx.adapter.package_name())


def _seed() -> int:
    """Fresh random inputs for every correctness check."""
    import random

    return random.SystemRandom().randrange(1 << 30)


def _corr_device(ctx: Context) -> str:
    """Where the correctness check runs, in the heartbeat's words: a command checks itself wherever it runs."""
    return {"cuda": "cuda", "command": "the command's own run"}.get(ctx.backend.name, "cpu")




def sequential_plan(plan: Plan):
    """The plan's statistics settings as the sequential A/B runs them (agent.tools.protocol.sequential_plan)."""
    from kinv.agent.tools.measure import protocol

    return protocol.sequential_plan(plan.stats)


def _compiled_for_approval(ctx, cfg: dict, source: bool, levels, env: dict | None = None) -> dict:
    """What the person approving sees of the compiler: the baseline and the variant compiled (no timing) by the
    backend where it has a compiler (a GPU) or a record of one (replay); else a note that the figures shown are the
    analytical model's.  A source patch is compiled once it is applied, not before it is approved."""
    if source:
        return {"compiled_note": "a source patch is compiled when it is applied"}
    base = ctx.backend.compiled(ctx.plan.kernel, _baseline_config(ctx), ctx.plan.environment, levels)
    var = ctx.backend.compiled(ctx.plan.kernel, cfg, env or ctx.plan.environment, levels)
    if not base or not var:
        return {"compiled_note": f"no compiler on the {ctx.backend.name} backend"}
    compiled = {lv.key: {"base": base.get(lv.key), "variant": var.get(lv.key)} for lv in levels}
    return {"compiled": compiled, "compiled_on": ctx.backend.name}


def _profile_step(ctx) -> None:
    """Profile the baseline and the decided config variants (a source patch is reverted by now: it is not)."""
    from kinv.agent.tools.runners import profiling

    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    decided = []
    for e in store.experiments(ws):
        if e["kind"] != "ab" or e["verdict"] not in MEASURED_VERDICTS or int(e.get("version") or 1) != ctx.version:
            continue
        v = plan.variant(e["variant"]) if e["variant"] in {x.id for x in plan.variants} else None
        if v is None or v.source_patch:
            continue
        decided.append((e["id"], v.id, plan.variant_config(v), plan.variant_env(v)))
    notes = profiling.step(store, ws, ctx.backend, ctx.adapter, plan.environment, _baseline_config(ctx), decided,
                         ctx.levels())  # fmt: skip
    for line in notes:
        store.event(ws, "profile.skipped", line, {})
        ctx.say("profile", message=line)



def recorded(name: str, fn):
    """``fn`` as a graph node whose every run is written to kinv.db's history (node, decision, outcome):
    ``kinv history`` reads that, never LangGraph's private checkpoint tables."""
    import functools

    from langgraph.errors import GraphInterrupt

    @functools.wraps(fn)  # keeps the return annotation: LangGraph reads a Command node's destinations from it
    def node(state: dict, runtime: Runtime[Context]):
        ctx = runtime.context
        t0 = time.time()
        ctx.store.check_intact()  # kinv.db deleted under the run: stop loudly, never close out into nowhere
        if ctx.checkpoints is not None:  # and the graph's checkpoints, or the run could never resume
            ctx.checkpoints.check()
        try:
            out = fn(state, runtime)
        except GraphInterrupt:
            ctx.store.add_node_run(ctx.plan.ws, ctx.version, name, t0, _waiting(ctx), "paused")
            raise
        except BaseException as exc:
            ctx.store.add_node_run(ctx.plan.ws, ctx.version, name, t0, f"{type(exc).__name__}: {exc}"[:300], "error")
            raise
        update = out.update if isinstance(out, Command) else out
        decision = (update or {}).get("decision") if isinstance(update, dict) else None
        goto = out.goto if isinstance(out, Command) else None
        ctx.store.add_node_run(ctx.plan.ws, ctx.version, name, t0, decision and str(decision)[:300],
                               f"-> {goto}" if isinstance(goto, str) and goto else "ok")  # fmt: skip
        return out

    return node


def _waiting(ctx: Context) -> str:
    pending = ctx.store.approvals(status="pending", ws_id=ctx.plan.ws)
    return f"waiting for approval {pending[-1]['id']}" if pending else "interrupted"




SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass
class CheckpointWatch:
    """The checkpoint file a run opened.  Deleted, replaced or overwritten under the run, it is noticed at the next
    graph step: the checkpointer's connection still holds the database it opened, so its checkpoints are copied out
    (SQLite's backup) and put back in place once the run has stopped and closed that connection; the run stops
    resumable.  Without that copy, kinv doctor names the way on (a new version; kinv.db keeps every decision)."""

    path: Path
    identity: tuple[int, int]
    saver: object = None  # the SqliteSaver: its connection and its lock
    ws: str = ""
    plan_path: str = "PLAN"
    rescued: Path | None = None

    @classmethod
    def of(cls, store: Store, saver, ws: str, plan_path: str = "PLAN") -> CheckpointWatch:
        st = store.checkpoints_path.stat()
        return cls(store.checkpoints_path, (st.st_dev, st.st_ino), saver, ws, plan_path)

    def check(self) -> None:
        from kinv.agent.errors import StateDamaged

        try:
            st = self.path.stat()
            with open(self.path, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
            why = ("was replaced" if (st.st_dev, st.st_ino) != self.identity else
                   "was overwritten (no SQLite header)" if st.st_size and head != SQLITE_HEADER else "")  # fmt: skip
        except OSError:
            why = "was deleted"
        if not why:
            return
        if why != "was overwritten (no SQLite header)" and self._rescue():
            raise StateDamaged(f"{self.path} {why} during the run: the run stops here, its kernel files restored, and "
                               f"its checkpoints are put back from the run's open copy: continue with kinv resume "
                               f"{self.ws.lstrip('#')}")  # fmt: skip
        raise StateDamaged(f"{self.path} {why} during the run: the run stops here, its kernel files restored; kinv.db "
                           "and the journal keep every decision and sample so far; kinv doctor names the way on "
                           f"(kinv run {self.plan_path} --new-version)")  # fmt: skip

    def _rescue(self) -> bool:
        """Copy what the run's open connection holds to a file beside the lost one (put in place by ``settle``)."""
        import sqlite3

        out = self.path.with_name(f"{self.path.name}.rescued-{os.getpid()}")
        try:
            dest = sqlite3.connect(str(out))
            try:
                with self.saver.lock:
                    self.saver.conn.backup(dest)
            finally:
                dest.close()
        except (sqlite3.Error, OSError, AttributeError):
            out.unlink(missing_ok=True)
            return False
        self.rescued = out
        return True

    def settle(self, store: Store) -> None:
        """Once the run has stopped: close the checkpointer's connection (it writes into the lost file, and its
        WAL goes with it), move whatever now stands at the path aside (never deleted) and put the copy there."""
        if self.rescued is None or not self.rescued.is_file():
            return
        self.saver.conn.close()
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{self.path}{suffix}")
            if part.exists():
                part.rename(f"{self.path}.replaced-{int(time.time())}{suffix}")
        os.replace(self.rescued, self.path)
        store.event(None, "checkpoints.restored", f"{self.path} was lost during the run; put back from its open copy")
        self.rescued = None


def open_checkpointer(store: Store, plan_path: str = "PLAN", move_damaged: bool = False):
    """LangGraph's SQLite checkpointer on ``<state>/checkpoints.db``.  A damaged file is refused with one line
    naming it and the fix (``kinv run PLAN --new-version``); that fix (``move_damaged``) moves it aside, keeping
    it, and starts a fresh one."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    from kinv.agent.errors import StateDamaged

    path = store.checkpoints_path
    if path.is_file() and path.stat().st_size > 0:
        try:
            probe = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            try:
                check = probe.execute("PRAGMA quick_check").fetchone()[0]
            finally:
                probe.close()
            if check != "ok":
                raise sqlite3.DatabaseError(check)
        except sqlite3.DatabaseError as exc:
            if not move_damaged:
                raise StateDamaged(f"{path} is damaged ({exc}): the graph cannot resume where it stopped; start the "
                                   f"workstream again as a new version (the damaged file is moved aside, the old "
                                   f"version stays in history): kinv run {plan_path} --new-version") from None  # fmt: skip
            aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                part = Path(f"{path}{suffix}")
                if part.exists():
                    part.rename(f"{aside}{suffix}")
            store.event(None, "checkpoints.damaged", f"{path} was damaged ({exc}); moved aside to {aside}")
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    return SqliteSaver(conn)


def thread_id(ws: str, version: int | None = 1) -> str:
    """The checkpoint thread of a workstream's plan version (version 1 keeps the bare id)."""
    return ws if not version or version <= 1 else f"{ws}@v{version}"


def run_config(ws: str, version: int | None = 1) -> dict:
    return {"configurable": {"thread_id": thread_id(ws, version)}, "recursion_limit": RECURSION_LIMIT}
