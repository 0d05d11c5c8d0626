"""PyTorch's batched outer-product Triton kernel (torch/_native/ops/bmm_outer_product/triton_kernels.py, BSD-3-Clause),
imported from the installed torch and declared with kinv.plugin.kernel: its two block sizes are the tunables."""

import torch
import triton
from torch._native.ops.bmm_outer_product.triton_kernels import _bmm_outer_product_kernel

from kinv import plugin


def make_inputs(level, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(level.B, level.M, 1, generator=g).to(device=device, dtype=dtype),
            "b": torch.randn(level.B, 1, level.N, generator=g).to(device=device, dtype=dtype)}  # fmt: skip


def launch(inputs, p, out=None):
    a, b = inputs["a"], inputs["b"]
    (nb, m, _), n = a.shape, b.shape[2]
    out = torch.empty(nb, m, n, dtype=a.dtype, device=a.device) if out is None else out
    grid = (nb * triton.cdiv(m, p.BLOCK_M) * triton.cdiv(n, p.BLOCK_N),)
    _bmm_outer_product_kernel[grid](a, b, out, nb, m, n, a.stride(0), a.stride(1), b.stride(0), b.stride(2),
                                    *out.stride(), BLOCK_M=p.BLOCK_M, BLOCK_N=p.BLOCK_N, num_warps=p.num_warps)  # fmt: skip
    return out


def reference(inputs):
    return inputs["a"].float() @ inputs["b"].float()


TorchOuterProduct = plugin.kernel(
    "torch_outer_product",
    tunables={"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [32, 64, 128], "num_warps": [4, 8]},
    default={"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4},  # what torch picks at M > 192, N >= 128
    levels=[{"B": 64, "M": 512, "N": 512}, {"B": 512, "M": 64, "N": 256}],
    make_inputs=make_inputs, launch=launch, reference=reference,
)  # fmt: skip
