"""The investigation graph: LangGraph StateGraph with a SqliteSaver checkpointer.

Data flow (docs/design.md): setup -> baseline -> noise -> pick -> design ->
[approval] -> apply -> gate -> measure -> revert -> decide -> pick ... ->
closeout.  Nodes are thin: they call the tools (agent/tools/*), the planner
and the stats.  The graph state holds ids and small values only; samples,
verdicts, patches and todos live in kinv.db.  The thread id is the
workstream id, so ``kinv run`` on the same plan resumes where it stopped.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from kinv.agent import faults
from kinv.agent.errors import InvestigationError, PatchError
from kinv.agent.fmt import kv
from kinv.agent.tools.files import configs
from kinv.agent.tools.measure import correctness, envcheck, protocol, reach, sequential
from kinv.agent.tools.runners import resources
from kinv.agent.tools.worker.hashes import harness_hash, kernel_hash, kernel_reference_hash
from kinv.agent.words import Approval
from kinv.agent.workstream import planner
from kinv.agent.workstream.context import (
    Context,
    _baseline_config,
    _baseline_note,
    _compiled_for_approval,
    _config_edit,
    _corr_device,
    _edit_sha,
    _ensure_applied,
    _experiment,
    _failed,
    _failure_kind,
    _needs_approval,
    _profile_step,
    _revert_all,
    _seed,
    _snapshot,
    _source_patch,
    _thresholds,
    recorded,
    sequential_plan,
    todo_reason,
)
from kinv.kernels.devices import get_device
from kinv.kernels.launch_config import config_hash, describe, load_config

APPROVAL_POLICIES = tuple(Approval)


def _merge(old: dict | None, new: dict | None) -> dict:
    """The reducer of ``results``: LangGraph merges what a node returns into what the state holds."""
    return {**(old or {}), **(new or {})}


class State(TypedDict, total=False):
    ws: str
    decision: str
    current: str | None
    exp_id: int | None
    approval_id: str | None
    needs_approval: bool
    decided: Annotated[dict, _merge]  # variant id -> its experiment's id (its verdict is in the store); a node returns only the variant it decided
    results: Annotated[dict, _merge]  # an earlier kinv's checkpoint: variant id -> its result (read for the ids only)
    cancelled: list
    noise_exp: int | None
    bands: dict
    offsets: dict  # level -> SD of the between-arm offset (the A/A's second variance component)
    thresholds: dict
    gpu_s: float
    rounds: int
    budget_exhausted: bool
    report: str | None
    baseline_hashes: dict  # harness, reference, kernel source, snapshot dir: fixed at setup


# --------------------------------------------------------------------------- #
# the nodes: each gets the run's Context from LangGraph (context_schema), never from a closure
# --------------------------------------------------------------------------- #

def setup(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    configs.recover(store)
    live = load_config(ctx.config_path, ctx.adapter.name)
    base = _baseline_config(ctx)
    if config_hash(live) != config_hash(base) and plan.baseline_on_disk:
        last = configs.last_editor(ctx.config_path)
        other = last.get("state_dir") and last["state_dir"] != str(store.dir.resolve())
        where = (f"kinv revert --state-dir {last['state_dir']} (it was last edited by that state dir's run, pid "
                 f"{last.get('pid')})" if other else "kinv revert")  # fmt: skip
        raise InvestigationError(
            f"live config {ctx.config_path} is {describe(live)} but the plan's baseline is {describe(base)}; "
            f"restore it ({where}) or fix the plan"
        )
    store.update_workstream(ws, baseline_hash=configs.sha(ctx.config_path), status="running")
    hashes = state.get("baseline_hashes") or {
        "harness": harness_hash(), "reference": kernel_reference_hash(plan.kernel),
        "kernel": kernel_hash(plan.kernel), "snapshot": str(_snapshot(ctx)),
    }  # fmt: skip
    planner.init_todos(store, plan)
    parent = plan.workstream.parent
    whose = f"campaign {parent}'s incumbent, " if parent and store.campaign(parent) else ""
    ctx.say("setup", message=f"{ws}: baseline {describe(base)} verified on disk" if plan.baseline_on_disk else
            f"{ws}: baseline {describe(base)} from the plan ({whose}never written); the live "
            f"file stays {describe(live)}")  # fmt: skip
    return {"ws": ws, "cancelled": state.get("cancelled", []),
            "baseline_hashes": hashes,
            "gpu_s": state.get("gpu_s", 0.0), "rounds": state.get("rounds", 0),
            "decision": "baseline on disk matches the plan"}  # fmt: skip


def baseline(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    notes = ctx.adapter.workload_notes(plan.workload_spec, plan.baseline)
    derived = "; ".join(n for n in notes if not n.startswith("warning:"))
    finished = f"{derived + '; ' if derived else ''}env {plan.environment} confirmed; correct"
    done = store.done_experiment(ws, planner.todo_id(ws, "baseline"), "baseline", ctx.version)
    if done is not None:  # committed before a kill, never checkpointed: verified already, not again
        planner.finish(store, ws, "baseline", "completed", finished)  # (the kill may have come before this)
        ctx.say("baseline", message=f"baseline already verified (experiment {done['id']}); not repeated")
        return {"decision": "baseline verified"}
    planner.start(store, ws, "baseline")
    levels = ctx.levels()
    for n in notes:
        if n.startswith("warning:"):
            ctx.say("warning", message=n.removeprefix("warning:").strip())
    exp = _experiment(ctx, "baseline", "baseline", "baseline", _baseline_config(ctx))
    assessment = resources.assess(ctx.adapter, _baseline_config(ctx), levels, get_device(plan.device))
    resources.record(store, ws, exp, assessment)
    ctx.backend.warm(plan.kernel, plan.environment, plan.stats.aa_arms)  # the A/A's workers start meanwhile
    from kinv.agent.report.figure import prefetch_plotting

    prefetch_plotting()  # and the close-out's plotting library loads (no sample is being timed yet)
    ctx.backend.experiment = exp
    with ctx.heartbeat(f"baseline: correctness check at {len(levels)} levels ({_corr_device(ctx)})"):
        result = ctx.backend.check(plan.kernel, _baseline_config(ctx), levels, seed=_seed(),
                                   device=_corr_device(ctx), env=plan.environment)  # fmt: skip
    correctness.record(store, ws, exp, result)
    if not result["ok"]:
        raise InvestigationError(f"the baseline itself is incorrect: {result['reason']}")
    arm = ctx.backend.open("baseline", plan.kernel, _baseline_config(ctx), plan.environment)
    try:
        envcheck.check_worker(store, ws, exp, plan.environment, arm.env_seen)
    finally:
        arm.close()
    store.update_experiment(exp, status="done", finished=time.time())
    planner.finish(store, ws, "baseline", "completed", finished)
    ctx.say("baseline", message=f"baseline verified: {derived + ', ' if derived else ''}env confirmed, correct")
    faults.point("node.baseline.committed")  # a kill here re-runs the node: it must find its experiment done
    return {"decision": "baseline verified"}


def noise(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    from kinv.agent.tools.measure import noise

    planner.start(store, ws, "noise")
    done = store.done_experiment(ws, planner.todo_id(ws, "noise"), "noise", ctx.version)
    # a committed A/A (a kill came before the checkpoint) is re-read from its rounds, never measured twice
    exp = state.get("noise_exp") or (done and done["id"]) or _experiment(ctx, "noise", "A/A", "noise",
                                                                          _baseline_config(ctx))  # fmt: skip
    levels = ctx.levels()
    base = _baseline_config(ctx)
    s = plan.stats
    t0 = time.time()
    acc, gpu_s = protocol.run_aa(store, exp, ctx.backend, plan.kernel, base, plan.environment, levels, s.aa_rounds,
                              s.aa_arms, on_round=lambda r: ctx.say("round", phase="noise", round=r + 1,
                                                                     total=s.aa_rounds))  # fmt: skip
    thresholds = _thresholds(ctx)
    bands = protocol.noise_bands(plan, levels, acc)
    store.add_noise(exp, ws, [b.__dict__ for b in bands])
    gpu_total = protocol.Ledger.of(store, [exp]).gpu_s
    store.update_experiment(exp, status="done", rounds=s.aa_rounds, gpu_s=gpu_total,
                            wall_s=time.time() - t0, finished=time.time())  # fmt: skip
    warnings = noise.check_aa(bands)  # HarnessBroken only on evidence that the harness is broken
    for w in warnings:
        ctx.say("warning", message=w)
    outliers = sum(b.outliers for b in bands)
    band = {b.level: b.band for b in bands}
    offsets = {b.level: b.offset_sd for b in bands}
    lo, hi = min(band.values()), max(band.values())
    reason = (f"{s.aa_arms} baseline workers x {s.aa_rounds} rounds: round band ±{lo:.2%}..±{hi:.2%}, "
              f"arm offset SD ≤ {max(offsets.values()):.2%}; {outliers} outlier sample(s) winsorized; "
              f"thresholds fixed by the plan ({min(thresholds.values()):.1%}..{max(thresholds.values()):.1%})"
              + (f"; {len(warnings)} level(s) too noisy to decide at their threshold" if warnings else ""))  # fmt: skip
    planner.finish(store, ws, "noise", "completed", reason)
    ctx.say("noise", message=reason, bands=band)
    faults.point("node.noise.committed")  # a kill here re-runs the node: it re-reads its rounds, times none
    return {"noise_exp": exp, "bands": band, "offsets": offsets, "thresholds": thresholds,
            "gpu_s": state.get("gpu_s", 0) + gpu_s, "decision": reason}  # fmt: skip


def pick(state: State, runtime: Runtime[Context]) -> Command[Literal["design", "closeout"]]:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    results, cancelled = planner.results(store, planner.decided(state)), list(state.get("cancelled", []))
    # the wall budget counts time spent running nodes (kinv.db's history), not time paused for a person
    wall = sum((r["finished"] or 0) - (r["started"] or 0) for r in store.node_runs(ws, ctx.version))
    spent = ("GPU" if state.get("gpu_s", 0) >= plan.budget.gpu_seconds
             else "wall" if wall >= plan.budget.wall_seconds else None)  # fmt: skip
    if spent:
        used = (f"{state.get('gpu_s', 0):.1f} of {plan.budget.gpu_seconds:.0f} GPU s" if spent == "GPU"
                else f"{wall:.0f} of {plan.budget.wall_seconds:.0f} wall s")  # fmt: skip
        for v in plan.variants:
            if v.id not in results and v.id not in cancelled:
                planner.finish(store, ws, v.id, "cancelled", f"{spent} budget spent ({used}) before it could run")
                cancelled.append(v.id)
        ctx.say("budget", message=f"{spent} budget spent ({used}): closing out")
        return Command(goto="closeout", update={"cancelled": cancelled, "budget_exhausted": True,
                                                "decision": f"{spent} budget spent: closing out"})  # fmt: skip
    vid, moot = planner.next_variant(plan, results, set(cancelled))
    for mid, reason in moot.items():
        planner.finish(store, ws, mid, "cancelled", reason)
        ctx.say("moot", message=f"{mid} {reason}")
        cancelled.append(mid)
    if vid is None:
        return Command(goto="closeout", update={"cancelled": cancelled, "decision": "all variants decided"})
    return Command(goto="design", update={"current": vid, "cancelled": cancelled, "exp_id": None,
                                          "approval_id": None, "decision": f"next: {vid}"})


def design(state: State, runtime: Runtime[Context]) -> Command[Literal["approval", "apply", "decide"]]:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    vid = state["current"]
    v = plan.variant(vid)
    planner.start(store, ws, vid)
    cfg = plan.variant_config(v)
    exp = _experiment(ctx, vid, vid, "ab", cfg)
    device = get_device(plan.device)
    levels = ctx.levels()
    base_a = resources.assess(ctx.adapter, _baseline_config(ctx), levels, device)
    var_a = resources.assess(ctx.adapter, cfg, levels, device)
    predicted = resources.predicted_change(base_a, var_a)
    var_a["predicted"] = predicted
    resources.record(store, ws, exp, var_a)
    edit = _config_edit(ctx, cfg)  # the live file's exact bytes -> the exact bytes written while patched
    diff = _baseline_note(ctx, vid, cfg) + edit.diff if edit.diff else ""
    if v.env:  # what the variant changes outside any file: its processes' environment
        diff = "".join(f"environment of {vid}'s processes: {k}={plan.environment.get(k, '(unset)')} -> {k}={val}\n"
                       for k, val in v.env.items()) + diff
    if v.args:  # a command's arguments: the command line its runs get
        lv = levels[0]
        before, after = (" ".join(ctx.adapter.argv(lv, env=e, placeholder_port=True))
                         for e in (plan.environment, plan.variant_env(v)))  # fmt: skip
        diff = f"command line of {vid}'s runs at {lv.key}: {before} -> {after}\n" + diff
    store.update_experiment(exp, diff=diff)
    if not var_a["feasible"]:
        result = {"verdict": "infeasible", "reason": f"infeasible on {plan.device}: {var_a['reason']}",
                  "levels": {}, "exp_id": exp}  # fmt: skip
        store.update_experiment(exp, status="rejected", verdict="infeasible", reason=result["reason"])
        ctx.say("infeasible", message=f"{vid}: {result['reason']} (never patched, never timed)")
        return Command(goto="decide", update={"exp_id": exp, "decided": {vid: exp}})
    if _needs_approval(ctx, cfg, bool(v.source_patch)):
        aid = f"{ws.lstrip('#')}-{vid}-{exp}"
        src = _source_patch(ctx, v)
        full_diff = diff + (("\n" if diff else "") + src[1] if src else "")
        # what a person approves is pinned: the plan's hash and the exact edit; apply refuses anything else.
        # A decision already recorded (a re-run of this node after a kill) is never overwritten.
        shown = ({"smem_max": var_a.get("smem_estimate_max"), "predicted": predicted,
                  **_compiled_for_approval(ctx, cfg, bool(src), levels, plan.variant_env(v))}
                 if ctx.adapter.resource_model else {})  # a whole command has no launch resources to show
        store.add_approval(id=aid, workstream=ws, todo=planner.todo_id(ws, vid), variant=vid,
                           kind="source" if src else "config", diff=full_diff,
                           resources=shown,
                           hypothesis=plan.hypothesis, title=v.title, rationale=v.rationale,
                           plan_hash=ctx.plan_hash, patch_sha=_edit_sha(cfg, src, edit))  # fmt: skip
        ctx.say("approval", message=f"{vid} waits for approval {aid}", approval_id=aid)
        return Command(goto="approval", update={"exp_id": exp, "approval_id": aid, "needs_approval": True,
                                                "decision": f"{vid}: approval {aid} requested"})
    return Command(goto="apply", update={"exp_id": exp, "needs_approval": False,
                                         "decision": f"{vid}: auto-approved ({ctx.approval})"})


def approval(state: State, runtime: Runtime[Context]) -> Command[Literal["apply", "declined"]]:
    # side-effect free: it re-runs from its start when the graph resumes
    answer = interrupt({"approval_id": state["approval_id"], "variant": state["current"]})
    if isinstance(answer, dict) and answer.get("approved"):
        return Command(goto="apply", update={"decision": f"{state['approval_id']} approved"})
    return Command(goto="declined", update={"decision": f"{state['approval_id']} rejected"})


def declined(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, ws = ctx.store, ctx.plan.ws
    vid = state["current"]
    appr = store.approval(state["approval_id"]) or {}
    reason = f"rejected by a person: {appr.get('reason') or 'no reason given'}"
    store.update_experiment(state["exp_id"], status="cancelled", reason=reason)
    planner.finish(store, ws, vid, "cancelled", reason)
    return {"cancelled": list(state.get("cancelled", [])) + [vid], "decision": reason}


def apply(state: State, runtime: Runtime[Context]) -> Command[Literal["gate", "revert"]]:
    ctx = runtime.context
    store, plan = ctx.store, ctx.plan
    vid = state["current"]
    v = plan.variant(vid)
    aid = state.get("approval_id") if state.get("needs_approval") else None
    appr = store.approval(aid) if aid else None
    if appr and appr.get("plan_hash"):
        src = None
        try:
            src = _source_patch(ctx, v)
        except PatchError:
            pass
        now_cfg = plan.variant_config(v)
        edit = _config_edit(ctx, now_cfg)
        now_sha = _edit_sha(now_cfg, src, edit)
        moved = bool(edit.diff) and edit.diff not in (appr.get("diff") or "")  # the approved diff no longer applies
        if appr["plan_hash"] == ctx.plan_hash and appr.get("patch_sha") != now_sha and moved:
            raise InvestigationError(
                f"approval {aid} was given for a diff of {ctx.config_path.name} that no longer applies: the live "
                f"file changed since (now sha {configs.sha(ctx.config_path)}), so what would be written is not what "
                f"was approved. Restore the file (kinv revert --to-plan {ctx.plan_path}), or start over under a new "
                f"version to review the new diff: kinv run {ctx.plan_path} --new-version")  # fmt: skip
        if appr["plan_hash"] != ctx.plan_hash or appr.get("patch_sha") != now_sha:
            raise InvestigationError(
                f"approval {aid} was given for plan sha {appr['plan_hash']} and edit {appr.get('patch_sha')}; the "
                f"plan is now sha {ctx.plan_hash} and {vid}'s edit {now_sha}: what would run is not what was "
                f"approved. Restore the plan, or start over under a new version: kinv run {ctx.plan_path} "
                "--new-version")  # fmt: skip
    try:
        _ensure_applied(ctx, v, state["exp_id"])
    except PatchError as exc:
        res = _failed(store, state, "failed", f"patch failed: {exc}")
        ctx.say("failed", message=f"{vid}: {res['reason']}")
        return Command(goto="revert", update={"decided": {vid: res["exp_id"]},
                                              "decision": res["reason"][:200]})
    what = describe(plan.variant_config(v)) + (f" + source patch {v.source_patch}" if v.source_patch else "") + \
        (" with " + kv(v.env) + " in its processes" if v.env else "")
    ctx.say("patch", message=f"{vid}: patched to {what} (backup kept)")
    return Command(goto="gate", update={"decision": f"patched {what}"})


def gate(state: State, runtime: Runtime[Context]) -> Command[Literal["measure", "revert"]]:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    vid = state["current"]
    _ensure_applied(ctx, plan.variant(vid), state["exp_id"])
    refused = reach.refusal(ctx.adapter, plan.variant(vid), baseline=state["baseline_hashes"]["snapshot"],
                            allowed=lambda line: store.event(ws, "reach.allowed", line, {"variant": vid}))  # fmt: skip
    if refused:  # its source patch reaches for the harness: never run, never timed
        res = _failed(store, state, "incorrect", refused)
        ctx.say("incorrect", message=f"{vid} refused before timing: {refused}")
        return Command(goto="revert", update={"results": {vid: res}, "decision": f"{vid} refused: never timed"})
    live = load_config(ctx.config_path, ctx.adapter.name)
    ctx.backend.experiment = state["exp_id"]
    with ctx.heartbeat(f"{vid}: correctness check at {len(ctx.levels())} levels ({_corr_device(ctx)})"):
        variant = plan.variant(vid)  # the judge imports from the baseline snapshot while a source patch is live
        judge_path = [state["baseline_hashes"]["snapshot"]] if variant.source_patch else None
        result = ctx.backend.check(plan.kernel, live, ctx.levels(), seed=_seed(), device=_corr_device(ctx),
                                   env=plan.variant_env(variant), judge_path=judge_path)  # fmt: skip
    correctness.record(store, ws, state["exp_id"], result)
    if not result["ok"]:
        kind, why = _failure_kind(result)
        res = _failed(store, state, kind, why)
        ctx.say(kind, message=f"{vid} rejected before timing: {why}")
        return Command(goto="revert", update={"decided": {vid: res["exp_id"]},
                                              "decision": f"{vid} {kind}: never timed"})
    return Command(goto="measure", update={"decision": f"{vid} correct"})


def measure(state: State, runtime: Runtime[Context]) -> dict:

    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    vid, exp = state["current"], state["exp_id"]
    variant = plan.variant(vid)
    _ensure_applied(ctx, variant, exp)
    live = load_config(ctx.config_path, ctx.adapter.name)  # the variant is what is on disk
    # while a source patch is live, the baseline arm runs the baseline source snapshot
    base_path = [state["baseline_hashes"]["snapshot"]] if variant.source_patch else None
    levels = ctx.levels()
    var_env = plan.variant_env(variant)  # each arm's processes get their own environment, and are checked in it
    t0 = time.time()
    s = plan.stats
    out = sequential.run(
        store, exp, ctx.backend, plan.kernel, _baseline_config(ctx), live, env=plan.environment, levels=levels,
        thresholds=state["thresholds"], seq=sequential_plan(plan), var_env=var_env, offset_sd=state.get("offsets", {}),
        n_variants=len(plan.variants), base_pythonpath=base_path, names=("baseline", vid), ws=ws,
        gated=True,  # the run's gate nodes checked both arms (the baseline at its start, the variant just now)
        baseline_hashes=state["baseline_hashes"], matrix_fallback=get_device(plan.device).matrix_tflops,
        on_round=lambda r: ctx.say("round", phase=vid, round=r + 1, total=s.max_rounds), t0=t0)  # fmt: skip
    if out.kind is not None:  # no verdict from timing: failed, incorrect, tampered, not measured (maybe void too)
        res = {"verdict": out.verdict, "reason": out.reason, "levels": {}, "exp_id": exp}
        if out.void:
            res["void_reason"] = out.void
        ctx.say("failed", message=f"{vid}: {todo_reason(res)}")
        return {"decided": {vid: exp}, "gpu_s": state.get("gpu_s", 0) + out.spent_s, "decision": todo_reason(res)[:200]}
    seq_res = out.result
    if seq_res.rounds > s.quick_rounds:
        quick = ", ".join(f"{lv.label}:{seq_res.quick_look.get(lv.key)}" for lv in levels if lv.key in seq_res.quick_look)
        ctx.say("escalate", message=f"{vid}: quick look after {s.quick_rounds} rounds ({quick}) left levels "
                                    f"undecided; escalated to {seq_res.rounds} rounds")  # fmt: skip
    res = {"verdict": out.verdict, "reason": out.reason, "exp_id": exp, "rounds": seq_res.rounds,
           "levels": {lv: e.verdict for lv, e in seq_res.effects.items()},
           "effects": {lv: round(e.effect, 5) for lv, e in seq_res.effects.items()}}  # fmt: skip
    ctx.say("verdict", message=f"{vid}: {out.verdict} — {out.reason}")
    return {"decided": {vid: exp},
            "gpu_s": state.get("gpu_s", 0) + out.spent_s, "rounds": state.get("rounds", 0) + seq_res.rounds,
            "decision": f"{vid}: {out.verdict}"}  # fmt: skip


def revert(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    _revert_all(ctx)
    wsrow = store.workstream(ws)
    now_sha, src = configs.sha(ctx.config_path), kernel_hash(plan.kernel)
    if now_sha != wsrow["baseline_hash"] or src != state["baseline_hashes"]["kernel"]:
        raise InvestigationError(f"revert left {ctx.config_path} at {now_sha} and the kernel source at {src}; "
                                 f"the baseline is {wsrow['baseline_hash']} / {state['baseline_hashes']['kernel']}")
    ctx.say("revert", message=f"{state['current']}: reverted; config file sha {now_sha} and kernel source {src} "
                              "match the baseline")  # fmt: skip
    return {"decision": f"reverted to baseline {now_sha}"}


def decide(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    vid = state["current"]
    res = planner.results(store, {vid: state["exp_id"]})[vid]  # the verdict as the store holds it
    planner.finish(store, ws, vid, "completed", todo_reason(res))
    if res["verdict"] in ("mixed", "inconclusive") and "improved" in res.get("levels", {}).values():
        # improved somewhere and not accepted: the variant where it won, the baseline elsewhere
        cond = planner.level_conditional(plan, plan.variant(vid), res.get("levels", {}))
        if cond:
            why = "proposed: mixed verdict" if res["verdict"] == "mixed" else "proposed: improved, not accepted"
            planner.add_follow_up(store, ws, f"{vid}-cond", f"{vid} as a level-conditional config: {describe(cond)}",
                                  why)  # fmt: skip
    return {"decision": f"{vid} closed: {res['verdict']}"}


def closeout(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    store, plan, ws = ctx.store, ctx.plan, ctx.plan.ws
    from kinv.agent.workstream.collect import write_closeout

    planner.start(store, ws, "closeout")
    _revert_all(ctx)
    if plan.profile:  # the profiler's evidence behind each decided verdict, before the close-out cites it
        _profile_step(ctx)
    path = write_closeout(store, plan, state, ctx)
    planner.finish(store, ws, "closeout", "completed", f"close-out at {path}")
    ctx.say("closeout", message=f"close-out written to {path}")
    return {"report": str(path), "decision": "closed out"}


NODES = {
    "setup": setup, "baseline": baseline, "noise": noise, "pick": pick, "design": design, "approval": approval, "declined": declined, "apply": apply, "gate": gate, "measure": measure, "revert": revert, "decide": decide, "closeout": closeout,
}  # fmt: skip
"""Every graph node, by name: module-level functions of (state, runtime), unit-testable one by one."""


def make_nodes(ctx: Context | None = None) -> dict:
    """The graph's nodes by name (the context reaches them through LangGraph's runtime, not a closure)."""
    return dict(NODES)


# --------------------------------------------------------------------------- #
# assembly
# --------------------------------------------------------------------------- #
def build_graph(ctx: Context | None, checkpointer):
    """The compiled graph; a run passes its Context as ``graph.invoke(..., context=ctx)``."""
    g = StateGraph(State, context_schema=Context)
    for name, fn in NODES.items():
        g.add_node(name, recorded(name, fn))
    g.add_edge(START, "setup")
    g.add_edge("setup", "baseline")
    g.add_edge("baseline", "noise")
    g.add_edge("noise", "pick")
    g.add_edge("declined", "pick")
    # apply, gate, pick, design and approval route themselves (Command(goto=...)); a static out-edge beside a
    # Command would make LangGraph follow both (a failed patch then ran the gate anyway and wedged resume)
    g.add_edge("measure", "revert")
    g.add_edge("revert", "decide")
    g.add_edge("decide", "pick")
    g.add_edge("closeout", END)
    return g.compile(checkpointer=checkpointer)

