"""Record paired A/B and A/A samples on a GPU for the replay backend.

    python benchmarks/record.py --plan plans/3a-attention-occupancy.yaml --plan plans/3b-tile-shape.yaml \
        --rounds 32 --aa-rounds 16 --out kernels/recordings/h200/mla_decode-v4flash.jsonl.gz

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

from kinv.agent.tools.worker_client import WorkerProcess  # noqa: E402
from kinv.kernels.launch_config import config_hash, describe  # noqa: E402

SEED0 = 1000  # round r of every arm draws its inputs from SEED0 + r (agent/tools/bench.py ROUND_SEED0)


def from_plans(paths: list[str]):
    """(kernel ref, adapter, baseline, {variant title: config}, levels, env) from one or more plans of one
    kernel and baseline (every config-only variant; source patches are measured live, never replayed)."""
    from kinv.agent.models import load_plan

    plans = [load_plan(p)[0] for p in paths]
    first = plans[0]
    adapter = first.adapter
    base = {**first.baseline, "kernel": adapter.name}
    variants: dict[str, dict] = {}
    for plan in plans:
        if plan.adapter.name != adapter.name or {**plan.baseline, "kernel": adapter.name} != base:
            raise SystemExit(f"{plan.ws}: every plan recorded together needs the kernel and baseline of {first.ws}")
        for v in plan.variants:
            if v.source_patch:
                continue
            cfg = plan.variant_config(v)
            if config_hash(cfg) != config_hash(base) and cfg not in variants.values():
                variants[f"{plan.ws} {v.id} {v.title}"] = cfg
    return first.kernel, adapter, base, variants, first.levels(), dict(first.environment)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=32, help="A/B rounds per variant")
    ap.add_argument("--aa-rounds", type=int, default=16)
    ap.add_argument("--aa-arms", type=int, default=4)
    ap.add_argument("--plan", action="append", required=True,
                    help="plan whose baseline, config variants, levels and environment to record (repeatable)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    kernel, adapter, base, var, level_objs, env = from_plans(args.plan)
    # arm name -> (kind, pair, role, config)
    arms: dict[str, tuple[str, str, str, dict]] = {}
    for name, cfg in var.items():
        arms[f"{name}: baseline"] = ("ab", config_hash(cfg), "base", base)
        arms[f"{name}: variant"] = ("ab", config_hash(cfg), "variant", cfg)
    for j in range(args.aa_arms):
        arms[f"A/A arm {j}"] = ("aa", "aa", f"A{j}", base)
    levels = [lv.to_dict() for lv in level_objs]

    t0 = time.time()
    workers, setups, header = {}, {}, None
    for name, (_kind, _pair, _role, cfg) in arms.items():
        w = WorkerProcess(env=env, label=name)
        hello = w.request("hello", env_keys=sorted(env))
        if header is None:
            header = {"type": "header", "version": 2, "kernel": adapter.name, "fingerprint": hello["fingerprint"],
                      "harness_hash": hello["harness_hash"], "env": hello["env"], "rounds": args.rounds,
                      "aa_rounds": args.aa_rounds, "aa_arms": args.aa_arms, "levels": levels,
                      "protocol": "every sample re-sets its arm; one baseline worker per variant; ABBA",
                      "configs": {"baseline": base, **var}, "created": time.time()}  # fmt: skip
            header["copy_gbps"] = w.request("copy_bandwidth", mib=2048)["gbps"]
        workers[name] = (w, hello)
        for lv in levels:
            s = w.request("setup", kernel=kernel, config=cfg, level=lv, seed=zlib.crc32(name.encode()) % 100000)
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
        s = setups[(name, adapter.level(lv).key)]
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
        if r < args.aa_rounds and args.aa_arms:
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
