"""Grouped GEMM of routed MoE experts at decode batch sizes (gate+up projection).

Math
----
DeepSeek-V3-like mixture of experts: token t is routed to ``top_k`` distinct
experts ``topk_ids[t, :]``; the gate+up projection of expert e is one
``N x K`` matrix ``w[e]`` (N = 2 * intermediate, K = hidden).  For every
(token, route) pair::

    out[t, j, :] = x[t, :] @ w[topk_ids[t, j]].T        (float32 accumulation)

The routing weights ``topk_weights`` are not applied here (they scale the
down projection's output).

Grouping (vLLM's ``fused_moe``, after the "MegaBlocks" block-sparse layout of
Gale et al. 2022): :func:`moe_align` sorts the ``P = T * top_k`` pairs by
expert and pads each expert's group to a multiple of BLOCK_M with the
sentinel ``P``, so every BLOCK_M block of ``sorted_ids`` belongs to ONE
expert (``block_expert``).  An expert that no token picked gets no block, so
each active expert's weights are read once per BLOCK_N tile.  One program
computes a ``[BLOCK_M, BLOCK_N]`` tile: it gathers BLOCK_M rows of x
(``row = sorted_id // top_k``), streams ``w[e, n0:n0+BLOCK_N, :]`` in BLOCK_K
steps into a float32 ``tl.dot`` accumulator and scatters the tile to
``out`` (viewed as ``[P, N]``) at rows ``sorted_id``.  Programs are ordered
GROUP_M M-blocks at a time (the L2 swizzle of Triton's matmul tutorial, 03).

Shapes
------
x            [T, K]          bf16 / fp16 / fp32, last dim contiguous
w            [E, N, K]       dtype of x, last dim contiguous
topk_ids     [T, top_k]      int32 (int64 accepted), distinct experts per row
out          [T, top_k, N]   dtype of x

DeepSeek-V3 at decode: T 1..96, E 256 (32 per GPU at EP8), top_k 8,
K 7168, N 2 * 2048 = 4096.

Cost model (:func:`moe_bytes`, :func:`moe_flops`): the weights of the A
active experts dominate at decode, ``A * N * K`` elements, with
``A ~ E * (1 - (1 - top_k / E) ** T)`` (:func:`expected_active_experts`).

Launch parameters (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps,
num_stages) come from any object with those attributes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .moe_expert_gemm_ref import moe_expert_gemm_reference

__all__ = [
    "MoeAlign",
    "expected_active_experts",
    "max_aligned_blocks",
    "moe_align",
    "moe_bytes",
    "moe_expert_gemm",
    "moe_expert_gemm_launch",
    "moe_expert_gemm_reference",
    "moe_flops",
    "moe_make_inputs",
]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ID_DTYPES = (torch.int32, torch.int64)
TUNABLES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


# --------------------------------------------------------------------------- #
# Triton kernel
# --------------------------------------------------------------------------- #
@triton.jit
def _moe_expert_gemm_kernel(
    # pointers
    X,
    W,
    Out,
    SortedIds,
    BlockExpert,
    # sizes
    num_pairs,  # T * top_k, also the padding sentinel of SortedIds
    num_m_blocks,
    N,
    K,
    top_k,
    # strides
    stride_xt,
    stride_we,
    stride_wn,
    stride_ot,
    stride_oj,
    # meta-parameters
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # ---- pid -> (pid_m, pid_n), GROUP_M M-blocks at a time ------------------
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_m_blocks - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # ---- the block's expert; -1 marks an empty block (static-shape align) --
    expert = tl.load(BlockExpert + pid_m)
    if expert < 0:
        return

    # ---- gathered rows of x and the expert's weight tile --------------------
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(SortedIds + offs_m)
    mask_m = ids < num_pairs
    rows = (ids // top_k).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = X + rows[:, None] * stride_xt + offs_k[None, :]
    w_ptrs = W + expert.to(tl.int64) * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]

    # ---- stream K: acc[m, n] += x[m, k] * w[e, n, k] ------------------------
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        else:
            mask_k = offs_k < K - k0
            a = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    # ---- scatter the tile to out[t, j, n] at the pairs' rows ----------------
    t = rows
    j = (ids % top_k).to(tl.int64)
    out_ptrs = Out + t[:, None] * stride_ot + j[:, None] * stride_oj + offs_n[None, :]
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# --------------------------------------------------------------------------- #
# Routing metadata
# --------------------------------------------------------------------------- #
class MoeAlign(NamedTuple):
    """The (token, route) pairs sorted by expert in BLOCK_M blocks.

    ``sorted_ids``   [num_blocks * block_m] int32: pair index ``t * top_k + j``,
                     or the sentinel ``T * top_k`` for padding.
    ``block_expert`` [num_blocks] int32: the expert of every block, -1 for an
                     empty block (only with ``static_shape=True``).
    ``num_blocks``   the number of BLOCK_M blocks the kernel launches
                     (``len(block_expert)``).
    """

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_blocks: int


def max_aligned_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most BLOCK_M blocks ``num_pairs`` pairs can need: each active expert pads by < block_m.

    ``sum_e ceil(c_e / M) <= (P + A * (M - 1)) / M`` with ``A = min(E, P)`` active experts.
    """
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, *, static_shape: bool = False) -> MoeAlign:
    """Sort the ``T * top_k`` (token, route) pairs by expert, each expert padded to whole BLOCK_M blocks.

    Within an expert pairs keep their order (stable sort).  By default the
    result has exactly as many blocks as the experts need, which costs a
    host sync here (and checks that every id is in ``[0, num_experts)``).
    ``static_shape=True`` does no host sync: it sizes the result by
    :func:`max_aligned_blocks` and marks the unused trailing blocks with
    expert -1 (the kernel skips them), so the routing of a CUDA graph can
    change between replays; ids are then not range-checked.
    """
    if topk_ids.dim() != 2 or topk_ids.shape[0] < 1 or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must be [tokens, top_k] with both >= 1, got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in ID_DTYPES:
        raise ValueError(f"topk_ids dtype {topk_ids.dtype} must be torch.int32 or torch.int64")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} must be a positive integer")
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 1:
        raise ValueError(f"block_m={block_m!r} must be a positive integer")
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    if not static_shape:
        lo, hi = torch.stack(torch.aminmax(flat)).tolist()
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"topk_ids holds expert ids from {lo} to {hi}; valid ids are 0 to {num_experts - 1}")

    # ---- per-expert counts, padded to whole blocks --------------------------
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    blocks_per_expert = (counts + block_m - 1) // block_m
    padded = blocks_per_expert * block_m
    pad_start = torch.cumsum(padded, 0) - padded
    count_start = torch.cumsum(counts, 0) - counts

    # ---- destination of every pair: its expert's start + its rank there -----
    order = torch.argsort(flat, stable=True)
    expert_sorted = flat[order]
    rank = torch.arange(num_pairs, device=device) - count_start[expert_sorted]
    dest = pad_start[expert_sorted] + rank

    if static_shape:
        num_blocks = max_aligned_blocks(num_pairs, num_experts, block_m)
    else:
        num_blocks = int(blocks_per_expert.sum().item())
    sorted_ids = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))

    # ---- expert of every block: the first whose cumulative block end is > b --
    block_end = torch.cumsum(blocks_per_expert, 0)
    block_ids = torch.arange(num_blocks, dtype=torch.int64, device=device)
    block_expert = torch.searchsorted(block_end, block_ids, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return MoeAlign(sorted_ids, block_expert, num_blocks)


# --------------------------------------------------------------------------- #
# Launcher
# --------------------------------------------------------------------------- #
def _check_params(params) -> None:
    missing = [name for name in TUNABLES if not hasattr(params, name)]
    if missing:
        raise ValueError(f"params {type(params).__name__} lacks {', '.join(missing)}; it needs {', '.join(TUNABLES)}")
    for name in TUNABLES:
        value = getattr(params, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"params.{name}={value!r} must be a positive integer")
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        value = getattr(params, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"params.{name}={value} must be a power of two >= 16 (tl.dot's smallest tile)")
    if params.num_warps & (params.num_warps - 1):
        raise ValueError(f"params.num_warps={params.num_warps} must be a power of two")


def _check_inputs(x, w, topk_ids) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, hidden], got shape {tuple(x.shape)}")
    if w.dim() != 3:
        raise ValueError(f"w must be [experts, n, hidden], got shape {tuple(w.shape)}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [tokens, top_k], got shape {tuple(topk_ids.shape)}")
    tokens, hidden = x.shape
    experts, n, w_hidden = w.shape
    if tokens < 1 or hidden < 1 or experts < 1 or n < 1:
        raise ValueError(f"x {tuple(x.shape)} and w {tuple(w.shape)} must have no empty dimension")
    if w_hidden != hidden:
        raise ValueError(f"w hidden size {w_hidden} (shape {tuple(w.shape)}) differs from x's {hidden}")
    if topk_ids.shape[0] != tokens:
        raise ValueError(
            f"topk_ids has {topk_ids.shape[0]} rows (shape {tuple(topk_ids.shape)}); x has {tokens} tokens"
        )
    if not 1 <= topk_ids.shape[1] <= experts:
        raise ValueError(f"top_k={topk_ids.shape[1]} must be from 1 to the {experts} experts of w")
    if x.dtype not in DTYPES:
        raise ValueError(f"x dtype {x.dtype} must be one of {', '.join(map(str, DTYPES))}")
    if w.dtype != x.dtype:
        raise ValueError(f"w dtype {w.dtype} differs from x dtype {x.dtype}")
    if topk_ids.dtype not in ID_DTYPES:
        raise ValueError(f"topk_ids dtype {topk_ids.dtype} must be torch.int32 or torch.int64")
    if w.device != x.device or topk_ids.device != x.device:
        raise ValueError(f"x ({x.device}), w ({w.device}) and topk_ids ({topk_ids.device}) must be on one device")
    if x.stride(1) != 1 or w.stride(2) != 1:
        raise ValueError("x and w must be contiguous in their last (hidden) dimension")


