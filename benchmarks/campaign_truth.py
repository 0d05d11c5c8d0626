"""The exhaustive sweep as the truth a campaign is judged against.

    python benchmarks/campaign_truth.py kernels/recordings/h200/mla_decode-v4flash-sweep.jsonl.gz \
        [--campaign summary.json] [--json out.json]

From a sweep recording (benchmarks/record.py --sweep: every config of the campaign's space, two workers each,
timed in every round at every level) it ranks every config at every level by its geometric-mean time over
all rounds and workers, and prints the best per level with its throughput change against the starting
baseline.  With ``--campaign`` (the JSON of ``kinv campaign ... --json``) it says, per level, how far the
campaign's chosen config is from that level's best (the target: within 3%), and the GPU seconds the campaign
used as a fraction of the sweep's (the target: at most 25%).  GPU seconds are the samples' own timed GPU
time on both sides (``gpu_s``), so compile and set-up count on neither.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.kernels.launch_config import config_hash  # noqa: E402


def load(path: str) -> tuple[dict, list[dict]]:
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    header = rows[0]
    if not header.get("sweep"):
        raise SystemExit(f"{path} is not a sweep recording (record one with benchmarks/record.py --sweep)")
    return header, [r for r in rows if r.get("type") == "sample"]


def truth(header: dict, samples: list[dict]) -> dict:
    """level -> {config label: geometric-mean µs}, and the sweep's GPU seconds and sample count."""
    names = {}
    for label, cfg in header["configs"].items():
        names[config_hash(cfg)] = label
    logs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        logs[s["level"]][names[s["config_hash"]]].append(math.log(s["us"]))
    per = {lv: {c: math.exp(sum(v) / len(v)) for c, v in cs.items()} for lv, cs in logs.items()}
    return {"levels": per, "gpu_s": sum(s["gpu_s"] for s in samples), "samples": len(samples),
            "rounds": header["rounds"], "replicas": header.get("replicas"), "configs": len(header["configs"]),
            "pruned": header.get("pruned", []), "failed": header.get("failed", {})}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--campaign", help="JSON summary of kinv campaign --json")
    ap.add_argument("--start", default="BT16/BH16/w4/s2", help="the starting config's label")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    header, samples = load(args.sweep)
    t = truth(header, samples)
    out = {"sweep": {k: v for k, v in t.items() if k != "levels"}, "levels": {}}
    camp = json.load(open(args.campaign)) if args.campaign else None
    chosen = {v["level"]: v["config"] for v in camp["levels"].values()} if camp else {}
    print(f"sweep: {t['configs']} configs x {t['replicas']} workers x {t['rounds']} rounds, {t['samples']} samples, "
          f"{t['gpu_s']:.1f} GPU s; pruned by the resource model: {len(t['pruned'])}; failed: {len(t['failed'])}")
    print(f"{'level':28s} {'start us':>9s} {'best':>16s} {'best us':>8s} {'vs start':>9s}"
          + (f" {'campaign':>16s} {'gap':>7s}" if camp else ""))
    worst = 0.0
    for lv, cs in sorted(t["levels"].items(), key=lambda kv: int(kv[0].rsplit("/b", 1)[-1])):
        best = min(cs, key=cs.get)
        start = cs.get(args.start)
        row = {"best": best, "best_us": cs[best], "start_us": start,
               "best_vs_start": (start / cs[best] - 1) if start else None,
               "ranking": sorted(cs, key=cs.get)[:5]}  # fmt: skip
        line = f"{lv:28s} {start or float('nan'):9.2f} {best:>16s} {cs[best]:8.2f} {row['best_vs_start']:+9.1%}"
        if camp:
            mine = chosen.get(lv)
            gap = cs[mine] / cs[best] - 1 if mine in cs else None
            row.update(campaign=mine, campaign_us=cs.get(mine), gap=gap)
            worst = max(worst, gap if gap is not None else math.inf)
            line += f" {mine or '?':>16s} {gap:+7.2%}" if gap is not None else f" {mine or '?':>16s}     n/a"
        out["levels"][lv] = row
        print(line)
    if camp:
        frac = camp["gpu_seconds"] / t["gpu_s"]
        out["campaign"] = {"gpu_seconds": camp["gpu_seconds"], "samples": camp["samples"], "gpu_fraction": frac,
                           "worst_gap": worst, "backend": camp.get("backend"), "stop_reason": camp.get("stop_reason"),
                           "workstreams": [w["ws"] for w in camp["workstreams"] if w.get("ws")]}  # fmt: skip
        ok = worst <= 0.03 and frac <= 0.25
        print(f"campaign: worst gap to the sweep's best {worst:+.2%} (target <= 3%); GPU time {camp['gpu_seconds']:.1f} s "
              f"= {frac:.1%} of the sweep's (target <= 25%): {'MET' if ok else 'NOT MET'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
