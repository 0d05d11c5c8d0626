"""Library side of the commands that run things: run a plan, bench, noise.

Each raises a :class:`KinvError` for bad input and for a step that failed (the CLI maps it to its exit code
and one line, in ``kinv.agent.cli.app.main``).  ``run_plan`` returns a :class:`RunOutcome` for the ways a run
ends normally (closed out, already closed, paused for an approval, interrupted and reverted); bench, noise,
kernels, profile and revert return the line they end with (or nothing).  The exit codes are the command
line's: none is decided here.
"""

from __future__ import annotations

import logging
import os
import re
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
    RevertError,
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
    from langgraph.types import Command

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


# --------------------------------------------------------------------------- #
def _plan_and_backend(plan_path, backend, as_json: bool = False):
    """The plan and the backend (its banner: :func:`_banner`, once the caller's inputs are valid)."""
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools import backends
    from kinv.agent.tools.runners import bench

    if backend not in backends.BACKENDS:  # bad input (exit 2); get_backend's BackendError would be a failed step
        raise BadInput(f"--backend {backend!r} is not valid; use {', '.join(backends.BACKENDS)}")
    said = ""
    if plan_path is None:  # no --plan: a registered kernel's example plan, and a phrase saying whose
        from kinv.kernels.adapter import default_plan

        plan_path, said = default_plan()
    plan, _ = load_plan(plan_path)
    be = bench.get_backend(backend, plan.kernel)
    return plan, be, said


def _banner(be, as_json: bool, said: str = "") -> None:
    """Say which backend measures (and which plan, when none was given); callers print it once their inputs are
    valid (under --json it goes to stderr, where bad input must leave exactly one line: the refusal)."""
    import sys

    out = sys.stderr if as_json else sys.stdout
    if said:
        print(said, flush=True, file=out)
    print(be.loud, flush=True, file=out)


