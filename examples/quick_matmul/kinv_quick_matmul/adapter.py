"""The quick_matmul kernel's whole kinv adapter, declared with kinv.plugin.kernel."""

import torch
import triton

from kinv import plugin
from kinv_quick_matmul.kernel import matmul_kernel


def make_inputs(level, seed, device, dtype):
    torch.manual_seed(seed)
    return {"a": torch.randn(level.M, level.K, device=device, dtype=dtype),
            "b": torch.randn(level.K, level.N, device=device, dtype=dtype)}


def launch(inputs, p, out=None):
    a, b = inputs["a"], inputs["b"]
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=a.dtype) if out is None else out
    grid = (triton.cdiv(m, p.TILE_M), triton.cdiv(n, p.TILE_N))
    matmul_kernel[grid](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride(), TILE_M=p.TILE_M,
                        TILE_N=p.TILE_N, TILE_K=p.TILE_K, num_warps=p.num_warps, num_stages=p.num_stages)
    return out


def reference(inputs):
    return inputs["a"].float() @ inputs["b"].float()


def flops(level):
    return 2 * level.M * level.N * level.K


QuickMatmul = plugin.kernel(
    "quick_matmul",
    tunables={"TILE_M": [32, 64, 128], "TILE_N": [32, 64, 128], "TILE_K": [32, 64], "num_warps": [4, 8],
              "num_stages": [2, 3, 4]},
    restrictions=["TILE_M * TILE_N <= 2048 * num_warps"],
    default={"TILE_M": 64, "TILE_N": 64, "TILE_K": 32, "num_warps": 4, "num_stages": 2},
    levels=[{"M": 512, "N": 512, "K": 512}, {"M": 2048, "N": 2048, "K": 2048}, {"M": 128, "N": 4096, "K": 4096}],
    make_inputs=make_inputs, launch=launch, reference=reference, flops=flops, dtype="float16",
)
