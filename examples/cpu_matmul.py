"""A real CPU workload whose knob matters on a 2-core machine: numpy's float32 matmul (OpenBLAS), n x n, timed
for a fixed wall budget after a warm-up, printing its throughput as JSON.  Its thread count comes from
OMP_NUM_THREADS, which OpenBLAS reads when the process starts, as a serving process reads its knobs.  numpy
rather than torch: the process starts in a fraction of a second, so the timed budget dominates each run.

    OMP_NUM_THREADS=2 python examples/cpu_matmul.py --n 512
    {"n": 512, "omp_num_threads": "2", "gflops": 168.4, "calls": 950}
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=0.4, help="timed wall budget after the warm-up")
    a = ap.parse_args()
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, a.n), dtype=np.float32)
    y = rng.standard_normal((a.n, a.n), dtype=np.float32)
    for _ in range(3):  # warm: the allocator and the BLAS threads
        x @ y
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < a.seconds:
        x @ y
        calls += 1
    print(json.dumps({"n": a.n, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                      "gflops": round(2 * a.n**3 * calls / elapsed / 1e9, 3), "calls": calls}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
