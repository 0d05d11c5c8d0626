"""Library side of the commands that run things: run a plan, bench, noise.

The CLI calls these and turns their (exit code, message) into an exit.
"""

from __future__ import annotations

import os
import time

from agent.graph import APPROVAL_POLICIES, Context, InvestigationError, build_graph, open_checkpointer, run_config
from agent.models import load_plan
from agent.store import Store

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_PAUSED = 0, 1, 2, 3


def _progress(console):
    def show(kind, **info):
        if kind == "round":
            console.print(f"  [{info['phase']}] round {info['round']}/{info['total']}", end="\r")
        elif info.get("message"):
            console.print(f"• {info['message']}")

    return show


def run_plan(plan_path: str, backend: str, approval: str, state_dir, console) -> tuple[int, str]:
    from langgraph.types import Command

    from agent import stats
    from agent.tools import bench, configs, envcheck

    if approval not in APPROVAL_POLICIES:
        return EXIT_BAD_INPUT, f"--approval {approval!r} is not valid; use {', '.join(APPROVAL_POLICIES)}"
    if backend not in bench.BACKENDS:
        return EXIT_BAD_INPUT, f"--backend {backend!r} is not valid; use {', '.join(bench.BACKENDS)}"
    plan, plan_hash = load_plan(plan_path)  # PlanError -> exit 2 in main
    store = Store(state_dir)
    ws = plan.ws
    # One writer per workstream, and one per kernel file (two workstreams patch the same config).
    # Recovery runs only once both locks are held, so it can never revert a live run's patch.
    kernel_lock = f"kernel:{plan.kernel}"
    store.acquire_lock(ws, os.getpid())
    try:
        store.acquire_lock(kernel_lock, os.getpid())
    except BaseException:
        store.release_lock(ws, os.getpid())
        raise
    try:
        configs.recover(store)
        row = store.workstream(ws)
        store.upsert_workstream({
            "id": ws, "parent": plan.workstream.parent, "parent_title": plan.workstream.parent_title,
            "title": plan.workstream.title, "hypothesis": plan.hypothesis, "kernel": plan.kernel,
            "plan_path": str(plan_path), "plan_hash": plan_hash, "plan_json": plan.model_dump_json(),
            "status": row["status"] if row else "open", "backend": backend, "approval": approval,
        })  # fmt: skip
        ctx = Context(store=store, plan=plan, plan_path=str(plan_path), plan_hash=plan_hash, backend_name=backend,
                      approval=approval, progress=_progress(console))  # fmt: skip
        console.print(f"[bold]{ws}[/bold] {plan.workstream.title}")
        _ = ctx.backend  # resolves auto and says which, loudly
        graph = build_graph(ctx, open_checkpointer(store))
        cfg = run_config(ws)
        snap = graph.get_state(cfg)
        t0 = time.time()
        # durability="sync": a step's checkpoint is on disk before the next step writes anything
        if snap.next and "approval" in snap.next:
            aid = snap.values.get("approval_id")
            appr = store.approval(aid) or {}
            if appr.get("status") == "pending":
                return _paused(store, aid, console)
            resume = Command(resume={"approved": appr.get("status") == "approved"})
            result = graph.invoke(resume, cfg, durability="sync")
        elif snap.values.get("report"):
            return EXIT_OK, f"{ws} is already closed out: {snap.values['report']}"
        elif snap.metadata is not None:  # a checkpoint exists: resume it, never begin again
            # next is empty when a kill fell between a task's saved writes and its step's checkpoint
            pending = snap.next or tuple(t.name for t in snap.tasks)
            console.print(f"resuming {ws} at {', '.join(pending) or 'its last checkpoint'}")
            result = graph.invoke(None, cfg, durability="sync")
        else:
            result = graph.invoke({"ws": ws}, cfg, durability="sync")
        if "__interrupt__" in result:
            return _paused(store, result.get("approval_id") or graph.get_state(cfg).values.get("approval_id"),
                           console)  # fmt: skip
        console.print(f"closed out in {time.time() - t0:.1f} s")
        return EXIT_OK, f"close-out: {result.get('report')}"
    except (InvestigationError, envcheck.EnvMismatch, stats.HarnessBroken, bench.BackendError) as exc:
        store.event(ws, "stopped", str(exc))
        return (EXIT_BAD_INPUT if isinstance(exc, bench.NoRecording) else EXIT_FAIL), str(exc).splitlines()[0]
    finally:
        configs.recover(store)  # never leave a kernel file patched, whatever happened
        store.release_lock(kernel_lock, os.getpid())
        store.release_lock(ws, os.getpid())


