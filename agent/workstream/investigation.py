"""Library side of ``kinv run``: a plan run through the investigation graph, resumed where it stopped.

Each raises a :class:`KinvError` for bad input and for a step that failed (the CLI maps it to its exit code
and one line, in ``kinv.agent.cli.app.main``).  ``run_plan`` returns a :class:`RunOutcome` for the ways a run
ends normally (closed out, already closed, paused for an approval, interrupted and reverted).  bench, noise,
kernels, profile and revert are agent/workstream/commands.py.  The exit codes are the command
line's: none is decided here.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.markup import escape

from kinv.agent.errors import (
    BackendError,
    EnvMismatch,
    HarnessBroken,
    InvestigationError,
    LockedElsewhere,
    StateDamaged,
)
from kinv.agent.plan_file import load_plan
from kinv.agent.store.db import Store
from kinv.agent.store.state import state_dir as state_path
from kinv.agent.workstream.context import CheckpointWatch, Context, open_checkpointer, run_config
from kinv.agent.workstream.graph import APPROVAL_POLICIES, build_graph
from kinv.kernels.errors import BadInput, KinvError

log = logging.getLogger(__name__)


RunEnd = Literal["closed", "paused", "interrupted"]
"""How a run ends normally: closed out (or already closed), waiting for an approval, or stopped by a signal
(kernel files reverted, resumable)."""


@dataclass(frozen=True)
class RunOutcome:
    """How a workstream's run ended normally (``end``), ``message`` the one line said at the end (with the
    command that continues, where there is one) and ``workstream`` its id."""

    end: RunEnd
    message: str
    workstream: str

    @property
    def closed(self) -> bool:
        return self.end == "closed"


def _on_signals():
    """SIGTERM and SIGHUP end a run the way Ctrl-C does (revert, mark interrupted, exit 130); returns a restorer."""
    from kinv.agent import signals

    return signals.install()


def _progress(console):
    def show(kind, **info):
        if kind == "round":  # a TTY redraws one line; a pipe or a log gets plain lines, no carriage returns
            line = f"  [{info['phase']}] round {info['round']}/{info['total']}"
            console.print(line, end="\r" if console.is_terminal else "\n", markup=False)
        elif info.get("message"):
            # markup=False: a level-conditional config's label ("[b<=1: BT64]") is text, not a rich style tag
            console.print(f"• {info['message']}", markup=False, highlight=False)

    return show


def run_plan(plan_path: str, backend: str, approval: str, state_dir, console, new_version: bool = False,
             backend_obj=None) -> RunOutcome:  # fmt: skip
    """``kinv run``: the workstream's graph from its plan.  ``backend_obj`` (a campaign's Ray backend) measures
    in place of a backend made from the name ``backend``.  Returns how the run ended; raises a
    :class:`BadInput` (exit 2, nothing created before the store is opened) for input it cannot use, and
    another :class:`KinvError` (exit 1) for a step that failed."""
    try:
        out = _run_plan(plan_path, backend, approval, state_dir, console, new_version, backend_obj)
    except KinvError as exc:
        if not isinstance(exc, BadInput):  # bad input leaves no trace, in the log neither
            log.info("run %s ended: %s: %s", plan_path, type(exc).__name__, _first_line(exc))
        raise
    log.info("run %s ended: %s: %s", plan_path, out.end, out.message)
    return out


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _run_plan(plan_path: str, backend: str, approval: str, state_dir, console, new_version: bool,
              backend_obj) -> RunOutcome:  # fmt: skip
    from kinv.agent.tools import backends
    from kinv.agent.tools.files import configs
    from kinv.agent.tools.runners import bench
    from kinv.kernels.launch_config import load_config

    if approval not in APPROVAL_POLICIES:
        raise BadInput(f"--approval {approval!r} is not valid; use {', '.join(APPROVAL_POLICIES)}")
    if backend not in backends.BACKENDS:
        raise BadInput(f"--backend {backend!r} is not valid; use {', '.join(backends.BACKENDS)}")
    plan, plan_hash = load_plan(plan_path)  # PlanError -> exit 2 in main
    if plan.campaign is not None and not plan.variants:
        raise BadInput(f"{plan_path} is a campaign plan (no variants of its own): run it with kinv campaign {plan_path}")
    # bad input is refused before the store is opened (it would create the state dir): the backend must
    # serve the plan's levels and environment, and a first run's live config must be a valid config
    be = backend_obj
    if be is None:
        started_on = _started_on(state_dir, plan.ws, version_kept=not new_version)
        if started_on and backend not in ("auto", started_on):
            raise BadInput(_other_backend(backend, plan.ws, started_on))
        backend = started_on or backend  # a resume checks and builds the backend it continues on
        if backend == "auto" and plan.kernel == "command":  # a command plan is measured by running it
            backend = "command"
        be = bench.get_backend(backend, plan.kernel)  # NoDevice, NoRecording: bad input, exit 2 in main
        be.preflight(plan.kernel, dict(plan.environment), plan.levels())
    if hasattr(be, "log_dir"):  # the command backend keeps every run's output in this run's state dir
        be.log_dir = state_path(state_dir) / "commands"
    if not (state_path(state_dir) / "kinv.db").exists():
        load_config(plan.adapter.ensure_config(), plan.adapter.name)  # ConfigError: exit 2 in main
    store = Store(state_dir)
    ws = plan.ws
    log.info("run %s (%s): backend %s, approval %s%s", plan_path, ws, be.name if be else backend, approval,
             ", new version" if new_version else "")
    # One writer per workstream, and one per kernel file (two workstreams patch the same config).
    # Recovery runs only once both locks are held, so it can never revert a live run's patch.
    kernel_lock = f"kernel:{plan.kernel}"
    store.acquire_lock(ws, os.getpid())
    try:
        store.acquire_lock(kernel_lock, os.getpid())
    except BaseException:
        store.release_lock(ws, os.getpid())
        raise
    restore_signals = _on_signals()
    file_lock = configs.ConfigFileLock(plan.adapter.ensure_config(), store.dir)
    try:
        file_lock.__enter__()
    except LockedElsewhere:  # a failed step (exit 1), raised as it is
        restore_signals()
        store.release_lock(kernel_lock, os.getpid())
        store.release_lock(ws, os.getpid())
        raise
    ctx = None
    try:
        for d in configs.recover(store):
            if d["action"].startswith("restored over a hand edit"):
                console.print("[yellow]warning[/yellow]: " + escape(f"{Path(d['path']).name} {d['action']}"))
        row = store.workstream(ws)
        version = int((row or {}).get("version") or 1)
        row, version = _new_version(store, row, version, plan_path, plan_hash, new_version, console)
        started_on = _run_backend(store, row, version)
        if started_on and backend not in ("auto", started_on):
            raise BadInput(_other_backend(backend, ws, started_on))
        backend = started_on or backend
        store.upsert_workstream({
            "id": ws, "parent": plan.workstream.parent, "parent_title": plan.workstream.parent_title,
            "title": plan.workstream.title, "hypothesis": plan.hypothesis, "kernel": plan.kernel,
            "plan_path": str(Path(plan_path).resolve()), "plan_hash": plan_hash, "plan_json": plan.model_dump_json(),
            "status": row["status"] if row else "open", "backend": backend, "approval": approval, "version": version,
        })  # fmt: skip
        ctx = Context(store=store, plan=plan, plan_path=str(plan_path), plan_hash=plan_hash, backend_name=backend,
                      approval=approval, progress=_progress(console), version=version, _backend=be)  # fmt: skip
        if backend_obj is None:
            ctx.say("backend", message=be.loud)  # which backend measures, loudly (auto picks one)
        else:
            ctx.say("backend", message=backend_obj.describe())
            backend_obj.on_loss = lambda loss: ctx.say("executor-loss", message=loss)  # into the close-out
        console.print(f"[bold]{escape(ws)}[/bold] {escape(plan.workstream.title)}"
                      + (f" (plan version {version})" if version > 1 else ""))  # fmt: skip
        _ = ctx.backend  # resolves auto and says which, loudly
        store.update_workstream(ws, backend=ctx.backend.name)  # what a resume continues on
        saver = open_checkpointer(store, str(plan_path), move_damaged=new_version)
        graph = build_graph(ctx, saver)
        ctx.checkpoints = CheckpointWatch.of(store, saver, ws, str(plan_path))
        cfg = run_config(ws, version)
        return _invoke(graph, cfg, ctx, row, version, plan_path, console, state_dir)
    except (InvestigationError, EnvMismatch, HarnessBroken, BackendError) as exc:
        store.event(ws, "stopped", str(exc))  # raised on, with its exit code (NoRecording, NoDevice: bad input)
        raise
    except KeyboardInterrupt as exc:
        from kinv.agent import signals

        signals.handled()
        how = getattr(exc, "signame", "SIGINT")
        configs.recover(store)
        store.update_workstream(ws, status="interrupted")
        store.event(ws, "interrupted", f"{how}: stopped; every kernel file restored to its baseline")
        from kinv.agent.ids import continue_command

        return RunOutcome("interrupted", f"interrupted ({how}): kernel files restored, {ws} marked "
                          f"interrupted; continue with: {continue_command(store, ws, state_dir)}", ws)  # fmt: skip
    finally:
        restore_signals()
        configs.recover(store)  # never leave a kernel file patched, whatever happened
        if ctx is not None and ctx.checkpoints is not None:
            ctx.checkpoints.settle(store)  # checkpoints lost under the run: put back from its open copy
        if hasattr(be, "servers"):  # a command plan's servers stop with the run
            be.servers.close()
        file_lock.__exit__(None, None, None)
        store.release_lock(kernel_lock, os.getpid())
        store.release_lock(ws, os.getpid())


def _new_version(store: Store, row: dict | None, version: int, plan_path, plan_hash: str, new_version: bool,
                 console) -> tuple[dict | None, int]:  # fmt: skip
    """A changed plan under the same workstream id: refused unless ``new_version``, which keeps the old version (and
    its close-out, renamed) in history and starts the next.  Returns the workstream's row and version to run."""
    ws = row["id"] if row else None
    if row and row.get("plan_hash") and (row["plan_hash"] != plan_hash or new_version):
        if not new_version:
            raise BadInput(
                f"{ws} was run from plan sha {row['plan_hash']} ({row.get('plan_path')}); {plan_path} now hashes "
                f"{plan_hash}: run it as a new version with `kinv run {plan_path} --new-version` (history keeps "
                "both), or restore the plan")  # fmt: skip
        if row.get("report_path") and Path(row["report_path"]).is_file():
            old = Path(row["report_path"])
            kept = old.with_name(old.name.replace("-closeout", f"-v{version}-closeout"))
            for f in (old, old.with_suffix(".png")):
                if f.is_file():
                    f.rename(f.with_name(f.name.replace("-closeout", f"-v{version}-closeout")))
            if kept.is_file():  # its plot link follows the plot's new name, not the next version's plot
                png = old.with_suffix(".png").name
                kept.write_text(kept.read_text().replace(f"]({png})", f"]({kept.with_suffix('.png').name})"))
            # history points at the renamed file: the next version's close-out writes the old path
            store.update_workstream(ws, report_path=str(kept))
        version = store.archive_version(ws)
        row = store.workstream(ws)
        console.print(f"{ws}: plan version {version - 1} kept in history; starting version {version}")
    return row, version


