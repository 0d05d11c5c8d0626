"""Sweep of the MLA decode kernel on a GPU: baseline at every level, config search.

    python benchmarks/lab/mla_decode_sweep.py --out benchmarks/results/mla_decode_sweep_h200.json

Standard library + the worker (torch, triton) only, so it runs on the GPU
machine as it is.  Every figure comes from ``agent/tools/bench_worker.py``
(CUDA-graph replay, L2 rotation, correctness checked before timing); the
results file holds the device fingerprint, the copy bandwidth measured in the
same run, each config, its compiled resources and each level's samples.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kinv.agent.tools.worker_client import WorkerProcess  # noqa: E402
from kinv.kernels.errors import WorkerError  # noqa: E402

BATCHES = (1, 8, 32, 64, 96)
CONTEXTS = (4096, 16384)
SHAPES = ("v3", "v4flash")


def cfg(bt, w, s, bh=16):
    return {"kernel": "mla_decode", "BLOCK_T": bt, "BLOCK_H": bh, "num_warps": w, "num_stages": s}


def measure(worker, config, level, samples, replays):
    setup = worker.request("setup", kernel="mla_decode", config=config, level=level)
    row = {"config": config, "level": level, "setup": setup}
    if setup["correct"]:
        us = [worker.request("sample", key=setup["key"], replays=replays)["us"] for _ in range(samples)]
        row["samples_us"] = us
        row["us"] = statistics.median(us)
        row["gbps"] = setup["bytes"] / (row["us"] * 1e-6) / 1e9
        worker.request("drop", key=setup["key"])
    return row


def save(path, result) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--replays", type=int, default=0, help="replays per sample (0: the worker default, >= 20 and >= 25 ms)")
    ap.add_argument("--search", default="v3:4096,v4flash:4096", help="shape:context pairs for the config search")
    ap.add_argument("--target-ctas", default="512")
    args = ap.parse_args()

    t0 = time.time()
    result = {"started": t0, "target_ctas": args.target_ctas, "baseline": [], "search": []}
    with WorkerProcess(env={"TARGET_CTAS": args.target_ctas}, label="sweep") as w:
        hello = w.request("hello", env_keys=["TARGET_CTAS"])
        result["fingerprint"] = hello["fingerprint"]
        result["env"] = hello["env"]
        result["harness_hash"] = hello["harness_hash"]
        copy = w.request("copy_bandwidth", mib=2048)
        result["copy_gbps"] = copy["gbps"]
        print(f"# {hello['fingerprint']['gpu']}  copy bandwidth {copy['gbps']:.0f} GB/s", flush=True)

        base = json.loads((Path(__file__).resolve().parents[2] / "kernels/configs/mla_decode.json").read_text())
        base.pop("description", None)
        for shape, ctx, b in itertools.product(SHAPES, CONTEXTS, BATCHES):
            level = {"batch": b, "context": ctx, "shape": shape, "heads": 16, "page_size": 64}
            row = measure(w, base, level, args.samples, args.replays)
            result["baseline"].append(row)
            save(args.out, result)
            print(f"baseline {shape:8s} ctx{ctx:6d} b{b:3d} {row.get('us', float('nan')):9.1f} us "
                  f"{row.get('gbps', 0):7.0f} GB/s correct={row['setup']['correct']}", flush=True)  # fmt: skip

        space = [cfg(bt, wp, st) for bt in (16, 32, 64) for wp in (4, 8) for st in (1, 2, 3)]
        for pair in args.search.split(","):
            shape, ctx = pair.split(":")
            for config in space:
                for b in BATCHES:
                    level = {"batch": b, "context": int(ctx), "shape": shape, "heads": 16, "page_size": 64}
                    try:
                        row = measure(w, config, level, max(3, args.samples // 2), args.replays)
                    except WorkerError as exc:
                        row = {"config": config, "level": level, "error": str(exc)}
                    result["search"].append(row)
                    save(args.out, result)
                    r = row.get("setup", {}).get("resources", {})
                    print(f"search BT{config['BLOCK_T']}/w{config['num_warps']}/s{config['num_stages']} "
                          f"{shape} ctx{ctx} b{b:3d} {row.get('us', float('nan')):9.1f} us "
                          f"smem est {r.get('smem_estimate')} compiled {r.get('smem_compiled')} "
                          f"regs {r.get('registers')} spills {r.get('spills')} "
                          f"{row.get('error', '')}", flush=True)  # fmt: skip
    result["wall_s"] = time.time() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"# wrote {args.out} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
