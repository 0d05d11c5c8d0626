"""Record paired A/B and A/A samples on a GPU for the replay backend.

    python benchmarks/record.py --rounds 32 --aa-rounds 16 --out kernels/recordings/h200/mla_decode-v4flash.jsonl.gz

The recording follows the protocol of a live investigation (agent/tools/bench.py), so a replayed
investigation sees the same statistics as a live one:

* every sample re-sets its arm (fresh inputs, outputs and scratch at a new placement, the graph
  captured again; agent/tools/bench_worker.py), so rounds are independent replicates;
* each variant is paired with a baseline worker of its own ("independent baseline rounds per
  variant"): round r of pair V holds the baseline and V timed back to back, in ABBA order;
* the A/A has ``--aa-arms`` baseline workers, all timed in every round;
* nothing wraps around: the replay backend refuses a round the recording does not have.

Rounds interleave every pair and level in a rotated order, so slow drifts spread over all of them.
Standard library + the worker only (runs on the GPU image).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.tools.worker_client import WorkerProcess  # noqa: E402
from kernels.launch_config import config_hash, describe, validate_config  # noqa: E402

BATCHES = (1, 8, 32, 64, 96)
SEED0 = 1000
BASELINE = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}


def variants() -> dict[str, dict]:
    """The variant configs the shipped plans (#3a, #3b, the null drill) and tests ask replay for."""
    out = {
        "num_warps 8": {**BASELINE, "num_warps": 8},
        "num_stages 3": {**BASELINE, "num_stages": 3},
        "batch-aware warps": {**BASELINE, "overrides": [{"batch_max": 8, "num_warps": 4}, {"batch_min": 9, "num_warps": 8}]},
        "BLOCK_T 32": {**BASELINE, "BLOCK_T": 32},
    }
    return {k: validate_config(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=32, help="A/B rounds per variant")
    ap.add_argument("--aa-rounds", type=int, default=16)
    ap.add_argument("--aa-arms", type=int, default=4)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--shape", default="v4flash")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    env = {"TARGET_CTAS": "512"}
    base = validate_config(BASELINE)
    var = variants()
    if args.only:
        var = {k: v for k, v in var.items() if k in args.only.split(",")}
    # arm name -> (kind, pair, role, config)
    arms: dict[str, tuple[str, str, str, dict]] = {}
    for name, cfg in var.items():
        arms[f"{name}: baseline"] = ("ab", config_hash(cfg), "base", base)
        arms[f"{name}: variant"] = ("ab", config_hash(cfg), "variant", cfg)
    for j in range(args.aa_arms):
        arms[f"A/A arm {j}"] = ("aa", "aa", f"A{j}", base)
    levels = [{"batch": b, "context": args.context, "shape": args.shape, "heads": 16, "page_size": 64} for b in BATCHES]

    t0 = time.time()
    workers, setups, header = {}, {}, None
    for name, (_kind, _pair, _role, cfg) in arms.items():
        w = WorkerProcess(env=env, label=name)
        hello = w.request("hello", env_keys=sorted(env))
        if header is None:
            header = {"type": "header", "version": 2, "kernel": "mla_decode", "fingerprint": hello["fingerprint"],
                      "harness_hash": hello["harness_hash"], "env": hello["env"], "rounds": args.rounds,
                      "aa_rounds": args.aa_rounds, "aa_arms": args.aa_arms, "levels": levels,
                      "protocol": "every sample re-sets its arm; one baseline worker per variant; ABBA",
                      "configs": {"baseline": base, **var}, "created": time.time()}  # fmt: skip
            header["copy_gbps"] = w.request("copy_bandwidth", mib=2048)["gbps"]
        workers[name] = (w, hello)
        for lv in levels:
            s = w.request("setup", kernel="mla_decode", config=cfg, level=lv, seed=zlib.crc32(name.encode()) % 100000)
            if not s["correct"]:
                raise SystemExit(f"{name} incorrect at {lv}: rel err {s['rel_err']}")
            setups[(name, s["level"])] = s
            header.setdefault("kernel_hash", s["kernel_hash"])
            header.setdefault("reference_hash", s["reference_hash"])
        print(f"# set up {name} ({describe(cfg)}) pid {hello['pid']} at {time.time() - t0:.0f}s", flush=True)
    header["setup_s"] = time.time() - t0

    lines = [header]

    def take(name: str, lv: dict, r: int) -> None:
        kind, pair, role, cfg = arms[name]
        w, hello = workers[name]
        s = setups[(name, f"{lv['shape']}/h{lv['heads']}/p{lv['page_size']}/ctx{lv['context']}/b{lv['batch']}")]
        t_req = time.perf_counter()
        smp = w.request("sample", key=s["key"], seed=SEED0 + r)  # the same data for every arm of round r
        lines.append({
            "type": "sample", "kind": kind, "pair": pair, "role": role, "arm": name, "round": r,
            "config_hash": config_hash(cfg), "level": s["level"], "us": smp["us"], "us_min": smp["us_min"],
            "us_max": smp["us_max"], "replays": smp["replays"], "gpu_s": smp["gpu_s"], "reset_s": smp["reset_s"],
            "request_wall_s": time.perf_counter() - t_req, "t": smp["t"], "env": hello["env"],
            "derived_env": s["derived_env"], "launches": s["launches_per_replay"], "pid": hello["pid"],
        })  # fmt: skip

    names = list(var)
    for r in range(max(args.rounds, args.aa_rounds)):
        order = names[r % len(names):] + names[: r % len(names)] if names else []
        units = []
        if r < args.rounds:
            for name in order:
                ab = [f"{name}: baseline", f"{name}: variant"]
                units.append(ab if r % 2 == 0 else ab[::-1])  # ABBA within each pair
        if r < args.aa_rounds:
            aa = [f"A/A arm {j}" for j in range(args.aa_arms)]
            k = r % len(aa)
            units.append(aa[k:] + aa[:k])
        for unit in units:
            for lv in levels:
                for name in unit:
                    take(name, lv, r)
        print(f"# round {r + 1} at {time.time() - t0:.0f}s", flush=True)
    resources = [{"arm": n, "level": lv, "resources": s["resources"], "compile_s": s["compile_s"],
                  "rel_err": s["rel_err"], "l2": s.get("l2")} for (n, lv), s in setups.items()]  # fmt: skip
    lines.append({"type": "resources", "items": resources, "wall_s": time.time() - t0})
    for w, _ in workers.values():
        w.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    print(f"# wrote {len(lines) - 2} samples to {args.out} in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
