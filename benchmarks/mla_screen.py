"""Screen many configs of kinv's MLA decode kernel per level in one run on one card, then time the best few beside
the shipped file, the peer and the floor as benchmarks/mla_peer.py does.

    python benchmarks/mla_screen.py --peer-source PATH/triton_decode_attention.py --out screen.json \\
        [--context 4096] [--batches 1,8,32,64,96] [--jobs 14] [--top 4]

1. Every candidate (a flat config: tile, stages, split rule, load path, merge side; :func:`candidates`) is compiled
   first by ``--jobs`` processes at once (the Triton cache is shared), so that compiling does not eat the lease.
2. Per level: each candidate is checked against kinv's reference on fresh inputs, its output poisoned first
   (relative L2 error within the adapter's own bound), then timed for ``--screen-rounds`` rounds (CUDA graphs over
   input sets past L2, as mla_peer.py times).
3. Per level: the ``--top`` fastest, the shipped file, the peer (vLLM's Triton MLA decode over PEER_SPACE) and, at
   batch 1, the floor are timed again in ``--rounds`` interleaved rounds; medians, % of copy bandwidth.
4. The winners as one config file (``composed``): the shipped file plus one override per level won (that shape,
   batch and context), resolved back per level to check it runs what won; ``--anatomy`` then times its stage 1 and
   merge apart (benchmarks/mla_anatomy.py, V3).

Needs a GPU; torch, triton and the standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mla_peer import ROOT, floor_launcher, graph_us, load_peer, peer_launcher  # noqa: E402

# the peer's configs that were its best at some level in mla_peer.py's run over its 12 (H100, 2026-12-07)
PEER_SPACE = [(32, 4, 2), (32, 8, 2), (64, 8, 1), (64, 8, 2)]
SPACE = {"stages": (2, 3), "regcap": True, "bt128_up_to": 8}  # --stages, --no-regcap, --bt128-up-to
STAGE1_KEYS = ("BLOCK_T", "num_warps", "num_stages", "TMA", "MERGE", "maxnreg", "PARTIAL_DTYPE")


def candidates(batch: int) -> list[dict]:
    """The flat configs screened at one batch: tile x stages x split rule x load path x merge side."""
    merge_sides = [{"MERGE": 0}, {"MERGE": 0, "PARTIAL_DTYPE": 16}, {"MERGE": 1}, {"MERGE": 1, "PARTIAL_DTYPE": 16}]
    if batch <= 8:
        merge_sides += [{"MERGE": 0, "MERGE_BLOCK_DV": 16, "MERGE_BLOCK_S": 128},
                        {"MERGE": 0, "PARTIAL_DTYPE": 16, "MERGE_BLOCK_DV": 16, "MERGE_BLOCK_S": 128}]  # fmt: skip
    tiles = (32, 64, 128) if batch <= SPACE["bt128_up_to"] else (32, 64)
    warps = (4, 8) if batch == 1 else (4,)
    cps = (2,) if batch == 1 else (1, 2, 3, 4)  # one request: every rule gives one tile a split
    out = []
    for bt, w, s, c, tma, side in itertools.product(tiles, warps, SPACE["stages"], cps, (0, 1), merge_sides):
        if tma and bt > 64:  # bulk loads take tiles within one 64-token page; larger tiles gather
            continue
        out.append({"BLOCK_T": bt, "BLOCK_H": 16, "num_warps": w, "num_stages": s, "CTAS_PER_SM": c, "TMA": tma,
                    **side})  # fmt: skip
    if batch >= 8 and SPACE["regcap"]:  # a register cap that fits a third CTA of 4 warps per SM (168 registers)
        for tma, side in itertools.product((0, 1), merge_sides[:4]):
            out.append({"BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2, "CTAS_PER_SM": 3, "TMA": tma,
                        "maxnreg": 168, **side})  # fmt: skip
    return out


def nz(cfg) -> dict:
    """A flat config without its zero (default) optional tunables: the form two configs are compared in."""
    return {k: v for k, v in dict(cfg).items() if v or k == "BLOCK_H"}


def name_of(cfg: dict) -> str:
    from kinv.kernels.launch_config import describe

    return describe({"kernel": "mla_decode", **cfg})


def level_of(adapter, shape: str, ctx: int, b: int):
    return adapter.level({"batch": b, "context": ctx, "shape": shape, "heads": 16, "page_size": 64})


def _compile_task(task: tuple) -> list[tuple[str, str]]:
    """In a worker process: launch each (shape, batch, config) of one compile key once; the failures."""
    import torch

    from kinv.kernels.adapter import get_adapter

    ctx, items, peer_path = task
    adapter = get_adapter("mla_decode")
    failed, made = [], {}
    for shape, b, cfg in items:
        if (shape, b) not in made:
            made = {(shape, b): adapter.make_inputs(level_of(adapter, shape, ctx, b), seed=3)}
        x = made[(shape, b)]
        try:
            if isinstance(cfg, tuple):  # the peer: (BLOCK_N, warps, stages)
                peer_launcher(load_peer(Path(peer_path)), x, *cfg)()
            else:
                params = adapter.params_for(adapter.validate_config({"kernel": "mla_decode", **cfg}),
                                            level_of(adapter, shape, ctx, b))  # fmt: skip
                adapter.launch(x, params)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a config that cannot compile is a screening result
            label = f"peer:BN{cfg[0]}/w{cfg[1]}/s{cfg[2]}" if isinstance(cfg, tuple) else name_of(cfg)
            failed.append((shape, b, label, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"))
    return failed


def precompile(ctx: int, shapes, batches, peer_path: str, jobs: int) -> list:
    groups: dict = {}
    for shape, b in itertools.product(shapes, batches):
        for cfg in candidates(b):
            eff_tma = cfg["TMA"] and cfg["BLOCK_T"] <= 64
            key = (shape, *(cfg.get(k, 0) for k in STAGE1_KEYS), eff_tma)
            groups.setdefault(key, []).append((shape, b, cfg))
        for pc in PEER_SPACE:
            groups.setdefault(("peer", shape, pc), []).append((shape, b, pc))
    tasks = [(ctx, items, peer_path) for items in groups.values()]
    failed = []
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        for res in pool.map(_compile_task, tasks):
            failed += res
    return failed


def check(adapter, params, x, ref, norm_bound: float) -> float | None:
    """One launch into a NaN-poisoned output: its relative L2 error, or None where it is wrong."""
    import torch

    out = adapter.make_output(x, params).fill_(float("nan"))
    adapter.launch(x, params, out=out, scratch=adapter.make_scratch(x, params))
    torch.cuda.synchronize()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return err if math.isfinite(err) and err <= norm_bound else None


def kinv_fns(adapter, params, inputs):
    fns = []
    for x in inputs:
        out, scratch = adapter.make_output(x, params), adapter.make_scratch(x, params)
        fns.append(lambda x=x, out=out, scratch=scratch: adapter.launch(x, params, out=out, scratch=scratch))
    return fns


def reps_for(kv_bytes: int, sets: int, copy: float, target_s: float) -> int:
    return max(3, min(200, math.ceil(target_s / (sets * max(kv_bytes / (copy * 1e9), 10e-6)))))


def screen_level(adapter, shipped, shape, ctx, b, peer, copy, l2, args, failed=()) -> dict:
    """One level: screen every candidate, then time the best few beside the shipped file, the peer and the floor."""
    import torch

    level = level_of(adapter, shape, ctx, b)
    kv_bytes = b * ctx * (576 if shape == "v3" else 512) * 2
    sets = max(2, min(64, math.ceil(3 * l2 / kv_bytes)))
    inputs = [adapter.make_inputs(level, seed=101 + i) for i in range(sets)]
    ref = adapter.reference(inputs[0]).float()
    norm_bound = adapter.tolerance_at(torch.bfloat16, level, ref)[2]
    shipped_cfg = nz(adapter.params_for(shipped, level))
    cands = {name_of(c): c for c in candidates(b)}
    errors, screened, wrong = {}, {}, {}
    for f_shape, f_b, f_name, why in failed:  # refused when compiled apart: not compiled again here
        if (f_shape, f_b) == (shape, b) and f_name in cands:
            wrong[f_name] = why
            del cands[f_name]
    reps = reps_for(kv_bytes, sets, copy, 1e-3)
    for name, cfg in cands.items():
        params = adapter.params_for(adapter.validate_config({"kernel": "mla_decode", **cfg}), level)
        try:
            err = check(adapter, params, inputs[0], ref, norm_bound)
        except Exception as exc:  # noqa: BLE001 - infeasible (shared memory, registers) or refused
            wrong[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        if err is None:
            wrong[name] = "incorrect"
            continue
        errors[name] = err
        fns = kinv_fns(adapter, params, inputs)
        screened[name] = min(graph_us(fns, reps) for _ in range(args.screen_rounds))
        del fns
    best = sorted(screened, key=screened.get)[: args.top]
    cands.update({name_of(c): c for c in candidates(b)})  # the refused ones back, for the record only
    arms = {"shipped": kinv_fns(adapter, adapter.params_for(shipped, level), inputs)}
    arms.update({n: kinv_fns(adapter, adapter.params_for(adapter.validate_config(
        {"kernel": "mla_decode", **cands[n]}), level), inputs) for n in best})  # fmt: skip
    for bn, w, s in PEER_SPACE:
        if (shape, b, f"peer:BN{bn}/w{w}/s{s}") not in {f[:3] for f in failed}:
            fns = [peer_launcher(peer, x, bn, w, s) for x in inputs]
            got = fns[0]().float()
            if ((got - ref).norm() / ref.norm()).item() <= 2e-2:  # checked against kinv's reference, as mla_peer.py
                arms[f"peer:BN{bn}/w{w}/s{s}"] = fns
    if b == 1:
        arms["floor"] = [floor_launcher(x["kv_cache"][x["block_table"][0].long()]) for x in inputs]
    for fns in arms.values():
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    reps = reps_for(kv_bytes, sets, copy, 2e-3)
    times = {k: [] for k in arms}
    for _ in range(args.rounds):
        for k, fns in arms.items():
            times[k].append(graph_us(fns, reps))
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med.pop("floor", None)
    peers = {k: v for k, v in med.items() if k.startswith("peer:")}
    kinv = {k: v for k, v in med.items() if not k.startswith("peer:")}
    fastest = min(kinv, key=kinv.get)
    winner = fastest if kinv[fastest] < 0.99 * kinv["shipped"] else "shipped"  # a win is at least 1% faster
    return {"shape": shape, "context": ctx, "batch": b, "sets": sets, "kv_bytes": kv_bytes, "screened_us": screened,
            "errors": errors, "wrong": wrong, "us": med, "samples_us": times, "floor_us": floor,
            "shipped_config": shipped_cfg, "winner": winner,
            "winner_config": shipped_cfg if winner == "shipped" else nz(cands[winner]),
            "best_peer": min(peers, key=peers.get) if peers else None, "pct_copy": {k: 100 * kv_bytes / (v * 1e-6) / 1e9 / copy
                                                                 for k, v in med.items()}}  # fmt: skip


def compose(shipped: dict, levels: list[dict]) -> dict:
    """The shipped file with one override per level whose winner is not the shipped config, first in the list."""
    ours = []
    for r in levels:
        if r["winner"] == "shipped":
            continue
        # every tunable the winner sets, zeros too (an override's unnamed keys are the top level's)
        cfg = {k: v for k, v in r["winner_config"].items() if k != "BLOCK_H"}
        cfg.update({k: 0 for k in ("TMA", "MERGE", "PARTIAL_DTYPE", "MERGE_BLOCK_DV", "MERGE_BLOCK_S") if k not in cfg})
        ours.append({"batch_min": r["batch"], "batch_max": r["batch"], "context_min": r["context"],
                     "context_max": r["context"], "shape": r["shape"], **cfg})  # fmt: skip
    out = {k: v for k, v in shipped.items() if k != "overrides"}
    out["description"] = "The shipped file with the screening's winner per level at context 4096 (mla_screen.py)"
    out["overrides"] = ours + list(shipped.get("overrides", []))
    return out


PLAN_MODELS = {
    "v3": {"heads": 128, "attention_tp": 8, "shape": "v3"},
    "v4flash": {"heads": 64, "attention_tp": 4, "shape": "v4flash"},
}
PLAN_ALLOWED = {"BLOCK_T": [32, 64, 128], "BLOCK_H": [16], "num_warps": [4, 8], "num_stages": [2, 3],
                "CTAS_PER_SM": [1, 2, 3, 4], "TMA": [0, 1], "MERGE": [0, 1], "MERGE_BLOCK_DV": [0, 16, 32, 64],
                "MERGE_BLOCK_S": [0, 64, 128], "PARTIAL_DTYPE": [0, 16], "maxnreg": [0, 168]}  # fmt: skip


def screened_plan(adapter, result: dict, shape: str, ws: str) -> dict | None:
    """A kinv plan whose one variant is the screening's winners of one shape (None where the shipped file won
    everywhere): its premise is the quantity the winners change (splits, partial-output bytes, merge programs)."""
    from kinv.kernels.mla_decode_adapter import splits_at

    rows = [r for r in result["levels"] if r["shape"] == shape]
    won = [r for r in rows if r["winner"] != "shipped"]
    if not won:
        return None
    shipped = json.loads((ROOT / "kernels/configs/mla_decode.json").read_text())
    variant = compose(shipped, won)
    ctx = rows[0]["context"]

    def splits(cfg, b):
        return splits_at(adapter.params_for(adapter.validate_config({"kernel": "mla_decode", **cfg}),
                                            level_of(adapter, shape, ctx, b)), b, 16, ctx)  # fmt: skip

    if any(splits(r["winner_config"], r["batch"]) != splits(r["shipped_config"], r["batch"]) for r in won):
        target = "parallelism"
    elif any(r["winner_config"].get("PARTIAL_DTYPE") != r["shipped_config"].get("PARTIAL_DTYPE") for r in won):
        target = "partial_bytes"
    else:
        target = "merge_parallelism"
    gains = ", ".join(f"b{r['batch']} {r['us']['shipped']:.1f} -> {r['us'][r['winner']]:.1f} us ({r['winner']})"
                      for r in won)  # fmt: skip
    name = {"v3": "V3", "v4flash": "V4-Flash"}[shape]
    at = ", ".join(f"b{r['batch']}" for r in won)
    return {
        "workstream": {"id": ws, "title": f"Context {ctx}, {name}: the screening's fastest config per batch",
                       "parent": "#12", "parent_title": "The MLA decode kernel at the memory limit at context 4096"},
        "kernel": "mla_decode",
        "hypothesis": (f"A screening of {sum(len(r['screened_us']) for r in rows)} configs on {result['gpu']} "
                       f"(benchmarks/mla_screen.py, {result['copy_gbps']:.0f} GB/s copy) found a faster config than "
                       f"the shipped file at these levels: {gains}. The full paired A/B on this card confirms each "
                       f"level or not; the premise is the quantity the winners change ({target})."),
        "device": "sm_90",
        "workload": {"levels": [r["batch"] for r in rows], "context": ctx, "page_size": 64,
                     "model": PLAN_MODELS[shape]},
        "environment": {"TARGET_CTAS": "512"},
        "baseline_on_disk": True,
        "baseline": shipped_baseline(shipped),
        "variants": [{"id": "V1", "title": f"The screening's winner at {at}",
                      "rationale": "One override per level won (that shape, batch and context), before the shipped ones.",
                      "targets": target, "expect": "improve",
                      "patch": {k: v for k, v in variant.items() if k not in ("kernel", "description")}}],
        "allowed": PLAN_ALLOWED,
        "stats": {"threshold": 0.01, "conf": 0.95, "aa_rounds": 8, "aa_arms": 2, "quick_rounds": 4,
                  "step_rounds": 4, "max_rounds": 12},
        "budget": {"gpu_seconds": 180, "wall_seconds": 900},
    }  # fmt: skip


def shipped_baseline(shipped: dict) -> dict:
    return {k: v for k, v in shipped.items() if k not in ("kernel", "description")}


def line(r: dict) -> str:
    us, pct = r["us"], r["pct_copy"]
    s = (f"{r['shape']:8s} ctx{r['context']} b{r['batch']:3d}  shipped {us['shipped']:7.1f} us {pct['shipped']:5.1f}%  "
         f"best {r['winner']} {us[r['winner']]:7.1f} us {pct[r['winner']]:5.1f}%")  # fmt: skip
    if r["best_peer"]:
        peer = us[r["best_peer"]]
        s += f"  peer {peer:7.1f} us ({r['best_peer'][5:]}) peer/best {peer / us[r['winner']]:.2f}x"
    if r["floor_us"]:
        s += f"  floor {r['floor_us']:.2f} us ({us[r['winner']] / r['floor_us']:.2f}x)"
    return s + f"  [{len(r['screened_us'])} screened, {len(r['wrong'])} refused/wrong]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-source", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--batches", default="1,8,32,64,96")
    ap.add_argument("--shapes", default="v3,v4flash")
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--screen-rounds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stages", default="2,3", help="num_stages values screened")
    ap.add_argument("--no-regcap", action="store_true", help="leave out the register-capped candidates")
    ap.add_argument("--bt128-up-to", type=int, default=8, help="screen 128-token tiles up to this batch")
    ap.add_argument("--plan-dir", help="write a kinv plan per shape whose variant is that shape's winners here")
    ap.add_argument("--anatomy", action="store_true", help="time the composed file's stages apart (V3)")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("mla_screen.py needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    from kinv.agent.tools.worker.bench_worker import Worker
    from kinv.kernels.adapter import get_adapter

    t0 = time.time()
    SPACE.update(stages=tuple(int(x) for x in args.stages.split(",")), regcap=not args.no_regcap,
                 bt128_up_to=args.bt128_up_to)  # fmt: skip
    shapes, batches = args.shapes.split(","), [int(b) for b in args.batches.split(",")]
    failed = precompile(args.context, shapes, batches, args.peer_source, args.jobs)
    print(f"# compiled in {time.time() - t0:.0f} s; {len(failed)} launches failed", flush=True)
    adapter = get_adapter("mla_decode")
    shipped_raw = json.loads((ROOT / "kernels/configs/mla_decode.json").read_text())
    shipped = adapter.validate_config(shipped_raw)
    peer = load_peer(Path(args.peer_source))
    props = torch.cuda.get_device_properties(0)
    copy = Worker().copy_bandwidth({"mib": 2048})["gbps"]
    print(f"# {props.name}  copy bandwidth {copy:.0f} GB/s", flush=True)
    result = {"gpu": props.name, "copy_gbps": copy, "compile_failures": failed, "peer_space": PEER_SPACE,
              "levels": []}  # fmt: skip
    for shape, b in itertools.product(shapes, batches):
        row = screen_level(adapter, shipped, shape, args.context, b, peer, copy, props.L2_cache_size, args, failed)
        result["levels"].append(row)
        print(line(row), flush=True)
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(result, indent=1))
    composed = compose(shipped_raw, result["levels"])
    checked = adapter.validate_config(composed)
    for r in result["levels"]:
        got = nz(adapter.params_for(checked, level_of(adapter, r["shape"], r["context"], r["batch"])))
        r["composed_resolves_to_winner"] = got == r["winner_config"]
    result["composed"] = composed
    Path(args.out).with_name("mla_screen_composed.json").write_text(json.dumps(composed, indent=2) + "\n")
    if args.plan_dir:
        import yaml

        for shape, ws in zip(shapes, ("#12c", "#12d")):
            plan = screened_plan(adapter, result, shape, ws)
            path = Path(args.plan_dir) / f"{ws[1:]}-decode-{args.context}-screened-{shape}.yaml"
            if plan:
                path.write_text(yaml.safe_dump(plan, sort_keys=False, width=120))
            print(f"# {path}: " + ("written" if plan else f"not written, the shipped file won every {shape} level"))
    if args.anatomy:
        from mla_anatomy import measure

        result["anatomy"] = [measure(adapter, checked, args.context, b, 5, props.L2_cache_size) for b in batches]
    result["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"# wrote {args.out} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
