"""The wide correctness gate for a config file of the MLA decode kernel, on a GPU.

    python benchmarks/mla_gate.py [--config kernels/configs/mla_decode.json] [--out gate.json]

For every override of the config (resolved at batches 1, 8, 32 and 96), both shapes (V3 576/512 and
V4-Flash 512/512), bf16 and fp16, page sizes 1, 16 and 64, and varied lengths (one request at the full
context, the others random): the kernel with its own split rule and with one split, each into an output
filled with NaN first, against the float32 reference under the level's tolerance and error-norm bound
(agent/tools/compare.judge).  Exit 1 on any mismatch.  Standard library + torch + triton only (the GPU machine runs it as it is).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from kinv.agent.tools.worker import compare
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.launch_config import describe, load_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "kernels/configs/mla_decode.json"))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out")
    args = ap.parse_args()
    adapter = get_adapter("mla_decode")
    config = load_config(args.config, "mla_decode")
    rows, failed = [], 0
    for batch, shape, dtype, page in itertools.product((1, 8, 32, 96), ("v3", "v4flash"),
                                                       (torch.bfloat16, torch.float16), (1, 16, 64)):  # fmt: skip
        level = adapter.level({"shape": shape, "heads": 16, "page_size": page, "context": args.context, "batch": batch})
        params = adapter.params_for(config, level)
        inputs = adapter.make_inputs(level, seed=batch * 101 + page, dtype=dtype, vary_lengths=True)
        ref = adapter.reference(inputs)
        for split in ("own", "one"):
            out = torch.full_like(ref, float("nan"), dtype=dtype)
            adapter.launch(inputs, params, out=out, target_ctas=1 if split == "one" else None)
            torch.cuda.synchronize()
            got = compare.judge(adapter, level, out, ref)  # the level's tolerance and error-norm bound
            rows.append({"batch": batch, "shape": shape, "dtype": str(dtype).split(".")[-1], "page_size": page,
                         "splits": split, "params": params.short(), "mismatched": got["mismatched"],
                         "max_abs_err": got["max_abs_err"], "rel_err": got["rel_err"], "norm": got["norm"],
                         "ok": got["ok"]})  # fmt: skip
            failed += not got["ok"]
            if not got["ok"]:
                print(f"FAIL b{batch} {shape} {dtype} page {page} splits {split} {params.short()}: {got['reason']}")
        del inputs, ref
    print(f"gate {describe(config)} at context {args.context}: {len(rows) - failed}/{len(rows)} cases pass "
          f"(max abs err {max(r['max_abs_err'] for r in rows):.3g}, max relative error "
          f"{max(r['rel_err'] for r in rows):.2e} under bounds {sorted({r['norm'] for r in rows})})")
    if args.out:
        Path(args.out).write_text(json.dumps({"config": config, "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
