"""The Triton kernel: C = A @ B, one program per TILE_M x TILE_N tile of C, TILE_K of the reduction per step,
accumulated in float32.  ``matmul_autotuned`` is the same kernel under ``@triton.autotune`` (its configs and key
are what kinv.kernels.quick.from_autotune reads)."""

import triton
import triton.language as tl


@triton.jit
def matmul_kernel(A, B, C, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  TILE_M: tl.constexpr, TILE_N: tl.constexpr, TILE_K: tl.constexpr):
    rm = tl.program_id(0) * TILE_M + tl.arange(0, TILE_M)
    rn = tl.program_id(1) * TILE_N + tl.arange(0, TILE_N)
    acc = tl.zeros([TILE_M, TILE_N], dtype=tl.float32)
    for k0 in range(0, K, TILE_K):
        rk = k0 + tl.arange(0, TILE_K)
        a = tl.load(A + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(B + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * scm + rn[None, :] * scn, acc.to(C.dtype.element_ty), mask=mask)


CONFIGS = [
    triton.Config({"TILE_M": 64, "TILE_N": 64, "TILE_K": 32}, num_warps=4, num_stages=2),
    triton.Config({"TILE_M": 64, "TILE_N": 128, "TILE_K": 32}, num_warps=4, num_stages=3),
    triton.Config({"TILE_M": 128, "TILE_N": 128, "TILE_K": 32}, num_warps=8, num_stages=3),
    triton.Config({"TILE_M": 128, "TILE_N": 64, "TILE_K": 64}, num_warps=8, num_stages=2),
]
matmul_autotuned = triton.autotune(configs=CONFIGS, key=["M", "N", "K"])(matmul_kernel)
