"""Launch the shipped MLA config at a few levels, for Nsight Compute (what the fixed cost per launch is).

    ncu --clock-control none --kernel-name regex:_mla_decode --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/lab/mla_profile.py --level v3/4096/32

    bash benchmarks/lab/mla_profile.sh   # the levels of the goal that miss 80%, one report each, on the GPU

Every launch gets a KV cache of its own from a set larger than L2, as the worker's timing does, so the profiled
launch reads its KV from memory.  It runs the correctness gate (``agent/tools/correctness.check``) at the level
first, so that a profile is never of a wrong kernel.  Standard library, torch and triton only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kinv.agent.tools import correctness  # noqa: E402
from kinv.kernels.adapter import get_adapter  # noqa: E402

L2_BYTES = 60 * 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", default="v3/4096/32", help="shape/context/batch, e.g. v3/4096/32")
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[2] / "kernels/configs/mla_decode.json"))
    ap.add_argument("--launches", type=int, default=8)
    args = ap.parse_args()
    try:
        shape, ctx, batch = args.level.split("/")
        dims = {"batch": int(batch), "context": int(ctx), "shape": shape, "heads": 16, "page_size": 64}
    except ValueError:
        print(f"kinv: --level {args.level!r} is not shape/context/batch (e.g. v3/4096/32)", file=sys.stderr)
        return 2
    import torch

    adapter = get_adapter("mla_decode")
    try:
        level = adapter.level(dims)
        config = adapter.validate_config(json.loads(Path(args.config).read_text()))
        params = adapter.params_for(config, level)
        first = adapter.make_inputs(level, seed=0)
    except (OSError, ValueError) as exc:
        print(f"kinv: {exc}", file=sys.stderr)
        return 2
    kv_bytes = first["kv_cache"].numel() * first["kv_cache"].element_size()
    sets = [first] + [adapter.make_inputs(level, seed=i) for i in range(1, max(2, 1 + 3 * L2_BYTES // kv_bytes))]
    gate = correctness.check(adapter, config, [level], seed=0, device="cuda")
    if not gate["ok"]:
        print(f"kinv: {params.short()} at {level.key} fails the correctness check ({gate['reason']}); not profiling it",
              file=sys.stderr)  # fmt: skip
        return 1
    err = gate["levels"][0]["max_abs_err"]
    out, _ = adapter.launch(first, params)
    scratch = adapter.make_scratch(first, params)
    for i in range(args.launches):
        adapter.launch(sets[i % len(sets)], params, out=out, scratch=scratch)
    torch.cuda.synchronize()
    print(f"{level.key}: {params.short()}, {args.launches} launches over {len(sets)} input sets, max abs err {err:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