def _check_align(align, block_m: int, device) -> None:
    sorted_ids, block_expert = align[0], align[1]
    if sorted_ids.dtype != torch.int32 or block_expert.dtype != torch.int32:
        raise ValueError(
            f"align holds sorted_ids {sorted_ids.dtype}, block_expert {block_expert.dtype}; both must be int32"
        )
    if sorted_ids.dim() != 1 or block_expert.dim() != 1 or sorted_ids.numel() != block_expert.numel() * block_m:
        raise ValueError(
            f"align holds sorted_ids {tuple(sorted_ids.shape)} for {tuple(block_expert.shape)} blocks; "
            f"BLOCK_M={block_m} needs {block_m} ids per block (was it built for another block_m?)"
        )
    if sorted_ids.device != device or block_expert.device != device:
        raise ValueError(f"align is on {sorted_ids.device}, the inputs on {device}")


def moe_expert_gemm_launch(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, params, *, out=None, align=None):
    """Validate, align the routes (when ``align`` is None), allocate ``out`` if not given, and launch.

    ``params`` is any object with BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    num_warps and num_stages.  ``align`` is :func:`moe_align`'s result for
    ``params.BLOCK_M``; with it (and ``out``) passed the launch makes no host
    sync, as CUDA-graph capture requires.  Returns ``(out, compiled)``; the
    compiled kernel is ``None`` under the interpreter.
    """
    _check_params(params)
    _check_inputs(x, w, topk_ids)
    tokens, hidden = x.shape
    experts, n, _ = w.shape
    top_k = topk_ids.shape[1]
    if align is None:
        align = moe_align(topk_ids, experts, params.BLOCK_M)
    _check_align(align, params.BLOCK_M, x.device)
    if out is None:
        out = torch.empty((tokens, top_k, n), dtype=x.dtype, device=x.device)
    elif out.shape != (tokens, top_k, n) or out.dtype != x.dtype or out.device != x.device or out.stride(2) != 1:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device}; this launch needs "
            f"{(tokens, top_k, n)} {x.dtype} on {x.device}, contiguous in its last dimension"
        )

    num_m_blocks = align.block_expert.numel()
    grid = (num_m_blocks * triton.cdiv(n, params.BLOCK_N),)
    compiled = _moe_expert_gemm_kernel[grid](
        x, w, out, align.sorted_ids, align.block_expert,
        tokens * top_k, num_m_blocks, n, hidden, top_k,
        x.stride(0),
        w.stride(0), w.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_M=params.BLOCK_M, BLOCK_N=params.BLOCK_N, BLOCK_K=params.BLOCK_K, GROUP_M=params.GROUP_M,
        EVEN_K=hidden % params.BLOCK_K == 0,
        num_warps=params.num_warps, num_stages=params.num_stages,
    )  # fmt: skip
    return out, compiled


