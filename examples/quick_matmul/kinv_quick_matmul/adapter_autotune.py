"""The same matmul from its @triton.autotune kernel: kinv.plugin.from_autotune makes the configs the space
and the autotune key (M, N, K) the level dimensions.  Self-contained: nothing is borrowed from adapter.py."""

import torch
import triton

from kinv import plugin
from kinv_quick_matmul.kernel import matmul_autotuned


def make_inputs(level, seed, device, dtype):
    torch.manual_seed(seed)
    return {"a": torch.randn(level.M, level.K, device=device, dtype=dtype),
            "b": torch.randn(level.K, level.N, device=device, dtype=dtype)}


def launch(inputs, p, out=None):
    a, b = inputs["a"], inputs["b"]
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=a.dtype) if out is None else out
    grid = lambda meta: (triton.cdiv(m, meta["TILE_M"]), triton.cdiv(n, meta["TILE_N"]))  # noqa: E731
    matmul_autotuned[grid](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride())
    return out


def reference(inputs):
    return inputs["a"].float() @ inputs["b"].float()


def flops(level):
    return 2 * level.M * level.N * level.K


QuickMatmulAutotune = plugin.from_autotune(
    "quick_matmul_autotune", matmul_autotuned,
    levels=[{"M": 512, "N": 512, "K": 512}, {"M": 2048, "N": 2048, "K": 2048}, {"M": 128, "N": 4096, "K": 4096}],
    make_inputs=make_inputs, launch=launch, reference=reference, flops=flops, dtype="float16",
)
