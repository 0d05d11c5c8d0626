"""Probe of the transposed-products attempt (benchmarks/lab/patches/8a-swap-ab.diff) on a GPU, one config per process.

    git apply benchmarks/lab/patches/8a-swap-ab.diff && python benchmarks/lab/swap_ab_probe.py; git apply -R benchmarks/lab/patches/8a-swap-ab.diff

For each config: V3 576/512, 16 heads, page 64, context 4096, at batch 1 and 64, the kernel against the float32
reference (bf16); a crash of the child process is reported as such.  Standard library + torch + triton.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, json, torch
sys.path.insert(0, {root!r})
from kinv.kernels.adapter import get_adapter
from kinv.kernels.mla_decode_adapter import mla_params
a = get_adapter("mla_decode")
cfg = json.loads(sys.argv[1]); b = int(sys.argv[2])
lv = a.level({{"shape": "v3", "heads": 16, "page_size": 64, "context": 4096, "batch": b}})
x = a.make_inputs(lv, seed=3, vary_lengths=True)
out, compiled = a.launch(x, mla_params(**cfg))
torch.cuda.synchronize()
ref = a.reference(x)
err = float((out.float() - ref).abs().max())
print(json.dumps({{"max_abs_err": err, "regs": getattr(compiled, "n_regs", None),
                  "spills": getattr(compiled, "n_spills", None)}}))
"""


def main() -> int:
    configs = [dict(BLOCK_T=64, num_warps=4, num_stages=s, CTAS_PER_SM=2, TMA=t) for s in (1, 2) for t in (0, 1)]
    configs += [dict(BLOCK_T=64, num_warps=8, num_stages=2, CTAS_PER_SM=2)]
    for cfg in configs:
        for b in (1, 64):
            r = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), json.dumps(cfg), str(b)],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
            said = r.stdout.strip().splitlines()[-1] if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{cfg} b{b}: rc {r.returncode} {said[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
