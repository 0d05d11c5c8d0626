"""Shared-memory estimate vs the compiled kernel, on a GPU.

    python benchmarks/lab/smem_check.py --out benchmarks/results/smem_check_h200.json

Compiles stage 1 for BLOCK_T 16/32 x BLOCK_H 16/32 x num_warps 4/8 x
num_stages 1/2/3 x both shapes (64 heads) and compares the compiled shared
memory with ``stage1_smem_estimate``.  BLOCK_H 32 was not used to fit the
model, so it is an out-of-sample check.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kinv.kernels.devices import detect  # noqa: E402
from kinv.kernels.mla_decode_adapter import MLADecodeAdapter, mla_params  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    adapter, device, rows = MLADecodeAdapter(), detect(), []
    for shape, bt, bh, w, s in itertools.product(("v3", "v4flash"), (16, 32), (16, 32), (4, 8), (1, 2, 3)):
        level = adapter.level({"batch": 2, "context": 256, "shape": shape, "heads": 64, "page_size": 16})
        params = mla_params(bt, bh, w, s)
        inputs = adapter.make_inputs(level, seed=1)
        _, compiled = adapter.launch(inputs, params)
        res = adapter.resources(params, level, device, compiled)
        err = (res.smem_estimate - res.smem_compiled) / res.smem_compiled
        rows.append({"shape": shape, "params": dict(params), "estimate": res.smem_estimate,
                     "compiled": res.smem_compiled, "rel_err": err, "registers": res.registers,
                     "spills": res.spills, "occupancy": res.occupancy})  # fmt: skip
        print(f"{shape:8s} {params.short():18s} est {res.smem_estimate:7d} compiled {res.smem_compiled:7d} "
              f"{err * 100:+6.1f}%  regs {res.registers} spills {res.spills} "
              f"ctas/SM {res.occupancy['ctas_per_sm']} ({res.occupancy['limited_by']})", flush=True)
    worst = max(abs(r["rel_err"]) for r in rows)
    print(f"# worst relative error {worst * 100:.1f}% over {len(rows)} configs")
    Path(args.out).write_text(json.dumps({"device": device.to_dict(), "rows": rows, "worst": worst}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
