"""MLA decode attention with split-K (flash-decoding), paged latent KV cache.

Math
----
Absorbed multi-head latent attention (DeepSeek-V2/V3 "MLA", weight absorption):
every query head attends to ONE latent KV head whose cache row is ``D_QK``
values wide.  Keys are the whole row, values are its first ``D_V`` values
(K = V latent).  For query head h of request b with length n_b::

    s_t   = scale * <q[b, h, :D_QK], kv[b, t, :D_QK]>            t < n_b
    o     = sum_t softmax(s)_t * kv[b, t, :D_V]

Split-K ("flash-decoding", Dao et al. 2023): the n_b tokens are cut into S
contiguous splits of whole BLOCK_T tiles.  Stage 1 runs one program per
(request, head tile, split); it streams its split in BLOCK_T-token tiles with
an online softmax (Milakov & Gimelshein 2018) and writes the split's
normalized partial output o_s and its log-sum-exp lse_s.  Stage 2 merges::

    o = sum_s exp(lse_s - M) * o_s / sum_s exp(lse_s - M),  M = max_s lse_s

Internally scores are kept in base 2 (``exp2``/``log2``), which is exact
up to rounding: exp(x) = 2^(x * log2 e).

Shapes
------
q            [B, H, D_QK]                 bf16 / fp16 / fp32
kv_cache     [num_pages, page_size, D_QK]  same dtype as q (one latent head)
block_table  [B, max_pages]               int32, page ids per request
seq_lens     [B]                          int32, 1 <= n_b
out          [B, H, D_V]                  dtype of q

DeepSeek-V3 style: D_QK = 576 (512 latent + 64 rope), D_V = 512.
DeepSeek-V4-Flash style: D_QK = 512 (448 latent + 64 rope), D_V = 512.

The launch configuration (BLOCK_T, BLOCK_H, num_warps, num_stages) is data:
``kernels/configs/mla_decode.json``, validated by ``kernels.launch_config``.
The number of splits comes from TARGET_CTAS via :func:`num_kv_splits`.

Two optional tunables, each off by default so that a
config without them runs the seed's kernel:

* ``CTAS_PER_SM`` k > 0: the split count is sized to whole waves of k resident
  programs per SM instead of TARGET_CTAS (:func:`num_kv_splits`).
* ``TMA`` 1: full tiles are read with bulk tensor-descriptor loads (one copy of
  BLOCK_T consecutive rows of one page) when BLOCK_T divides the page size.

With bulk loads, every split's last, partial tile is peeled off its loop (the
loop's tiles need no mask); stage 2 merges up to STAGE2_BLOCK_S splits per load.

Stage 1 keeps the value columns in two halves (two
[BLOCK_H, D_V/2] accumulators and two operands per tile instead of one of each),
and the gathering path has one loop body for every tile (the partial last tile
clamps its rows and masks its scores) instead of a second, peeled copy; both
lower register pressure, and the math is the same.  A third optional
tunable, also off by default:

* ``MERGE`` 1: no second launch.  Each split stores its partial output, then
  takes a ticket from a per-(request, head tile) counter; the split that takes
  the last ticket merges all partial outputs (read back from L2) and resets the
  counter for the next launch.  One split writes its output directly.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from .launch_config import LaunchParams

DEFAULT_TARGET_CTAS = 512
LOG2E = 1.4426950408889634
# Stage 2 splits D_V across programs so that a small batch still fills the GPU.
STAGE2_BLOCK_DV = 128
# ... and loads the partial outputs of up to STAGE2_BLOCK_S splits at once (one load, not one per split).
STAGE2_BLOCK_S = 32
# The wave rule's fixed cost of one program, in tokens of work (see num_kv_splits).
WAVE_OVERHEAD_TOKENS = 64


# --------------------------------------------------------------------------- #
# Triton kernels
# --------------------------------------------------------------------------- #
@triton.jit
def _mla_tile(q0, q1, q_tail, kv0, kv1, kv_tail, m_i, l_i, acc0, acc1, mask_t, qk_scale,
              D_TAIL: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """One BLOCK_T tile of the online softmax: scores, running max and sum, and the two value halves."""
    qk = tl.dot(q0, tl.trans(kv0))
    qk += tl.dot(q1, tl.trans(kv1))
    if D_TAIL > 0:
        qk += tl.dot(q_tail, tl.trans(kv_tail))
    qk = qk * qk_scale
    if MASKED:
        qk = tl.where(mask_t[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p = p.to(kv0.dtype)
    acc0 = acc0 * alpha[:, None] + tl.dot(p, kv0)
    acc1 = acc1 * alpha[:, None] + tl.dot(p, kv1)
    return m_new, l_i, acc0, acc1


@triton.jit
def _mla_decode_stage1(
    # pointers
    Q,
    KV,
    KVDesc,  # tensor descriptor of KV rows, block [BLOCK_T, D_V // 2] (USE_TMA), else KV again
    KVTailDesc,  # the same for the rope tail, block [BLOCK_T, D_TAIL]
    BlockTable,
    SeqLens,
    PartialO,
    PartialLse,
    Out,  # written here only with MERGE
    Counters,  # int32 per (request, head tile), zero between launches (MERGE)
    # sizes
    num_heads,
    page_size,
    qk_scale,  # softmax scale * log2(e)
    # strides
    stride_qb,
    stride_qh,
    stride_kv_row,
    stride_bt_b,
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    stride_ob,
    stride_oh,
    # meta-parameters
    D_V: tl.constexpr,
    D_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    USE_TMA: tl.constexpr,
    MERGE: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_s = tl.program_id(2)
    num_splits = tl.num_programs(2)

    # ---- this program's token range: whole BLOCK_T tiles -------------------
    seq_len = tl.load(SeqLens + pid_b)
    n_tiles = tl.cdiv(seq_len, BLOCK_T)
    tiles_per_split = tl.cdiv(n_tiles, num_splits)
    start = pid_s * tiles_per_split * BLOCK_T
    end = tl.minimum(start + tiles_per_split * BLOCK_T, seq_len)
    # bulk loads (USE_TMA) take full tiles only; the one partial tile (the sequence's last) is peeled off
    full_end = tl.maximum(start, start + ((end - start) // BLOCK_T) * BLOCK_T)

    HALF: tl.constexpr = D_V // 2
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_a = tl.arange(0, HALF)  # a column of one value half: the second half is HALF + offs_a
    offs_tt = tl.arange(0, BLOCK_T)

    # ---- queries stay in registers for the whole split ----------------------
    q_ptrs = Q + pid_b * stride_qb + offs_h[:, None] * stride_qh
    q0 = tl.load(q_ptrs + offs_a[None, :], mask=mask_h[:, None], other=0.0)
    q1 = tl.load(q_ptrs + HALF + offs_a[None, :], mask=mask_h[:, None], other=0.0)
    offs_tail = D_V + tl.arange(0, D_TAIL if D_TAIL > 0 else 16)
    q_tail = q0
    if D_TAIL > 0:
        q_tail = tl.load(q_ptrs + offs_tail[None, :], mask=mask_h[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
    bt_row = BlockTable + pid_b * stride_bt_b

    if USE_TMA:
        # ---- stream the split's full tiles in bulk: online softmax, no masks ----
        for t0 in range(start, full_end, BLOCK_T):
            # BLOCK_T divides the page size: the tile is BLOCK_T consecutive rows of one page
            row0 = tl.load(bt_row + t0 // page_size) * page_size + t0 % page_size
            kv0 = KVDesc.load([row0, 0])
            kv1 = KVDesc.load([row0, HALF])
            kv_tail = kv0
            if D_TAIL > 0:
                kv_tail = KVTailDesc.load([row0, D_V])
            m_i, l_i, acc0, acc1 = _mla_tile(q0, q1, q_tail, kv0, kv1, kv_tail, m_i, l_i, acc0, acc1,
                                             offs_tt < BLOCK_T, qk_scale, D_TAIL, False)  # fmt: skip
        # ---- the partial last tile, gathered with a mask --------------------
        if full_end < end:
            offs_t = full_end + offs_tt
            mask_t = offs_t < end
            page = tl.load(bt_row + offs_t // page_size, mask=mask_t, other=0)
            kv_ptrs = KV + (page.to(tl.int64) * page_size + offs_t % page_size)[:, None] * stride_kv_row
            kv0 = tl.load(kv_ptrs + offs_a[None, :], mask=mask_t[:, None], other=0.0)
            kv1 = tl.load(kv_ptrs + HALF + offs_a[None, :], mask=mask_t[:, None], other=0.0)
            kv_tail = kv0
            if D_TAIL > 0:
                kv_tail = tl.load(kv_ptrs + offs_tail[None, :], mask=mask_t[:, None], other=0.0)
            m_i, l_i, acc0, acc1 = _mla_tile(q0, q1, q_tail, kv0, kv1, kv_tail, m_i, l_i, acc0, acc1,
                                             mask_t, qk_scale, D_TAIL, True)  # fmt: skip
    else:
        # ---- one loop body for every tile: the partial last tile's rows are clamped to the split's last
        # token (real data, never past the cache) and masked out of the scores ------------------------
        for t0 in range(start, end, BLOCK_T):
            offs_t = t0 + offs_tt
            mask_t = offs_t < end
            offs_c = tl.minimum(offs_t, end - 1)
            page = tl.load(bt_row + offs_c // page_size)
            kv_ptrs = KV + (page.to(tl.int64) * page_size + offs_c % page_size)[:, None] * stride_kv_row
            kv0 = tl.load(kv_ptrs + offs_a[None, :])
            kv1 = tl.load(kv_ptrs + HALF + offs_a[None, :])
            kv_tail = kv0
            if D_TAIL > 0:
                kv_tail = tl.load(kv_ptrs + offs_tail[None, :])
            m_i, l_i, acc0, acc1 = _mla_tile(q0, q1, q_tail, kv0, kv1, kv_tail, m_i, l_i, acc0, acc1,
                                             mask_t, qk_scale, D_TAIL, True)  # fmt: skip

    # ---- the split's normalized partial output and its lse -----------------
    has_tokens = l_i > 0.0
    inv_l = 1.0 / tl.where(has_tokens, l_i, 1.0)
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    out_ptrs = Out + pid_b * stride_ob + offs_h[:, None] * stride_oh
    one_split = False
    if MERGE:
        one_split = num_splits == 1
    if one_split:
        # MERGE with one split: its partial output is the output
        tl.store(out_ptrs + offs_a[None, :], (acc0 * inv_l[:, None]).to(Out.dtype.element_ty), mask=mask_h[:, None])
        tl.store(out_ptrs + HALF + offs_a[None, :], (acc1 * inv_l[:, None]).to(Out.dtype.element_ty),
                 mask=mask_h[:, None])  # fmt: skip
    else:
        po_ptrs = PartialO + pid_b * stride_pob + offs_h[:, None] * stride_poh
        tl.store(po_ptrs + pid_s * stride_pos + offs_a[None, :], acc0 * inv_l[:, None], mask=mask_h[:, None])
        tl.store(po_ptrs + pid_s * stride_pos + HALF + offs_a[None, :], acc1 * inv_l[:, None], mask=mask_h[:, None])
        lse_ptrs = PartialLse + pid_b * stride_plb + offs_h * stride_plh
        tl.store(lse_ptrs + pid_s, lse, mask=mask_h)
        if MERGE:
            # every thread's stores are done before the ticket is taken (the ticket releases them)
            tl.debug_barrier()
            counter = Counters + pid_b * tl.num_programs(1) + pid_h
            ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:
                # the last split: merge every split's partial output, read past L1 (.cg)
                lse_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
                for s in range(0, num_splits):
                    lse_s = tl.load(lse_ptrs + s, mask=mask_h, other=0.0, cache_modifier=".cg")
                    lse_max = tl.maximum(lse_max, lse_s)
                o0 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
                o1 = tl.zeros([BLOCK_H, HALF], dtype=tl.float32)
                denom = tl.zeros([BLOCK_H], dtype=tl.float32)
                for s in range(0, num_splits):
                    w = tl.exp2(tl.load(lse_ptrs + s, mask=mask_h, other=0.0, cache_modifier=".cg") - lse_max)
                    p0 = tl.load(po_ptrs + s * stride_pos + offs_a[None, :], mask=mask_h[:, None], other=0.0,
                                 cache_modifier=".cg")  # fmt: skip
                    p1 = tl.load(po_ptrs + s * stride_pos + HALF + offs_a[None, :], mask=mask_h[:, None],
                                 other=0.0, cache_modifier=".cg")  # fmt: skip
                    o0 += w[:, None] * p0
                    o1 += w[:, None] * p1
                    denom += w
                inv = 1.0 / denom
                tl.store(out_ptrs + offs_a[None, :], (o0 * inv[:, None]).to(Out.dtype.element_ty),
                         mask=mask_h[:, None])  # fmt: skip
                tl.store(out_ptrs + HALF + offs_a[None, :], (o1 * inv[:, None]).to(Out.dtype.element_ty),
                         mask=mask_h[:, None])  # fmt: skip
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _mla_decode_stage2(
    # pointers
    PartialO,
    PartialLse,
    Out,
    # sizes
    num_splits,
    # strides
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    stride_ob,
    stride_oh,
    # meta-parameters
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_d = tl.program_id(2)

    # ---- the largest lse over all splits, BLOCK_S at a time ------------------
    offs_s = tl.arange(0, BLOCK_S)
    lse_ptrs = PartialLse + pid_b * stride_plb + pid_h * stride_plh
    lse_max = tl.max(tl.load(lse_ptrs + offs_s, mask=offs_s < num_splits, other=float("-inf")), axis=0)
    for s0 in range(BLOCK_S, num_splits, BLOCK_S):
        chunk = tl.load(lse_ptrs + s0 + offs_s, mask=s0 + offs_s < num_splits, other=float("-inf"))
        lse_max = tl.maximum(lse_max, tl.max(chunk, axis=0))

    # ---- weighted sum of the partial outputs: BLOCK_S splits per load ---------
    offs_d = pid_d * BLOCK_DV + tl.arange(0, BLOCK_DV)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    denom = 0.0
    po_ptrs = PartialO + pid_b * stride_pob + pid_h * stride_poh + offs_d[None, :]
    for s0 in range(0, num_splits, BLOCK_S):
        mask_s = s0 + offs_s < num_splits
        w = tl.exp2(tl.load(lse_ptrs + s0 + offs_s, mask=mask_s, other=float("-inf")) - lse_max)
        po = tl.load(po_ptrs + (s0 + offs_s)[:, None] * stride_pos, mask=mask_s[:, None], other=0.0)
        acc += tl.sum(w[:, None] * po, axis=0)
        denom += tl.sum(w, axis=0)
    out = acc / denom
    tl.store(Out + pid_b * stride_ob + pid_h * stride_oh + offs_d, out.to(Out.dtype.element_ty))


# --------------------------------------------------------------------------- #
# Launcher
# --------------------------------------------------------------------------- #
def target_ctas_from_env(environ: dict | None = None) -> int:
    """TARGET_CTAS from the environment (default 512); a bad value is refused."""
    raw = (environ if environ is not None else os.environ).get("TARGET_CTAS")
    if raw is None or raw == "":
        return DEFAULT_TARGET_CTAS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"TARGET_CTAS={raw!r} is not an integer; use a positive integer such as 512") from None
    if value < 1:
        raise ValueError(f"TARGET_CTAS={value} must be a positive integer such as 512")
    return value


def num_kv_splits(
    batch: int,
    head_tiles: int,
    max_seq_len: int,
    block_t: int,
    target_ctas: int | None = None,
    *,
    ctas_per_sm: int = 0,
    sms: int | None = None,
) -> int:
    """Split count of the KV sequence, the one place it is computed.

    ``ctas_per_sm = 0`` (the seed's rule): ``splits = ceil(TARGET_CTAS / (batch * head_tiles))`` so that
    stage 1 launches about TARGET_CTAS programs, bounded below by 1 and above by the number of BLOCK_T
    tiles of the longest sequence (a split never gets less than one tile).  ``target_ctas`` defaults to
    the TARGET_CTAS environment variable, itself defaulting to 512.

    ``ctas_per_sm = k > 0``: splits sized by wave quantization.  With ``sms * k`` programs resident at once,
    a split count ``s`` costs ``waves(s) * (ceil(tiles / s) + c)`` tile-times (``waves = ceil(batch *
    head_tiles * s / (sms * k))``; ``c``, a program's fixed cost of loading its queries and writing and
    merging its partial output, is taken as WAVE_OVERHEAD_TOKENS tokens); the cheapest wins, the fewest splits
    on a tie (fewer partial outputs to merge).
    ``sms`` defaults to the current GPU's SM count (the H200's 132 under the CPU interpreter).
    """
    max_tiles = max(1, math.ceil(max_seq_len / block_t))
    if ctas_per_sm:
        overhead = max(1, WAVE_OVERHEAD_TOKENS // block_t)
        return _wave_splits(max(1, batch * head_tiles), max_tiles, (sms or _sm_count()) * ctas_per_sm, overhead)
    if target_ctas is None:
        target_ctas = target_ctas_from_env()
    wanted = math.ceil(target_ctas / max(1, batch * head_tiles))
    return max(1, min(wanted, max_tiles))


@functools.lru_cache(maxsize=4096)
def _wave_splits(rows: int, tiles: int, slots: int, overhead: int) -> int:
    return min(range(1, tiles + 1), key=lambda s: (math.ceil(rows * s / slots) * (math.ceil(tiles / s) + overhead), s))


@functools.lru_cache(maxsize=1)
def _sm_count() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132


def _tma_ok(params: LaunchParams, kv_cache: torch.Tensor, d_v: int) -> bool:
    """Bulk tile loads need whole-page tiles (BLOCK_T divides the page size), a Hopper-class GPU and 16-byte
    aligned rows; otherwise the kernel gathers rows as before."""
    if not params.get("TMA", 0) or kv_cache.device.type != "cuda" or kv_cache.shape[1] % params.BLOCK_T:
        return False
    row_bytes = kv_cache.shape[2] * kv_cache.element_size()
    return (torch.cuda.get_device_capability(kv_cache.device)[0] >= 9 and row_bytes % 16 == 0
            and kv_cache.data_ptr() % 16 == 0 and d_v * kv_cache.element_size() % 16 == 0)


def _check_inputs(q, kv_cache, block_table, seq_lens, d_v):
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, d_qk], got shape {tuple(q.shape)}")
    if kv_cache.dim() != 3:
        raise ValueError(f"kv_cache must be [num_pages, page_size, d_qk], got shape {tuple(kv_cache.shape)}")
    batch, _, d_qk = q.shape
    if kv_cache.shape[2] != d_qk:
        raise ValueError(f"kv_cache row width {kv_cache.shape[2]} differs from q's d_qk {d_qk}")
    if q.dtype != kv_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} differs from kv_cache dtype {kv_cache.dtype}")
    if d_v > d_qk or d_v & (d_v - 1):
        raise ValueError(f"d_v={d_v} must be a power of two no larger than d_qk={d_qk}")
    tail = d_qk - d_v
    if tail and tail & (tail - 1):
        raise ValueError(f"d_qk - d_v = {tail} must be 0 or a power of two (576-512=64, 512-512=0)")
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError("block_table and seq_lens must have one row per request")
    if q.stride(2) != 1 or kv_cache.stride(2) != 1:
        raise ValueError("q and kv_cache must be contiguous in their last dimension")


def mla_decode_scratch(batch: int, num_heads: int, num_splits: int, d_v: int, device) -> dict:
    """The split-K partial buffers of one launch: per-split outputs and log-sum-exps (float32)."""
    return {
        "partial_o": torch.empty((batch, num_heads, num_splits, d_v), dtype=torch.float32, device=device),
        "partial_lse": torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device),
        # MERGE's tickets, one per (request, head tile) at most; each launch leaves them at zero
        "counters": torch.zeros((batch * num_heads,), dtype=torch.int32, device=device),
    }


def mla_decode_launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    params: LaunchParams,
    *,
    d_v: int = 512,
    sm_scale: float | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    target_ctas: int | None = None,
    out: torch.Tensor | None = None,
    scratch: dict | None = None,
):
    """Validate, choose the split count, allocate what the caller did not pass, and launch both stages.

    Pass ``max_seq_len`` (a Python int) to keep the launch free of host
    syncs, as CUDA-graph capture requires.  ``scratch`` (from :func:`mla_decode_scratch`)
    holds the split-K partial buffers; a caller that times the kernel passes its own so
    that it, not a graph's private pool, decides where they live.  Returns
    ``(out, compiled_stage1)``; the compiled kernel is ``None`` under the interpreter.
    """
    _check_inputs(q, kv_cache, block_table, seq_lens, d_v)
    batch, num_heads, d_qk = q.shape
    page_size = kv_cache.shape[1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d_qk)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    head_tiles = triton.cdiv(num_heads, params.BLOCK_H)
    if num_splits is None:
        # an explicit target_ctas (a correctness check's one split) overrides the config's split rule
        num_splits = num_kv_splits(batch, head_tiles, max_seq_len, params.BLOCK_T, target_ctas,
                                   ctas_per_sm=params.get("CTAS_PER_SM", 0) if target_ctas is None else 0)

    kv_rows = kv_cache.view(-1, d_qk)
    if scratch is None:
        scratch = mla_decode_scratch(batch, num_heads, num_splits, d_v, q.device)
    partial_o, partial_lse = scratch["partial_o"], scratch["partial_lse"]
    if partial_o.shape != (batch, num_heads, num_splits, d_v) or partial_lse.shape != (batch, num_heads, num_splits):
        raise ValueError(f"scratch holds partial_o {tuple(partial_o.shape)}, partial_lse {tuple(partial_lse.shape)}; "
                         f"this launch needs {(batch, num_heads, num_splits, d_v)} and {(batch, num_heads, num_splits)}")
    if out is None:
        out = torch.empty((batch, num_heads, d_v), dtype=q.dtype, device=q.device)

    use_tma = _tma_ok(params, kv_cache, d_v)
    merge = bool(params.get("MERGE", 0))
    counters = scratch.get("counters")
    if merge and (counters is None or counters.numel() < batch * head_tiles):
        raise ValueError("MERGE=1 needs scratch['counters'], zeroed int32 of batch * head tiles; "
                         "mla_decode_scratch makes it")  # fmt: skip
    kv_desc = kv_tail_desc = kv_rows
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        kv_desc = TensorDescriptor.from_tensor(kv_rows, [params.BLOCK_T, d_v // 2])
        kv_tail_desc = TensorDescriptor.from_tensor(kv_rows, [params.BLOCK_T, max(16, d_qk - d_v)])
    compiled = _mla_decode_stage1[(batch, head_tiles, num_splits)](
        q, kv_rows, kv_desc, kv_tail_desc, block_table, seq_lens, partial_o, partial_lse,
        out, counters if merge else partial_lse,
        num_heads, page_size, sm_scale * LOG2E,
        q.stride(0), q.stride(1),
        kv_rows.stride(0),
        block_table.stride(0),
        partial_o.stride(0), partial_o.stride(1), partial_o.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        out.stride(0), out.stride(1),
        D_V=d_v, D_TAIL=d_qk - d_v, BLOCK_H=params.BLOCK_H, BLOCK_T=params.BLOCK_T, USE_TMA=use_tma,
        MERGE=merge, num_warps=params.num_warps, num_stages=params.num_stages,
    )  # fmt: skip
    if merge:
        return out, compiled
    block_dv = min(STAGE2_BLOCK_DV, d_v)
    _mla_decode_stage2[(batch, num_heads, d_v // block_dv)](
        partial_o, partial_lse, out,
        num_splits,
        partial_o.stride(0), partial_o.stride(1), partial_o.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_S=min(STAGE2_BLOCK_S, triton.next_power_of_2(num_splits)), BLOCK_DV=block_dv,
        num_warps=4, num_stages=1,
    )  # fmt: skip
    return out, compiled


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    params: LaunchParams,
    **kwargs,
) -> torch.Tensor:
    """MLA split-K decode attention: returns ``out [B, H, D_V]``."""
    return mla_decode_launch(q, kv_cache, block_table, seq_lens, params, **kwargs)[0]
