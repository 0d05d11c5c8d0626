"""The same PyTorch kernel (torch/_native/ops/bmm_outer_product/triton_kernels.py, BSD-3-Clause) under
@triton.autotune, through kinv.plugin.from_autotune.  No installed package ships an @triton.autotune kernel
that imports without a GPU (torch's own are in torch.testing._internal.triton_utils, defined only where torch sees
a Triton device), so the configs here are torch's own block-size choices (its _pick_block_sizes), put into
triton.autotune around torch's unmodified kernel.  The key is (M, N); the batch B is a level dimension beyond it."""

import torch
import triton
from torch._native.ops.bmm_outer_product.triton_kernels import _bmm_outer_product_kernel

from kinv import plugin

outer_product_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4) for m in (32, 64, 128) for n in (64, 128)],
    key=["M", "N"],
)(_bmm_outer_product_kernel)


def make_inputs(level, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(level.B, level.M, 1, generator=g).to(device=device, dtype=dtype),
            "b": torch.randn(level.B, 1, level.N, generator=g).to(device=device, dtype=dtype)}  # fmt: skip


def launch(inputs, p, out=None):
    a, b = inputs["a"], inputs["b"]
    (nb, m, _), n = a.shape, b.shape[2]
    out = torch.empty(nb, m, n, dtype=a.dtype, device=a.device) if out is None else out
    grid = lambda meta: (nb * triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    outer_product_autotuned[grid](a, b, out, nb, m, n, a.stride(0), a.stride(1), b.stride(0), b.stride(2),
                                  *out.stride())  # fmt: skip
    return out


def reference(inputs):
    return inputs["a"].float() @ inputs["b"].float()


TorchOuterProductAutotune = plugin.from_autotune(
    "torch_outer_product_autotune", outer_product_autotuned,
    levels=[{"M": 512, "N": 512, "B": 64}, {"M": 64, "N": 256, "B": 512}],  # B: beyond the autotune key
    make_inputs=make_inputs, launch=launch, reference=reference, stand_in={"B": 2, "M": 48, "N": 40},
)  # fmt: skip
