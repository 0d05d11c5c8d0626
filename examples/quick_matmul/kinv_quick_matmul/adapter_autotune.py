"""The same matmul from its @triton.autotune kernel: kinv.kernels.quick.from_autotune makes the configs the space
and the autotune key (M, N, K) the level dimensions."""

import torch
import triton

from kinv.kernels import quick
from kinv_quick_matmul.adapter import flops, make_inputs, reference
from kinv_quick_matmul.kernel import matmul_autotuned


def launch(inputs, p, out=None):
    a, b = inputs["a"], inputs["b"]
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=a.dtype) if out is None else out
    grid = lambda meta: (triton.cdiv(m, meta["TILE_M"]), triton.cdiv(n, meta["TILE_N"]))  # noqa: E731
    matmul_autotuned[grid](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride())
    return out


QuickMatmulAutotune = quick.from_autotune(
    "quick_matmul_autotune", matmul_autotuned,
    levels=[{"M": 512, "N": 512, "K": 512}, {"M": 2048, "N": 2048, "K": 2048}, {"M": 128, "N": 4096, "K": 4096}],
    make_inputs=make_inputs, launch=launch, reference=reference, flops=flops, dtype="float16",
)
