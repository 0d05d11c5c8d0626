"""Identical workers, two protocols: how much does one fixed memory placement shift an arm's times?

    python benchmarks/placement_offset.py --workers 6 --rounds 12 --out placement_h200.json

N worker processes time the SAME config with the SAME seed at each level, in rotated order each round.
Protocol ``fixed``: one allocation per worker for the whole run (kinv before it re-set every sample).  Protocol
``reset``: every sample re-allocates inputs, outputs and scratch and re-captures the graph (kinv now);
the inputs of round r come from seed 1000 + r in every worker, as both arms of a kinv round share a seed.

Per level, a two-way analysis of the log times (worker x round, one sample per cell) separates the
per-worker offset (a constant that does not average away over rounds) from round-to-round noise::

    offset SD = sqrt(max(0, (MS_worker - MS_resid) / rounds))      resid SD = sqrt(MS_resid)

It also prints the largest gap between two workers' mean times and the per-sample cost of the reset.
Standard library + the worker only (runs on the GPU image).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.worker.client import WorkerProcess  # noqa: E402

BASELINE = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}


def two_way(logs: list[list[float]]) -> dict:
    """Worker x round table of log times -> offset SD, residual SD, max pairwise gap of worker means."""
    w, r = len(logs), len(logs[0])
    grand = sum(map(sum, logs)) / (w * r)
    wm = [sum(row) / r for row in logs]
    rm = [sum(logs[i][j] for i in range(w)) / w for j in range(r)]
    ss_w = r * sum((m - grand) ** 2 for m in wm)
    ss_e = sum((logs[i][j] - wm[i] - rm[j] + grand) ** 2 for i in range(w) for j in range(r))
    ms_w, ms_e = ss_w / (w - 1), ss_e / ((w - 1) * (r - 1))
    return {
        "offset_sd": math.sqrt(max(0.0, (ms_w - ms_e) / r)),
        "resid_sd": math.sqrt(ms_e),
        "worker_mean_sd": statistics.stdev(wm),
        "max_pair_gap": max(wm) - min(wm),
        "f_ratio": ms_w / ms_e if ms_e > 0 else math.inf,
    }


def run(protocol: str, workers: int, rounds: int, batches: list[int], env: dict) -> dict:
    levels = [{"batch": b, "context": 4096, "shape": "v4flash", "heads": 16, "page_size": 64} for b in batches]
    ws, keys = [], {}
    for i in range(workers):
        w = WorkerProcess(env=env, label=f"{protocol}-{i}")
        w.request("hello", env_keys=sorted(env))
        for lv in levels:
            s = w.request("setup", kernel="mla_decode", config=BASELINE, level=lv, seed=0, reset=protocol == "reset")
            assert s["correct"], s
            keys[(i, lv["batch"])] = s["key"]
        ws.append(w)
    us = {(i, b): [] for i in range(workers) for b in batches}
    reset_s, wall = [], []
    t0 = time.time()
    for r in range(rounds):
        order = list(range(workers))
        order = order[r % workers:] + order[: r % workers]
        for i in order:
            for b in batches:
                t = time.perf_counter()
                smp = ws[i].request("sample", key=keys[(i, b)], seed=1000 + r)
                wall.append(time.perf_counter() - t)
                us[(i, b)].append(smp["us"])
                reset_s.append(smp.get("reset_s", 0.0))
    for w in ws:
        w.close()
    out = {"protocol": protocol, "workers": workers, "rounds": rounds, "wall_s": time.time() - t0,
           "mean_reset_s": statistics.mean(reset_s), "mean_request_s": statistics.mean(wall), "levels": {}}  # fmt: skip
    for b in batches:
        logs = [[math.log(u) for u in us[(i, b)]] for i in range(workers)]
        out["levels"][f"b{b}"] = {**two_way(logs), "median_us": statistics.median(x for i in range(workers) for x in us[(i, b)]),
                                  "us": [us[(i, b)] for i in range(workers)]}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batches", default="1,8,32,96")
    ap.add_argument("--protocols", default="fixed,reset")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    env = {"TARGET_CTAS": "512"}
    results = [run(p, args.workers, args.rounds, batches, env) for p in args.protocols.split(",")]
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"{'protocol':8s} {'level':5s} {'median us':>9s} {'offset SD':>9s} {'resid SD':>8s} {'max gap':>8s} {'F':>6s}")
    for res in results:
        for lv, s in res["levels"].items():
            print(f"{res['protocol']:8s} {lv:5s} {s['median_us']:9.2f} {s['offset_sd']:9.3%} {s['resid_sd']:8.3%} "
                  f"{s['max_pair_gap']:8.3%} {s['f_ratio']:6.2f}")
        print(f"{res['protocol']:8s} reset {res['mean_reset_s'] * 1e3:.1f} ms/sample, request {res['mean_request_s'] * 1e3:.1f} ms, "
              f"wall {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