def _invoke(graph, cfg: dict, ctx: Context, row: dict | None, version: int, plan_path, console,
            state_dir) -> RunOutcome:  # fmt: skip
    """Run the graph from where its checkpoints stand: an approval answered or still pending, a close-out already
    written, a checkpoint to resume, or a first start (refused when kinv.db has work its checkpoints lost)."""
    from langgraph.types import Command

    store, ws = ctx.store, ctx.plan.ws
    snap = graph.get_state(cfg)
    t0 = time.time()
    # durability="sync": a step's checkpoint is on disk before the next step writes anything
    if snap.next and "approval" in snap.next:
        aid = snap.values.get("approval_id")
        appr = store.approval(aid) or {}
        if appr.get("status") == "pending":
            return _paused(store, aid, console, state_dir, ws)
        resume = Command(resume={"approved": appr.get("status") == "approved"})
        result = graph.invoke(resume, cfg, context=ctx, durability="sync")
    elif snap.values.get("report"):  # a stop after the close-out was written left it marked interrupted
        store.update_workstream(ws, status="closed", report_path=snap.values["report"],
                                closed=(row or {}).get("closed") or time.time())  # fmt: skip
        return RunOutcome("closed", f"{ws} is already closed out: {snap.values['report']}", ws)
    elif snap.metadata is not None:  # a checkpoint exists: resume it, never begin again
        # next is empty when a kill fell between a task's saved writes and its step's checkpoint
        pending = snap.next or tuple(t.name for t in snap.tasks)
        console.print(f"resuming {ws} at {', '.join(pending) or 'its last checkpoint'}")
        result = graph.invoke(None, cfg, context=ctx, durability="sync")
    else:
        # a campaign's screening runs before the workstream's graph starts: it is not the graph's work
        ran = [e for e in store.experiments(ws) if int(e.get("version") or 1) == version and e["kind"] != "screen"]
        if ran and row and row.get("status") == "closed" and row.get("report_path"):
            return RunOutcome("closed", f"{ws} is already closed out: {row['report_path']}", ws)
        if ran:  # kinv.db has this version's work, the checkpoints do not: never start over silently
            raise StateDamaged(f"the graph checkpoints of {ws} are missing from {store.checkpoints_path} although "
                               f"kinv.db holds {len(ran)} of its experiments (status {row['status'] if row else '?'}"
                               f"): kinv cannot resume where it stopped. Start over as a new version (the old one "
                               f"stays in history): kinv run {plan_path} --new-version")  # fmt: skip
        result = graph.invoke({"ws": ws}, cfg, context=ctx, durability="sync")
    if "__interrupt__" in result:
        return _paused(store, result.get("approval_id") or graph.get_state(cfg).values.get("approval_id"),
                       console, state_dir, ws)  # fmt: skip
    store.check_intact()  # the close-out's records must be in the kinv.db a person will read
    console.print(f"closed out in {time.time() - t0:.1f} s")
    return RunOutcome("closed", f"close-out: {result.get('report')}", ws)


