"""A real CPU workload whose knob matters on a 2-core machine: torch's float32 matmul, n x n, timed for a fixed
wall budget after a warm-up, printing its throughput as JSON.  Its thread count comes from OMP_NUM_THREADS, read
by torch at start, as a serving process reads its knobs.

    OMP_NUM_THREADS=2 python examples/cpu_matmul.py --n 512
    {"n": 512, "threads": 2, "gflops": 61.3, "calls": 412}
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=0.4, help="timed wall budget after the warm-up")
    a = ap.parse_args()
    import torch

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(a.n, a.n, generator=g), torch.randn(a.n, a.n, generator=g)
    for _ in range(3):  # warm: the allocator and the BLAS threads
        torch.mm(x, y)
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < a.seconds:
        torch.mm(x, y)
        calls += 1
    print(json.dumps({"n": a.n, "threads": torch.get_num_threads(), "gflops": round(2 * a.n**3 * calls / elapsed / 1e9, 3),
                      "calls": calls}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
