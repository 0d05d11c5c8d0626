"""Where a small-batch launch of the MLA decode kernel spends its time: the shipped file's two stages timed apart
and together, beside the floor (one grid reading the same KV) and an empty kernel, on one card.

    python benchmarks/mla_anatomy.py --out anatomy.json [--batches 1,8,32] [--contexts 4096,16384]

Timed as benchmarks/mla_peer.py times (CUDA graphs over input sets past L2, rounds interleaved, medians). "stage 1"
is the shipped launch with the merge kernel's launch left out (its partial outputs are written and never merged);
"stage 2" is the merge alone over partial outputs already written.  Needs a GPU; torch, triton and the standard
library only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from mla_peer import ROOT, floor_launcher, graph_us  # noqa: E402


@triton.jit
def _empty(X):
    pass


class _NoLaunch:
    """A kernel whose launches do nothing: the merge kernel, left out of "stage 1"."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def measure(adapter, config, ctx: int, b: int, rounds: int, l2: int) -> dict:
    """One level's arms, timed in turn ``rounds`` times: their median µs per launch."""
    import torch

    from kinv.kernels import mla_decode
    from kinv.kernels.mla_decode_adapter import capped_launch

    dummy = torch.empty(1, device="cuda")
    level = adapter.level({"batch": b, "context": ctx, "shape": "v3", "heads": 16, "page_size": 64})
    params = adapter.params_for(config, level)
    kv_bytes = b * ctx * 576 * 2
    sets = max(2, min(64, math.ceil(3 * l2 / kv_bytes)))
    inputs = [adapter.make_inputs(level, seed=5 + i) for i in range(sets)]
    outs = [adapter.make_output(x, params) for x in inputs]
    scratches = [adapter.make_scratch(x, params) for x in inputs]
    splits = scratches[0]["partial_o"].shape[2]

    def both(i):
        return lambda: adapter.launch(inputs[i], params, out=outs[i], scratch=scratches[i])

    def stage1(i):
        # the launch function the adapter calls (the source's own, or its copy under the config's register cap and
        # merge blocks): the merge kernel is left out of the globals that function sees
        scope = capped_launch(params.get("maxnreg", 0), params.get("MERGE_BLOCK_DV", 0),
                              params.get("MERGE_BLOCK_S", 0)).__globals__  # fmt: skip

        def run():
            real = scope["_mla_decode_stage2"]
            scope["_mla_decode_stage2"] = _NoLaunch()
            try:
                adapter.launch(inputs[i], params, out=outs[i], scratch=scratches[i])
            finally:
                scope["_mla_decode_stage2"] = real

        return run

    def stage2(i):
        po, pl, o = scratches[i]["partial_o"], scratches[i]["partial_lse"], outs[i]
        block_dv = min(params.get("MERGE_BLOCK_DV", 0) or mla_decode.STAGE2_BLOCK_DV, 512)
        block_s = params.get("MERGE_BLOCK_S", 0) or mla_decode.STAGE2_BLOCK_S

        def run():
            mla_decode._mla_decode_stage2[(b, 16, 512 // block_dv)](
                po, pl, o, splits, po.stride(0), po.stride(1), po.stride(2), pl.stride(0), pl.stride(1),
                o.stride(0), o.stride(1), BLOCK_S=min(block_s, triton.next_power_of_2(splits)),
                BLOCK_DV=block_dv, num_warps=4, num_stages=1,
            )  # fmt: skip

        return run

    arms = {"both stages": [both(i) for i in range(sets)], "stage 1": [stage1(i) for i in range(sets)],
            "empty kernel": [lambda: _empty[(1,)](dummy)] * sets}  # fmt: skip
    if not params.get("MERGE", 0):
        arms["stage 2"] = [stage2(i) for i in range(sets)]
    if b == 1:
        arms["floor"] = [floor_launcher(x["kv_cache"][x["block_table"][0].long()]) for x in inputs]
    for fns in arms.values():
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in arms}
    for _ in range(rounds):
        for k, fns in arms.items():
            times[k].append(graph_us(fns, 20))
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {
        "context": ctx,
        "batch": b,
        "splits": splits,
        "us": med,
        "params": {k: params.get(k, 0) for k in ("BLOCK_T", "num_warps", "num_stages", "TMA", "MERGE")},
    }
    print(f"v3 ctx{ctx} b{b} splits {splits}: " + "  ".join(f"{k} {v:.2f} us" for k, v in med.items()),
          flush=True)  # fmt: skip
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="4096,16384")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("mla_anatomy.py needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter("mla_decode")
    config = adapter.validate_config(json.loads((ROOT / "kernels/configs/mla_decode.json").read_text()))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {"gpu": torch.cuda.get_device_name(0), "levels": []}
    for ctx in map(int, args.contexts.split(",")):
        for b in map(int, args.batches.split(",")):
            row = measure(adapter, config, ctx, b, args.rounds, l2)
            out["levels"].append(row)
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