def bench_command(plan_path, config_path, variant, backend, samples, rounds, state_dir, as_json, console):
    """``kinv bench``: time one config at the plan's levels, or A/B a variant against it (the sequential A/B with
    every rule that the graph runs, agent/tools/measure/sequential.py, without an A/A's offsets, which it says)."""
    import json

    from kinv.agent import fmt
    from kinv.agent.tools.measure import protocol, stats
    from kinv.agent.tools.runners import bench
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.launch_config import describe, load_config
    from kinv.kernels.tunables import brief_repr

    plan, be, said = _plan_and_backend(plan_path, backend, as_json)
    adapter = plan.adapter
    cfg = load_config(config_path or adapter.ensure_config(), adapter.name)
    cfg = {k: v for k, v in cfg.items() if k != "description"}
    var_cfg = None
    if variant is not None:  # bad input is refused before the store is opened (it would create the state dir)
        patch = {}
        for item in variant.split(","):
            k, _, v = item.partition("=")
            k = k.strip()
            if k not in adapter.spec.names:
                raise BadInput(f"--variant item {brief_repr(item)}: {brief_repr(k)} is not a tunable of "
                               f"{adapter.name}; its tunables: {', '.join(adapter.spec.names)}")  # fmt: skip
            if re.fullmatch(r"[0-9]{1,9}", v.strip()):  # ASCII digits only: no "٨", "0_8" or "+8"
                patch[k] = int(v.strip())
            else:
                raise BadInput(f"--variant item {brief_repr(item)} must be KEY=INT, e.g. "
                               f"{adapter.spec.names[-1]}=2")  # fmt: skip
        try:
            var_cfg = adapter.validate_config({**cfg, **patch})
        except ConfigError as exc:
            raise BadInput(f"--variant {brief_repr(variant)}: {exc}") from None
    lvls = plan.levels()
    env = dict(plan.environment)
    if variant is None:
        be.preflight(plan.kernel, env, lvls, [(("config", plan.kernel, cfg, env), {})])
    else:  # the two arms as the sequential A/B opens them
        be.preflight(plan.kernel, env, lvls, [(("baseline", plan.kernel, cfg, env), {"partner": var_cfg, "role": "base"}),
                                              (("variant", plan.kernel, var_cfg, env), {"partner": cfg})])  # fmt: skip
    _banner(be, as_json, said)
    store = Store(state_dir)
    if variant is None:
        exp = store.new_experiment(kind="bench", variant="config", backend=be.name, config_json=json.dumps(cfg))
        common, short = stats.level_names(lv.key for lv in lvls)
        if not as_json:
            console.print(f"{describe(cfg)}{' at ' + common if common else ''}: median of {samples} samples per level",
                          markup=False)  # fmt: skip
        rows = bench.measure_config(store, exp, be, plan.kernel, cfg, env, lvls, samples,
                                    on_level=None if as_json else lambda m: console.print(_bench_line(m, short),
                                                                                         markup=False))  # fmt: skip
        store.update_experiment(exp, status="done", finished=time.time())
        if as_json:
            print(json.dumps(rows, indent=2))
        return "" if as_json else f"stored as experiment {exp} in {store.path}"
    exp = store.new_experiment(kind="ab", variant=describe(var_cfg), backend=be.name, config_json=json.dumps(var_cfg))
    thresholds = {lv.key: plan.stats.threshold_at(lv.label) for lv in lvls}
    # the sequential A/B with every rule, capped at --rounds; no A/A has measured this pair's offset (said as skipped)
    seq = protocol.sequential_plan(plan.stats, max_rounds=rounds)
    from kinv.agent.tools.measure import sequential
    from kinv.kernels.devices import get_device

    out = sequential.run(store, exp, be, plan.kernel, cfg, var_cfg, env=env, levels=lvls, thresholds=thresholds,
                         seq=seq, matrix_fallback=get_device(plan.device).matrix_tflops)  # fmt: skip
    res = out.result
    if as_json:
        print(json.dumps({"verdict": out.verdict, "reason": out.reason, "rounds": out.rounds, "gpu_s": out.gpu_s,
                          "void": out.void, "skipped": out.skipped, "ceilings": out.ceilings,
                          "effects": {k: e.__dict__ for k, e in res.effects.items()} if res else {}},
                         indent=2, default=str))  # fmt: skip
    else:
        if res is not None:
            common, short = stats.level_names(res.effects)
            if common:
                console.print(f"levels {common}: throughput change [{next(iter(res.effects.values())).conf:.3%} CI]",
                              markup=False)  # fmt: skip
            for k, e in res.effects.items():
                console.print(f"{short[k]:>8s} {fmt.change(e.effect):>7s} {fmt.change_interval(e.ci_low, e.ci_high)} "
                              f"{e.verdict}", markup=False)  # fmt: skip
        for rule in out.skipped:
            console.print(f"rule skipped: {rule}", markup=False)
        console.print(f"{describe(var_cfg)} vs {describe(cfg)}: {out.verdict} after {out.rounds} rounds "
                      f"({out.gpu_s:.2f} GPU s) — {out.reason}", markup=False)  # fmt: skip
    return "" if as_json else f"stored as experiment {exp} in {store.path}"


def _bench_line(m: dict, short: dict) -> str:
    frac = f"{m['frac_copy']:.0%}" if m.get("frac_copy") else "n/a"
    peer = f"  {m['peer']} {m['peer_us']:.1f} µs: {m['vs_peer']:.2f}x" if m.get("peer_us") else ""
    return (f"{short.get(m['level'], m['level']):>8s} {m['us']:9.1f} µs {m['gbps']:7.0f} GB/s {frac:>4s} of copy "
            f"{m['throughput']:13,.{0 if m['throughput'] >= 100 else 2}f} {m.get('throughput_unit', '')}{peer}")  # fmt: skip


