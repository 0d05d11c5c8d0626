"""The MLA decode kernel against the copy-bandwidth ceiling: every level of the goal, many configs.

    python benchmarks/mla_ceiling.py --grid explore --out benchmarks/results/mla_ceiling_h200.json
    python benchmarks/mla_ceiling.py --grid shipped --out ...   # the shipped config file, every level
    python benchmarks/mla_ceiling.py --grid merge --out ...     # #9a's screening (needs its source patch)
    python benchmarks/mla_ceiling.py --grid occupancy --out ... # after #9b: programs per SM, stages, merge
    python benchmarks/mla_ceiling.py --grid tail --contexts 4096 --min-batch 32 --out ...  # #9d (lab-notebook:benchmarks/lab/merge_one_pass_session.sh)
    python benchmarks/mla_ceiling.py --grid persistent --contexts 4096 --out ...  # #10a (needs its source patch)
    python benchmarks/mla_ceiling.py --grid small --batches 1,8 --out ...  # batch 1 and 8, one override at a time
    python benchmarks/mla_ceiling.py --grid regcap --contexts 4096 --out ...  # the occupancy premise's arms

Standard library + the worker (torch, triton) only, so it runs on the GPU machine as it is.  Every figure
comes from ``agent/tools/worker/bench_worker.py`` (correctness on fresh random inputs with the output poisoned,
then CUDA-graph replay with L2 rotated); the copy bandwidth is measured in the same run.  Configs are first
compiled by ``--jobs`` workers side by side (Triton's cache keeps the binaries), then timed by one worker,
one config at a time, so no two kernels ever share the GPU while timed.

The peer figures are not measured here: they are the best graph-timed configs of vLLM's Triton MLA decode
kernel on the H200 from docs/gpu.md (same levels, 16 heads, page 64).  benchmarks/mla_peer.py times the shipped
file, the peer and the batch-1 floor in one run on whichever card it runs on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.errors import WorkerError  # noqa: E402
from kinv.agent.tools.worker.client import WorkerProcess  # noqa: E402

# the goal's levels: both shapes at context 4096 and 16384, batch >= 32 for bandwidth,
# and batch 8, and batch 1 for latency
LEVELS = [(shape, ctx, b) for ctx in (4096, 16384) for shape in ("v3", "v4flash") for b in (1, 8, 32, 64, 96)]
# vLLM Triton MLA decode, best config per level, H200 graph-timed (docs/gpu.md)
PEER_US = {("v3", 4096, 1): 26.2, ("v3", 4096, 32): 93.1, ("v3", 4096, 64): 159.2, ("v3", 4096, 96): 290.7,
           ("v3", 16384, 32): 294.3, ("v3", 16384, 64): 559.4, ("v3", 16384, 96): 1028.8,
           ("v4flash", 4096, 1): 25.8, ("v4flash", 4096, 32): 89.0, ("v4flash", 4096, 64): 151.8,
           ("v4flash", 4096, 96): 264.8}  # fmt: skip


def cfg(bt, w, s, cps=0, tma=0, bh=16) -> dict:
    c = {"kernel": "mla_decode", "BLOCK_T": bt, "BLOCK_H": bh, "num_warps": w, "num_stages": s}
    if cps:
        c["CTAS_PER_SM"] = cps
    if tma:
        c["TMA"] = tma
    return c


def grid(name: str) -> list[dict]:
    root = Path(__file__).resolve().parents[1]
    shipped = json.loads((root / "kernels/configs/mla_decode.json").read_text())
    shipped.pop("description", None)
    if name == "shipped":
        return [shipped]
    seed = cfg(16, 4, 2)
    campaign7 = {**cfg(64, 8, 3), "overrides": [{"batch_max": 1, "num_stages": 2},
                                                 {"batch_min": 2, "batch_max": 8, "BLOCK_T": 128, "num_warps": 4}]}
    if name == "explore":
        space = [cfg(bt, w, s, cps, tma) for tma, cps, bt, w, s in
                 itertools.product((0, 1), (0, 2), (32, 64), (4, 8), (2, 3))]
        return [seed, campaign7, *space, cfg(64, 4, 4, 2, 1), cfg(32, 4, 4, 2, 1), cfg(64, 8, 4, 1, 1),
                cfg(32, 4, 3, 3, 1), cfg(32, 4, 3, 1, 1), cfg(64, 4, 3, 1, 1)]
    if name == "merge":
        # #9a's screening: the value columns in halves (every config) and the merge in stage 1 (MERGE 1) at
        # batch >= 2; batch 1 keeps the separate merge (64 splits are too many for one program to merge)
        b1 = {"batch_max": 1, "num_warps": 8, "num_stages": 2, "TMA": 1, "MERGE": 0}
        return [shipped, *[{**cfg(64, 4, s, cps, tma), "MERGE": 1, "overrides": [b1]}
                           for s, cps, tma in ((2, 2, 0), (3, 2, 0), (2, 2, 1), (3, 1, 1))]]
    if name == "occupancy":
        # after #9a/#9b: the fixed cost per program at 4096 (batch 32 at 61% of copy bandwidth); more programs
        # resident per SM (2 warps, 32-token tiles, 3-4 CTAs/SM), deeper pipelines, the merge at every batch
        b1 = {"batch_max": 1, "BLOCK_T": 64, "num_warps": 8, "num_stages": 2, "CTAS_PER_SM": 2, "TMA": 1, "MERGE": 0}
        space = [(64, 4, 2, 2, 0), (32, 4, 3, 2, 0), (32, 4, 4, 2, 0), (32, 4, 2, 3, 0), (32, 2, 2, 4, 0),
                 (32, 2, 3, 4, 0), (16, 2, 4, 4, 0), (32, 2, 2, 3, 0), (64, 4, 3, 2, 1), (32, 4, 3, 2, 1),
                 (32, 2, 3, 4, 1)]
        return [shipped, *[{**cfg(bt, w, s, cps, tma), "MERGE": 1, "overrides": [b1]} for bt, w, s, cps, tma in space]]
    if name == "tail":
        # #9d: the merge at the end of stage 1 (MERGE 1) reads the lse values in one load and the partial
        # outputs in one unrolled pass; so MERGE from batch 32, and V4-Flash at batch 96 (2.9 waves of 8 splits)
        overrides = [o for o in shipped["overrides"] if o.get("batch_min") != 64]
        from32 = {**shipped, "overrides": [*overrides, {"batch_min": 32, "MERGE": 1}]}
        v4 = [{"shape": "v4flash", "batch_min": 96, "batch_max": 96, "MERGE": 1, **o} for o in (
            {"BLOCK_T": 32, "CTAS_PER_SM": 3}, {"num_stages": 3}, {"BLOCK_T": 32}, {"num_warps": 8, "CTAS_PER_SM": 1},
            {"BLOCK_T": 128, "num_warps": 8, "CTAS_PER_SM": 1})]
        return [shipped, from32, *[{**from32, "overrides": [o, *from32["overrides"]]} for o in v4]]
    if name == "persistent":
        # #10a's screening (needs its source patch): stage 1 as k programs per SM taking splits from a queue,
        # with the shipped split rule, and with twice the splits per wave (CTAS_PER_SM 4) for a finer tail
        def pers(k, **extra):
            return {**shipped, **extra, "PERSISTENT": k}

        return [shipped, pers(1), pers(2), pers(3), pers(2, CTAS_PER_SM=4), pers(4, CTAS_PER_SM=4),
                pers(2, CTAS_PER_SM=4, BLOCK_T=32)]
    if name == "small":
        # the levels furthest from the goal (batch 8 at 43-45% of copy bandwidth at 4096, batch 1 at 12-30 us):
        # one override at a time, put first (the first matching override wins)
        b8 = [{"MERGE": 1}, {"CTAS_PER_SM": 1}, {"CTAS_PER_SM": 1, "MERGE": 1}, {"BLOCK_T": 128, "num_warps": 8},
              {"BLOCK_T": 128, "num_warps": 8, "CTAS_PER_SM": 1}, {"num_stages": 3}, {"TMA": 1},
              {"TMA": 1, "MERGE": 1}]
        b1 = [{"BLOCK_T": 32, "TMA": 1}, {"BLOCK_T": 32, "num_warps": 8, "TMA": 1},
              {"num_warps": 8, "TMA": 1, "num_stages": 3}, {"TMA": 1}, {"num_warps": 8, "TMA": 1, "MERGE": 1},
              {"BLOCK_T": 128, "num_warps": 8, "TMA": 1}]
        return [shipped, *[{**shipped, "overrides": [{"batch_min": 8, "batch_max": 8, **o}, *shipped["overrides"]]}
                           for o in b8],
                *[{**shipped, "overrides": [{"batch_max": 1, **o}, *shipped["overrides"]]} for o in b1]]
    if name == "regcap":
        # plans/occupancy-premise.yaml's arms on the seed's BT16/w4/s2: a register cap, 8 warps under a cap, 8 warps
        return [seed, {**seed, "maxnreg": 80}, {**seed, "num_warps": 8, "maxnreg": 64}, {**seed, "num_warps": 8}]
    raise SystemExit(f"unknown grid {name!r}; valid: explore, shipped, merge, occupancy, tail, persistent, small, "
                     "regcap")


def level_dict(shape, ctx, b):
    return {"batch": b, "context": ctx, "shape": shape, "heads": 16, "page_size": 64}


def warm(config) -> str:
    """Compile (and check) one config at batch 1 of each shape in a worker of its own."""
    try:
        with WorkerProcess(label="warm") as w:
            for shape in ("v3", "v4flash"):
                s = w.request("setup", kernel="mla_decode", config=config, level=level_dict(shape, 4096, 1))
                if s.get("key"):
                    w.request("drop", key=s["key"])
                if not s["correct"]:
                    return f"incorrect at {shape}: {s.get('mismatched')} mismatches"
        return "ok"
    except WorkerError as exc:
        return f"error: {exc}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--grid", default="explore")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--contexts", default="4096,16384", help="comma-separated contexts of the goal's levels to time")
    ap.add_argument("--min-batch", type=int, default=1, help="time only levels at this batch or larger")
    ap.add_argument("--batches", default="", help="comma-separated batches of the goal's levels to time (default: all)")
    args = ap.parse_args()
    contexts = {int(c) for c in args.contexts.split(",")}
    batches = {int(b) for b in args.batches.split(",") if b}
    levels = [lv for lv in LEVELS if lv[1] in contexts and lv[2] >= args.min_batch and (not batches or lv[2] in batches)]
    configs = grid(args.grid)
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        warmed = list(pool.map(warm, configs))
    bad = {i for i, s in enumerate(warmed) if s != "ok"}
    for i in bad:
        print(f"# dropped {configs[i]}: {warmed[i]}", flush=True)
    print(f"# compiled {len(configs)} configs in {time.time() - t0:.0f} s", flush=True)
    result = {"grid": args.grid, "configs": configs, "warm": warmed, "rows": [], "peer_us": {
        f"{s}/{c}/b{b}": v for (s, c, b), v in PEER_US.items()}}
    with WorkerProcess(label="ceiling") as w:
        hello = w.request("hello", env_keys=["TARGET_CTAS"])
        result["fingerprint"] = hello["fingerprint"]
        result["harness_hash"] = hello["harness_hash"]
        result["copy_gbps"] = copy = w.request("copy_bandwidth", mib=2048)["gbps"]
        print(f"# {hello['fingerprint']['gpu']}  copy bandwidth {copy:.0f} GB/s", flush=True)
        for shape, ctx, b in levels:
            best = None
            for i, config in enumerate(configs):
                if i in bad:
                    continue
                row = {"level": [shape, ctx, b], "config": i}
                try:
                    s = w.request("setup", kernel="mla_decode", config=config, level=level_dict(shape, ctx, b))
                    row["correct"] = s["correct"]
                    row["kernel_hash"] = s["kernel_hash"]
                    row["splits"] = s["derived_env"].get("num_splits")
                    row["resources"] = s["resources"]
                    if s["correct"]:
                        us = [w.request("sample", key=s["key"])["us"] for _ in range(args.samples)]
                        w.request("drop", key=s["key"])
                        row["us"] = statistics.median(us)
                        row["samples_us"] = us
                        kv = b * ctx * (576 if shape == "v3" else 512) * 2
                        row["kv_gbps"] = kv / (row["us"] * 1e-6) / 1e9
                        row["pct_copy"] = 100 * row["kv_gbps"] / copy
                except WorkerError as exc:
                    row["error"] = str(exc)[:300]
                result["rows"].append(row)
                if "us" in row and (best is None or row["us"] < best["us"]):
                    best = row
            times = [f"{r['us']:.1f}" if "us" in r else "-" for r in result["rows"] if r["level"] == [shape, ctx, b]]
            print(f"{shape:8s} ctx{ctx:6d} b{b:3d}  every config (us): {' '.join(times)}", flush=True)
            if best:
                peer = PEER_US.get((shape, ctx, b))
                seed_us = next((r["us"] for r in result["rows"] if r["level"] == [shape, ctx, b]
                                and r["config"] == 0 and "us" in r), float("nan"))  # fmt: skip
                print(f"{shape:8s} ctx{ctx:6d} b{b:3d}  best {best['us']:8.1f} us {best['kv_gbps']:6.0f} GB/s "
                      f"{best['pct_copy']:5.1f}%  splits {best['splits']}  {describe(configs[best['config']])}  "
                      f"config0 {seed_us:8.1f} us  peer/kinv {peer / best['us'] if peer else float('nan'):.2f}x",
                      flush=True)  # fmt: skip
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    result["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"# wrote {args.out} in {result['wall_s']:.0f} s")
    return 0


def describe(config: dict) -> str:
    from kinv.kernels.launch_config import describe as d

    return d(config)


if __name__ == "__main__":
    sys.exit(main())