def _paused(store: Store, aid: str, console) -> tuple[int, str]:
    import json

    appr = store.approval(aid) or {}
    console.print(f"[bold yellow]paused[/bold yellow]: approval {aid} for {appr.get('variant')} is pending")
    console.print(appr.get("diff") or "")
    from agent.render import predicted_resources

    predicted_resources(console, json.loads(appr.get("resources") or "{}"))
    ws = (appr.get("workstream") or "").lstrip("#")
    return EXIT_PAUSED, f"waiting for approval {aid}: kinv approve {aid}  |  kinv reject {aid} --reason ...; then kinv resume {ws}"


# --------------------------------------------------------------------------- #
def bench_command(config_path, variant, levels, contexts, shapes, backend, samples, rounds, state_dir, as_json, console):
    import json

    from agent import stats
    from agent.tools import bench
    from kernels.adapter import Level, get_adapter
    from kernels.launch_config import describe, load_config, validate_config

    be = bench.get_backend(backend)
    print(be.loud, flush=True)
    adapter = get_adapter("mla_decode")
    cfg = load_config(config_path or adapter.config_path(), "mla_decode")
    cfg = {k: v for k, v in cfg.items() if k != "description"}
    default_ctx, default_shapes = ("4096,16384", "v3,v4flash") if be.name == "cuda" else ("4096", "v4flash")
    ctxs = [int(c) for c in (contexts or default_ctx).split(",")]
    shp = (shapes or default_shapes).split(",")
    bad = [s for s in shp if s not in ("v3", "v4flash")]
    if bad:
        return EXIT_BAD_INPUT, f"--shapes {bad[0]!r} is not valid; use v3 or v4flash"
    lvls = [Level(batch=b, context=c, shape=s, heads=16, page_size=64) for s in shp for c in ctxs for b in levels]
    store = Store(state_dir)
    env = {"TARGET_CTAS": os.environ.get("TARGET_CTAS", "512")}
    if variant is None:
        exp = store.new_experiment(kind="bench", variant="config", backend=be.name, config_json=json.dumps(cfg))
        rows = bench.measure_config(store, exp, be, "mla_decode", cfg, env, lvls, samples,
                                    on_level=None if as_json else lambda m: console.print(_bench_line(m)))
        store.update_experiment(exp, status="done", finished=time.time())
        if as_json:
            print(json.dumps(rows, indent=2))
        return EXIT_OK, f"stored as experiment {exp} in {store.path}"
    patch = {}
    for item in variant.split(","):
        k, _, v = item.partition("=")
        try:
            patch[k.strip()] = int(v)
        except ValueError:
            return EXIT_BAD_INPUT, f"--variant item {item!r} must be KEY=INT, e.g. num_warps=8"
    var_cfg = validate_config({**cfg, **patch}, "mla_decode")
    exp = store.new_experiment(kind="ab", variant=describe(var_cfg), backend=be.name, config_json=json.dumps(var_cfg))
    thresholds = {lv.key: stats.DEFAULT_THRESHOLD for lv in lvls}
    arms = [be.open("baseline", "mla_decode", cfg, env, partner=var_cfg, role="base"),
            be.open("variant", "mla_decode", var_cfg, env, partner=cfg)]
    for a in arms:
        for lv in lvls:
            a.setup(lv)

    def sample_fn(r):
        return bench.paired_round(store, exp, be, arms[0], arms[1], lvls, r, bench.PairedRounds(),
                                  store.device(arms[0].fingerprint))

    try:
        res = stats.run_sequential(sample_fn, [lv.key for lv in lvls], thresholds,
                                   stats.SequentialPlan(max_rounds=rounds))  # fmt: skip
    finally:
        for a in arms:
            a.close()
    gpu_s = sum(s["gpu_s"] or 0 for s in store.samples(exp))
    store.add_verdicts(exp, bench.verdict_rows(res))
    store.update_experiment(exp, status="done", verdict=res.verdict, reason=res.reason, rounds=res.rounds, gpu_s=gpu_s)
    if as_json:
        print(json.dumps({"verdict": res.verdict, "reason": res.reason, "rounds": res.rounds, "gpu_s": gpu_s,
                          "effects": {k: e.__dict__ for k, e in res.effects.items()}}, indent=2, default=str))
    else:
        for k, e in res.effects.items():
            console.print(f"{k:40s} {e.effect:+7.2%} [{e.ci_low:+.2%}, {e.ci_high:+.2%}] {e.verdict}")
        console.print(f"{describe(var_cfg)} vs {describe(cfg)}: {res.verdict} after {res.rounds} rounds "
                      f"({gpu_s:.2f} GPU s) — {res.reason}")  # fmt: skip
    return EXIT_OK, f"stored as experiment {exp} in {store.path}"