def noise_command(plan_path, rounds, backend, state_dir, as_json, console, arms_n: int = 4):
    """``kinv noise``: the A/A the graph runs (protocol.run_aa + protocol.noise_bands), at the plan's levels and
    thresholds."""
    import json

    from kinv.agent import fmt
    from kinv.agent.tools.measure import noise, protocol, stats
    from kinv.kernels.launch_config import load_config

    plan, be, said = _plan_and_backend(plan_path, backend, as_json)
    adapter = plan.adapter
    cfg = {k: v for k, v in load_config(adapter.ensure_config(), adapter.name).items() if k != "description"}
    lvls = plan.levels()
    env = dict(plan.environment)
    be.preflight(plan.kernel, env, lvls, [(("A", plan.kernel, cfg, env), {"replica": j}) for j in range(arms_n)])
    _banner(be, as_json, said)
    store = Store(state_dir)
    exp = store.new_experiment(kind="noise", variant="A/A", backend=be.name)
    acc, gpu_s = protocol.run_aa(store, exp, be, plan.kernel, cfg, dict(plan.environment), lvls, rounds, arms_n)
    bands = protocol.noise_bands(plan, lvls, acc)
    store.add_noise(exp, None, [b.__dict__ for b in bands])
    store.update_experiment(exp, status="done", rounds=rounds, gpu_s=gpu_s)
    if as_json:
        print(json.dumps([b.__dict__ for b in bands], indent=2))
    else:

        common, short = stats.level_names(b.level for b in bands)
        from kinv.agent.report.render import table

        t = table("level", "round band", "offset SD", "widest pair [95% CI]", "out", "thr.", "ok",
                  title=f"A/A noise, {arms_n} workers x {rounds} rounds ({be.name})"
                  + (f"\nlevels {common}" if common else ""))  # fmt: skip
        for b in bands:
            t.add_row(short[b.level], f"±{b.band:.2%}", f"{b.offset_sd:.2%}",
                      f"{fmt.signed(b.effect)} {fmt.interval(b.ci_low, b.ci_high)}", str(b.outliers), f"{b.threshold:.1%}",
                      "yes" if b.equivalent else "NO")  # fmt: skip
        console.print(t)
    for w in noise.check_aa(bands):
        console.print(f"[yellow]warning[/yellow]: {escape(w)}")
    return "" if as_json else f"stored as experiment {exp} in {store.path}"


def kernels_rows() -> list[dict]:
    """Every registered kernel: its tunables, restrictions, level dimensions, unit and config (kinv kernels --json)."""
    from kinv.kernels.adapter import get_adapter, registered
    from kinv.kernels.errors import UnknownKernelError

    rows = []
    for name, ref in sorted(registered().items()):
        try:
            a = get_adapter(name)
        except UnknownKernelError as exc:
            rows.append({"name": name, "ref": ref, "error": str(exc)})
            continue
        rows.append({"name": a.name, "ref": ref, "tunables": {t.name: list(t.values) for t in a.spec.tunables},
                     "restrictions": [r.text for r in a.spec.restrictions], "level_dims": list(a.level_dims),
                     "override_dims": list(a.spec.override_dims),
                     "override_choices": {d: list(v) for d, v in a.spec.override_choices.items()},
                     "throughput_unit": a.throughput_unit, "config": str(a.config_path()),
                     "example_plan": str(a.root() / a.example_plan) if a.example_plan else None})  # fmt: skip
    return rows


def kernels_command(as_json: bool, console) -> str:
    """``kinv kernels``: every registered kernel, its tunables and level dimensions."""
    import json

    rows = kernels_rows()
    if as_json:
        print(json.dumps(rows, indent=2))
        return ""
    from rich.text import Text

    from kinv.agent.report.render import table

    if not console.is_terminal:  # piped: one block per kernel, no table padded to its widest cell
        for r in rows:
            say = [f"{r['name']} ({r['ref']})"]
            if "error" in r:
                say.append(f"  error: {r['error']}")
            else:
                tun = "; ".join(f"{k} " + "/".join(map(str, v)) for k, v in r["tunables"].items()) or "(none)"
                say += [f"  tunables: {tun}",
                        f"  level dimensions: {', '.join(r['level_dims'])}; throughput: {r['throughput_unit']}",
                        f"  example plan: {r['example_plan'] or '(none)'}"]  # fmt: skip
            console.print("\n".join(say), markup=False, highlight=False)
        rows = []
    t = table("kernel", "adapter", "tunables", "level dimensions", "throughput", "example plan",
              title="registered kernels (kinv.kernels entry points; a plan may also name package.module:Class)")
    for r in rows:
        if "error" in r:
            t.add_row(r["name"], r["ref"], Text(r["error"], "red"), "", "", "")
            continue
        tun = "; ".join(f"{k} {'/'.join(map(str, v))}" for k, v in r["tunables"].items())
        t.add_row(r["name"], r["ref"], tun, ", ".join(r["level_dims"]), r["throughput_unit"], r["example_plan"] or "")
    if t.rows:
        console.print(t)
    from kinv.kernels.adapter import default_plan

    try:
        path, _ = default_plan()
        console.print(f"kinv bench, noise and env without --plan use {path}", markup=False, highlight=False)
    except BadInput:
        console.print("no kernel names an example plan: kinv bench, noise and env need --plan", markup=False)
    return ""