def _other_backend(backend: str, ws: str, started_on: str) -> str:
    return (f"--backend {backend}: {ws} started on the {started_on} backend and continues there (one A/B never "
            f"mixes backends); leave --backend out, or give --backend {started_on}")


def _started_on(state_dir, ws: str, version_kept: bool) -> str | None:
    """The backend an unfinished run of ``ws`` measured on, read before anything is opened for writing (None
    without a state dir, or when a new plan version starts afresh)."""
    if not version_kept or not (state_path(state_dir) / "kinv.db").exists():
        return None
    store = Store(state_dir)
    row = store.workstream(ws)
    return _run_backend(store, row, int((row or {}).get("version") or 1))


def _run_backend(store: Store, row: dict | None, version: int) -> str | None:
    """The backend an unfinished run of this plan version measured on (its experiments say), or None when it
    has measured nothing yet or is closed: a resumed run goes on there."""
    if not row or row.get("status") == "closed":
        return None
    for e in store.experiments(row["id"]):
        if int(e.get("version") or 1) == version and e.get("backend") in ("cuda", "replay"):
            return e["backend"]
    return None


def _paused(store: Store, aid: str, console, state_dir, ws: str) -> RunOutcome:
    import json

    appr = store.approval(aid) or {}
    console.print("[bold yellow]paused[/bold yellow]: " + escape(f"approval {aid} for {appr.get('variant')} is pending"))
    console.print(appr.get("diff") or "", markup=False, highlight=False)
    from kinv.agent.report.render import predicted_resources

    predicted_resources(console, json.loads(appr.get("resources") or "{}"))
    from kinv.agent.ids import continue_command, state_flag

    sd = state_flag(state_dir)  # every command of the hint runs as printed, against this state dir
    return RunOutcome("paused", f"waiting for approval {aid}: kinv approve {aid}{sd}  |  kinv reject {aid} "
                      f"--reason ...{sd}; then {continue_command(store, appr.get('workstream') or ws, state_dir)}",
                      ws)  # fmt: skip
