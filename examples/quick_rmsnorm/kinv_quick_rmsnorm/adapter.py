"""The quick_rmsnorm kernel's whole kinv adapter, declared with kinv.kernels.quick.

The input that changes from one step of a model to the next is ``x`` (the activations); the weight ``w`` and
``eps`` stay.  ``fresh_inputs`` names it: kinv's timing harness writes new values into ``x`` before every timed
launch (left undeclared, it would refresh the smallest float input, the weight, and a 32 MB ``x`` could sit in L2).
"""

import torch
import triton

from kinv.kernels import quick
from kinv_quick_rmsnorm.kernel import rmsnorm_kernel


def make_inputs(level, seed, device, dtype):
    torch.manual_seed(seed)
    return {"x": torch.randn(level.rows, level.hidden, device=device, dtype=dtype),
            "w": (1.0 + 0.1 * torch.randn(level.hidden, device=device)).to(dtype), "eps": 1e-6}


def launch(inputs, p, out=None):
    x, w = inputs["x"], inputs["w"]
    rows, hidden = x.shape
    out = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(rows, p.ROWS_PER_PROGRAM),)
    rmsnorm_kernel[grid](x, w, out, rows, hidden, x.stride(0), out.stride(0), inputs["eps"], BLOCK_N=p.BLOCK_N,
                         ROWS_PER_PROGRAM=p.ROWS_PER_PROGRAM, ONE_PASS=p.BLOCK_N >= hidden, num_warps=p.num_warps)
    return out


def reference(inputs):
    x = inputs["x"].float()
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + inputs["eps"]) * inputs["w"].float()


QuickRmsnorm = quick.kernel(
    "quick_rmsnorm",
    tunables={"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "ROWS_PER_PROGRAM": [1, 2, 4], "num_warps": [2, 4, 8, 16]},
    restrictions=["BLOCK_N * ROWS_PER_PROGRAM <= 2048 * num_warps"],
    default={"BLOCK_N": 4096, "ROWS_PER_PROGRAM": 1, "num_warps": 4},
    levels=[{"rows": 4096, "hidden": 4096}, {"rows": 8192, "hidden": 4096}, {"rows": 16384, "hidden": 4096}],
    stand_in={"hidden": 4096},  # on CPU: 64 rows at the real hidden size, so both of the kernel's paths run
    make_inputs=make_inputs, launch=launch, reference=reference, dtype="bfloat16",
    fresh_inputs=("x",),  # the activations change every step; the weight (the smallest input) does not
)
