"""Record the #3a config space on a GPU for the replay backend.

    python benchmarks/record_3a.py --rounds 30 --out kernels/recordings/h200/mla_decode-3a.jsonl.gz

One worker subprocess per config (fresh environment, TARGET_CTAS=512), all
alive at once; each round visits every config in a rotated order and takes
one sample per level, so configs are interleaved in time and samples of the
same round can be paired (they share the round's clock and thermal state).
The baseline is measured by two independent workers ("A" and "A2") for the
A/A pairs.  Standard library + the worker only.
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
from kernels.launch_config import config_hash, validate_config  # noqa: E402

BATCHES = (1, 8, 32, 64, 96)


def space() -> dict[str, dict]:
    out = {}
    for bt in (16, 32):
        for w in (4, 8):
            for s in (1, 2, 3):
                out[f"BT{bt}/w{w}/s{s}"] = {"kernel": "mla_decode", "BLOCK_T": bt, "BLOCK_H": 16, "num_warps": w,
                                            "num_stages": s}  # fmt: skip
    out["V3 batch-aware"] = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
                             "overrides": [{"batch_max": 8, "num_warps": 4}, {"batch_min": 9, "num_warps": 8}]}  # fmt: skip
    return {k: validate_config(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--replays", type=int, default=0, help="replays per sample (0: the worker default, >= 20 and >= 25 ms)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--shape", default="v4flash")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    env = {"TARGET_CTAS": "512"}
    configs = space()
    arms = {name: ("ab", cfg) for name, cfg in configs.items()}
    arms["A2 (baseline, second worker)"] = ("aa", configs["BT16/w4/s2"])
    levels = [{"batch": b, "context": args.context, "shape": args.shape, "heads": 16, "page_size": 64} for b in BATCHES]

    t0 = time.time()
    workers, setups = {}, {}
    header = None
    for name, (_kind, cfg) in arms.items():
        w = WorkerProcess(env=env, label=name)
        hello = w.request("hello", env_keys=sorted(env))
        if header is None:
            header = {"type": "header", "kernel": "mla_decode", "fingerprint": hello["fingerprint"],
                      "harness_hash": hello["harness_hash"], "env": hello["env"], "rounds": args.rounds,
                      "replays": args.replays, "levels": levels, "configs": configs, "created": time.time()}  # fmt: skip
        if "copy_gbps" not in header:
            header["copy_gbps"] = w.request("copy_bandwidth", mib=2048)["gbps"]
        workers[name] = (w, hello)
        for lv in levels:
            s = w.request("setup", kernel="mla_decode", config=cfg, level=lv, seed=zlib.crc32(name.encode()) % 1000)
            if not s["correct"]:
                raise SystemExit(f"{name} incorrect at {lv}: rel err {s['rel_err']}")
            setups[(name, s["level"])] = s
            header.setdefault("kernel_hash", s["kernel_hash"])
            header.setdefault("reference_hash", s["reference_hash"])
        print(f"# set up {name} ({config_hash(cfg)}) pid {hello['pid']} at {time.time() - t0:.0f}s", flush=True)
    header["setup_s"] = time.time() - t0

    lines = [header]
    names = list(arms)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        if r % 2:
            order.reverse()
        for name in order:
            kind, cfg = arms[name]
            w, hello = workers[name]
            for lv in levels:
                s = setups[(name, f"{lv['shape']}/h{lv['heads']}/p{lv['page_size']}/ctx{lv['context']}/b{lv['batch']}")]
                t_req = time.perf_counter()
                smp = w.request("sample", key=s["key"], replays=args.replays)
                wall = time.perf_counter() - t_req
                lines.append({
                    "type": "sample", "kind": kind, "arm": name, "round": r, "config_hash": config_hash(cfg),
                    "level": s["level"], "level_spec": lv, "us": smp["us"], "us_min": smp["us_min"],
                    "us_max": smp["us_max"], "replays": smp["replays"], "gpu_s": smp["gpu_s"],
                    "request_wall_s": wall, "worker_wall_s": smp["worker_wall_s"], "t": smp["t"],
                    "env": hello["env"], "derived_env": s["derived_env"], "launches": s["launches_per_replay"],
                    "bytes": s["bytes"], "pid": hello["pid"],
                })  # fmt: skip
        print(f"# round {r + 1}/{args.rounds} at {time.time() - t0:.0f}s", flush=True)
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
