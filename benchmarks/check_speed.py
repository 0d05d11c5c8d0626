"""What trust costs: a check of the outputs a timed sample left, and the fresh inputs' fill, per kernel and level.

For each kernel and level: one arm of the cuda backend is set up, timed for ``--rounds`` samples, and after each
sample the outputs its timed replays left are judged (the driver's ``verify``: the worker hands them over, the
judge makes the inputs those replays read and compares on the GPU).  Printed per level: the median wall time of a
check (worker's share and judge's share), how the outputs travelled (CUDA IPC or a file), a sample's time with and
without the fills (``us``, ``us_raw``, ``refresh_us``), and whether NVML watched the samples.

    python benchmarks/check_speed.py --out check_speed.json
    python benchmarks/check_speed.py --kernel quick_rmsnorm --levels '{"rows": 16384}'

Needs a GPU (one line and exit 2 without one).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

DEFAULT = {
    "mla_decode": [{"shape": "v4flash", "heads": 16, "page_size": 64, "context": 4096, "batch": b} for b in (1, 32)],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", action="append", help="kernel name (default: mla_decode)")
    ap.add_argument("--levels", action="append", help="a level as JSON (default: the kernel's own list)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    from kinv.agent.tools.backends.base import gpu_visible

    if not gpu_visible():
        print("check_speed: no CUDA GPU visible; this benchmark times checks on a GPU", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from kinv.agent.tools.backends import cuda
    from kinv.agent.tools.worker import judge
    from kinv.kernels.adapter import get_adapter

    be = cuda.CudaBackend()
    rows = []
    for kernel in args.kernel or ["mla_decode"]:
        adapter = get_adapter(kernel)
        levels = [json.loads(x) for x in args.levels] if args.levels else DEFAULT.get(kernel, [])
        config = json.loads(adapter.ensure_config().read_text())  # the live file, as shipped
        for spec in levels:
            level = adapter.level(spec)
            arm = be.open("A", kernel, config, {})
            t0 = time.perf_counter()
            setup = arm.setup(level)
            setup_s = time.perf_counter() - t0
            samples, checks = [], []
            for r in range(args.rounds):
                samples.append(arm.sample(level, r))
                before = arm.verify_s
                arm.verify(level, f"round {r + 1}")
                checks.append(arm.verify_s - before)
            arm.close()
            row = {
                "kernel": kernel, "level": level.key, "input_sets": setup.get("l2"), "setup_s": round(setup_s, 3),
                "check_ms_median": round(1000 * statistics.median(checks[1:] or checks), 2),
                "check_ms_first": round(1000 * checks[0], 2), "checks": len(checks),
                "outputs_via": "CUDA IPC" if cuda._IPC[0] else "file",
                "us": round(statistics.median(s["us"] for s in samples), 3),
                "us_raw": round(statistics.median(s["us_raw"] for s in samples), 3),
                "refresh_us": round(statistics.median(s["refresh_us"] for s in samples), 3),
                "sample_wall_s": round(statistics.median(s["request_wall_s"] for s in samples), 4),
                "gpu_s_per_sample": round(statistics.median(s["gpu_s"] for s in samples), 4),
                "foreign": [s["foreign"] for s in samples if s.get("foreign")],
                "nvml": cuda.watch_note() or "watched every sample",
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    be.close()
    judge.close()
    gpu = __import__("torch").cuda.get_device_properties(0).name
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": gpu, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
