"""Cross-GPU A/A: the same config on every GPU of a node, timed round by round.

    python3 benchmarks/cross_gpu_aa.py --plan plans/7-decode-ceiling.yaml --workers-per-gpu 2 --rounds 16 \
        --out cross_gpu_aa.json

GPUs are not interchangeable: two H200s of one node differ by a clock, a thermal state, a memory placement.
Each GPU gets ``--workers-per-gpu`` workers of the plan's baseline (pinned by CUDA_VISIBLE_DEVICES), and in
round r every worker times every level (seed round_seed(r) for all, order rotated by the round, every sample
re-setting its worker as in a live A/B).  Per level it reports the GPU-to-GPU offset (GPU j against GPU 0:
the mean over rounds of the log-ratio of the two GPUs' mean times, with a 95% interval) beside the offset
between two workers of one GPU: what a campaign spread over GPUs must never pool, and why it combines GPUs
only through per-GPU paired effects.  Standard library + the worker (runs on the GPU image).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.backends.base import round_seed  # noqa: E402
from kinv.agent.tools.measure import protocol  # noqa: E402
from kinv.agent.tools.worker.client import WorkerProcess  # noqa: E402


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def interval(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    t = {7: 2.365, 15: 2.131, 23: 2.069, 31: 2.042}.get(len(xs) - 1, 1.96)
    h = t * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="plans/7-decode-ceiling.yaml")
    ap.add_argument("--workers-per-gpu", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from kinv.agent.plan_file import load_plan

    plan = load_plan(args.plan)[0]
    cfg = {**plan.baseline, "kernel": plan.adapter.name}
    levels = [lv.to_dict() for lv in plan.levels()]
    n_gpu = gpu_count()
    if n_gpu < 2:
        raise SystemExit(f"{n_gpu} GPU(s) visible: a cross-GPU A/A needs at least 2")
    t0 = time.time()
    workers = {}
    for g in range(n_gpu):
        for j in range(args.workers_per_gpu):
            env = {**plan.environment, "CUDA_VISIBLE_DEVICES": str(g)}
            w = WorkerProcess(env=env, label=f"gpu{g}w{j}")
            hello = w.request("hello", env_keys=sorted(env))
            sets = {}
            for lv in levels:
                s = w.request("setup", kernel=plan.adapter.name, config=cfg, level=lv, seed=100 * g + j)
                assert s["correct"], s
                sets[s["level"]] = s
            workers[(g, j)] = (w, hello, sets)
    print(f"# {len(workers)} workers on {n_gpu} GPUs set up in {time.time() - t0:.0f}s", flush=True)
    times: dict[str, dict[tuple[int, int], list[float]]] = {}
    names = list(workers)
    for r in range(args.rounds):
        order = protocol.rotated(names, r)
        for lv in levels:
            for key in order:
                w, _h, sets = workers[key]
                s = sets[plan.adapter.level(lv).key]
                smp = w.request("sample", key=s["key"], seed=round_seed(r))
                times.setdefault(s["level"], {}).setdefault(key, []).append(smp["us"])
    out = {"gpus": n_gpu, "fingerprints": {f"gpu{g}": workers[(g, 0)][1]["fingerprint"] for g in range(n_gpu)},
           "config": cfg, "rounds": args.rounds, "workers_per_gpu": args.workers_per_gpu, "levels": {}}  # fmt: skip
    print(f"{'level':28s} " + " ".join(f"{f'gpu{g} vs gpu0':>28s}" for g in range(1, n_gpu)) + f" {'worker1 vs worker0 (gpu0)':>28s}")
    for lvk, per in times.items():
        row = {}

        def gmean_round(g: int, r: int, per=per) -> float:
            return statistics.fmean(math.log(per[(g, j)][r]) for j in range(args.workers_per_gpu))

        for g in range(1, n_gpu):
            m, lo, hi = interval([gmean_round(g, r) - gmean_round(0, r) for r in range(args.rounds)])
            row[f"gpu{g}_vs_gpu0"] = {"offset": math.expm1(m), "ci95": [math.expm1(lo), math.expm1(hi)]}
        if args.workers_per_gpu > 1:
            m, lo, hi = interval([math.log(per[(0, 1)][r] / per[(0, 0)][r]) for r in range(args.rounds)])
            row["worker1_vs_worker0_gpu0"] = {"offset": math.expm1(m), "ci95": [math.expm1(lo), math.expm1(hi)]}
        row["median_us"] = {f"gpu{g}": statistics.median(x for j in range(args.workers_per_gpu)
                                                         for x in per[(g, j)]) for g in range(n_gpu)}  # fmt: skip
        out["levels"][lvk] = row
        cells = [row[f"gpu{g}_vs_gpu0"] for g in range(1, n_gpu)] + ([row["worker1_vs_worker0_gpu0"]]
                                                                      if args.workers_per_gpu > 1 else [])  # fmt: skip
        print(f"{lvk:28s} " + " ".join(f"{c['offset']:+7.2%} [{c['ci95'][0]:+.2%}, {c['ci95'][1]:+.2%}]".rjust(28)
                                        for c in cells))  # fmt: skip
    for w, _h, _s in workers.values():
        w.close()
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