def _bench_line(m: dict) -> str:
    frac = f"{m['frac_copy']:.0%}" if m.get("frac_copy") else "n/a"
    return (f"{m['level']:40s} {m['us']:9.1f} µs {m['gbps']:7.0f} GB/s {frac:>5s} of copy "
            f"{m['tokens_per_s']:12,.0f} tok/s  {m['config']}")  # fmt: skip


def noise_command(levels, rounds, backend, state_dir, as_json, console, arms_n: int = 4, threshold: float = 0.01):
    import json

    from agent import stats
    from agent.tools import bench
    from kernels.adapter import Level, get_adapter
    from kernels.launch_config import load_config

    be = bench.get_backend(backend)
    print(be.loud, flush=True)
    adapter = get_adapter("mla_decode")
    cfg = {k: v for k, v in load_config(adapter.config_path(), "mla_decode").items() if k != "description"}
    lvls = [Level(batch=b, context=4096, shape="v4flash", heads=16, page_size=64) for b in levels]
    env = {"TARGET_CTAS": os.environ.get("TARGET_CTAS", "512")}
    store = Store(state_dir)
    exp = store.new_experiment(kind="noise", variant="A/A", backend=be.name)
    arms = []
    acc: dict[str, list[list[float]]] = {}
    gpu_s = 0.0
    try:
        arms = [be.open(f"A{j}", "mla_decode", cfg, env, replica=j) for j in range(arms_n)]
        for r in range(rounds):
            gpu_s += bench.aa_round(store, exp, be, arms, lvls, r, acc, store.device(arms[0].fingerprint))
    finally:
        for a in arms:
            a.close()
    look = stats.look_confidence(stats.SequentialPlan(), len(lvls))
    bands = [stats.aa_noise(acc[lv.key], lv.key, threshold, stats.SequentialPlan().max_rounds, look) for lv in lvls]
    store.add_noise(exp, None, [b.__dict__ for b in bands])
    store.update_experiment(exp, status="done", rounds=rounds, gpu_s=gpu_s)
    if as_json:
        print(json.dumps([b.__dict__ for b in bands], indent=2))
    else:
        from rich.table import Table

        t = Table(title=f"A/A noise, {arms_n} workers x {rounds} rounds ({be.name})")
        for c in ("level", "round band (95%)", "arm offset SD", "widest pair [95% CI]", "outliers",
                  f"inside ±{threshold:.0%}"):
            t.add_column(c)
        for b in bands:
            t.add_row(b.level, f"±{b.band:.2%}", f"{b.offset_sd:.2%}",
                      f"{b.effect:+.2%} [{b.ci_low:+.2%}, {b.ci_high:+.2%}]", str(b.outliers),
                      "yes" if b.equivalent else "NO")
        console.print(t)
    for w in stats.check_aa(bands):
        console.print(f"[yellow]warning[/yellow]: {w}")
    return EXIT_OK, f"stored as experiment {exp} in {store.path}"