def revert_to_plan(plan_path, state_dir: Path, baseline: bool = False) -> str:
    """``kinv revert --to-plan`` (``baseline`` False): the live config of the plan's kernel back to its file of
    record, the shipped bytes (git HEAD when the checkout tracks it, else the copy kinv kept before its first
    write); ``--to-plan-baseline`` (``baseline`` True): the plan's measurement baseline written into the live
    file, asked for by name.  Needs no state dir and creates none; the config lock records ``state_dir``."""
    from kinv.agent.tools.files import config_text, configs, record
    from kinv.kernels.launch_config import config_hash, describe, load_config

    plan, _ = load_plan(plan_path)  # PlanError -> exit 2 in main
    path = plan.adapter.ensure_config()
    with configs.ConfigFileLock(path, state_dir):  # refused while any run edits it
        if not baseline:
            try:
                action, rec = record.restore_file_of_record(path)
            except RevertError as exc:
                raise RevertError(f"{exc}. To write {plan.ws}'s measurement baseline "
                                          f"({describe(plan.baseline)}) instead: kinv revert --to-plan-baseline "
                                          f"{plan_path}") from None  # fmt: skip
            if action == "unchanged":
                return f"{path} already holds its file of record: {rec.source} (file sha {rec.sha})"
            return f"restored {path} to its file of record: {rec.source} (file sha {rec.sha})"
        base = {**plan.baseline, "kernel": plan.adapter.name}
        now = load_config(path, plan.adapter.name) if path.exists() else None
        if now is not None and config_hash(now) == config_hash(base):
            return f"{path} already holds the measurement baseline of {plan.ws} ({describe(base)})"
        before = path.read_bytes() if path.exists() else None
        if before is not None:
            new = config_text.edit_config_text(before.decode("utf-8", errors="replace"), base, plan.adapter.name).encode()
            record.note_kinv_write(path, before, new)  # the shipped bytes stay the file of record
        configs.write_config(path, base)
        got = load_config(path, plan.adapter.name)
        if config_hash(got) != config_hash(base):
            raise RevertError(f"{path} did not verify after the write")
    return (f"wrote the measurement baseline of {plan.ws} into {path} ({describe(base)}, config hash "
                     f"{config_hash(base)}, file sha {configs.sha(path)}); this is not the shipped file: kinv "
                     f"revert --to-plan {plan_path} restores that")  # fmt: skip


def profile_command(exp_id, backend, state_dir, as_json, console):
    """``kinv profile EXP``: the profile step, after the fact, for one decided A/B of a config variant: the baseline
    and the variant under Nsight Compute at the level of the largest effect, stored, and the sentence that explains
    the verdict."""
    import json

    from kinv.agent.report.resources import _profile_lines
    from kinv.agent.report.views import resolve_experiment
    from kinv.agent.tools.runners import profiling

    store = Store(state_dir)
    row = resolve_experiment(store, exp_id)
    if row["kind"] != "ab" or not row.get("verdict"):
        raise BadInput(f"experiment {row['id']} is a {row['kind']} experiment ({row.get('verdict') or row['status']}); "
                       "kinv profile takes a decided A/B of a variant (kinv experiments WS lists them)")  # fmt: skip
    wsrow = store.workstream(row["workstream"]) or {}
    plan, be, said = _plan_and_backend(wsrow.get("plan_path"), backend, as_json)
    v = next((x for x in plan.variants if x.id == row["variant"]), None)
    if v is None or v.source_patch:
        raise BadInput(f"experiment {row['id']} ({row['variant']}) is not a config variant of {wsrow.get('plan_path')}; "
                       "kinv profile takes config variants (a source patch is reverted once it is decided)")  # fmt: skip
    _banner(be, as_json, said)
    notes = profiling.step(store, plan.ws, be, plan.adapter, plan.environment, {**plan.baseline, "kernel": plan.adapter.name},
                         [(row["id"], v.id, plan.variant_config(v), plan.variant_env(v))], plan.levels())  # fmt: skip
    profs = store.profiles(exp_id=row["id"])
    if as_json:
        print(json.dumps({"experiment": row["id"], "profiles": profs, "skipped": notes}, indent=2, default=str))
    else:
        for line in notes:
            console.print(line, markup=False)
        for line in _profile_lines(profs, {lv.key: lv.label for lv in plan.levels()}):
            if line:
                console.print(line, markup=False)
    return "" if as_json else f"{len(profs)} profile(s) stored with experiment {row['id']} in {store.path}"