def moe_expert_gemm(x: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, params, **kwargs) -> torch.Tensor:
    """Routed experts' gate+up GEMM: returns ``out [T, top_k, N]``."""
    return moe_expert_gemm_launch(x, w, topk_ids, params, **kwargs)[0]


# --------------------------------------------------------------------------- #
# Inputs and cost model
# --------------------------------------------------------------------------- #
def moe_make_inputs(tokens: int, experts: int, top_k: int, hidden: int, n: int, seed: int, device, dtype):
    """``(x, w, topk_ids)`` drawn reproducibly from ``seed`` by a generator on ``device``.

    ``x ~ N(0, 1)`` and ``w ~ N(0, 1) / sqrt(hidden)`` (drawn in float32, then
    cast), so every output is about N(0, 1), well inside fp16's range.
    ``topk_ids`` [tokens, top_k] int32 holds ``top_k`` distinct experts per
    token: the top_k of uniform random scores.
    """
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} must be from 1 to experts={experts}")
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((tokens, hidden), generator=g, device=device).to(dtype)
    w = (torch.randn((experts, n, hidden), generator=g, device=device) * hidden**-0.5).to(dtype)
    scores = torch.rand((tokens, experts), generator=g, device=device)
    topk_ids = scores.topk(top_k, dim=1).indices.to(torch.int32)
    return x, w, topk_ids


def expected_active_experts(tokens: int, experts: int, top_k: int) -> float:
    """Expected number of distinct experts hit when each token picks ``top_k`` distinct experts uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def moe_bytes(
    tokens: int, experts: int, top_k: int, hidden: int, n: int, active_experts: float, elt_bytes: int = 2
) -> float:
    """Bytes one call must move: the active experts' weights, x once, out once (``elt_bytes`` per element)."""
    if active_experts > experts:
        raise ValueError(f"active_experts={active_experts} exceeds experts={experts}")
    return (active_experts * n * hidden + tokens * hidden + tokens * top_k * n) * elt_bytes


def moe_flops(tokens: int, top_k: int, hidden: int, n: int) -> int:
    """Floating-point operations of one call: ``2 * T * top_k * N * K``."""
    return 2 * tokens * top_k * n * hidden
