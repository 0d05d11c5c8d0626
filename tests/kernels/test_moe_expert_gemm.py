"""The MoE expert grouped GEMM against its float32 reference, and its routing metadata.

On CPU every kernel test runs the real Triton kernel in the interpreter
(float16 / float32; the interpreter's bf16 dot is wrong, docs/gpu.md).  Every
launch writes into an output poisoned with NaN, so an element the kernel
leaves unwritten fails.  The ``gpu`` tests run DeepSeek-V3 shapes in bf16.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from kinv.kernels.moe_expert_gemm import (
    expected_active_experts,
    max_aligned_blocks,
    moe_align,
    moe_bytes,
    moe_expert_gemm,
    moe_expert_gemm_launch,
    moe_flops,
    moe_make_inputs,
)
from kinv.kernels.moe_expert_gemm_ref import moe_expert_gemm_reference
from tests.conftest import HAS_GPU
from tests.utils import assert_verbose_allclose

DEVICE = "cuda" if HAS_GPU else "cpu"
# fp32 dots run as tf32 on a GPU: fp16-like rounding of the inputs.
DTYPES = [(torch.float16, 1e-2, 1e-2), (torch.float32, 5e-3, 5e-3)]


def params(block_m=16, block_n=32, block_k=64, group_m=4, num_warps=4, num_stages=2):
    return SimpleNamespace(
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages
    )


def poisoned(x, top_k, n):
    return torch.full((x.shape[0], top_k, n), float("nan"), dtype=x.dtype, device=x.device)


def run_case(x, w, topk_ids, p, atol, rtol, align=None):
    out = poisoned(x, topk_ids.shape[1], w.shape[1])
    got, _ = moe_expert_gemm_launch(x, w, topk_ids, p, out=out, align=align)
    assert got is out and got.dtype == x.dtype
    assert_verbose_allclose(got, moe_expert_gemm_reference(x, w, topk_ids), atol, rtol)


def check_align(align, topk_ids, num_experts, block_m, static_shape=False):
    """Every pair once, blocks of one expert each, real ids first and in order, padding is the sentinel."""
    sorted_ids, block_expert, num_blocks = (t.cpu() if torch.is_tensor(t) else t for t in align)
    flat = topk_ids.reshape(-1).long().cpu()
    pairs = flat.numel()
    assert sorted_ids.dtype == torch.int32 and block_expert.dtype == torch.int32
    assert block_expert.shape == (num_blocks,) and sorted_ids.shape == (num_blocks * block_m,)
    real = sorted_ids[sorted_ids != pairs]
    assert ((sorted_ids >= 0) & (sorted_ids <= pairs)).all(), "an id is neither a pair nor the sentinel"
    assert torch.equal(real.sort().values, torch.arange(pairs, dtype=torch.int32)), "a pair is missing or repeated"

    counts = torch.bincount(flat, minlength=num_experts)
    needed = int(((counts + block_m - 1) // block_m).sum())
    assert needed <= max_aligned_blocks(pairs, num_experts, block_m)
    if static_shape:
        assert num_blocks == max_aligned_blocks(pairs, num_experts, block_m)
        assert (block_expert[needed:] == -1).all() and (sorted_ids[needed * block_m :] == pairs).all()
    else:
        assert num_blocks == needed
    used = block_expert[:needed]
    assert (used >= 0).all() and (used < num_experts).all()
    assert (used[1:] >= used[:-1]).all(), "blocks are not in expert order"
    assert set(used.tolist()) == set(flat.tolist()), "an expert with pairs has no block, or one without has one"

    for b in range(needed):
        block = sorted_ids[b * block_m : (b + 1) * block_m]
        is_real = block != pairs
        n_real = int(is_real.sum())
        assert n_real >= 1, f"block {b} is empty"
        assert is_real[:n_real].all(), f"block {b} has padding before a pair"
        ids = block[:n_real].long()
        assert (flat[ids] == int(used[b])).all(), f"block {b} mixes experts"
        assert (ids[1:] > ids[:-1]).all(), f"block {b} does not keep the pairs' order"


# --------------------------------------------------------------------------- #
# Correctness in the interpreter
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "tokens,experts,hidden,n",
    [(1, 4, 64, 64), (5, 8, 128, 128), (16, 8, 64, 128), (16, 4, 128, 64), (7, 8, 96, 80)],
    ids=["T1", "T5", "T16-E8", "T16-E4", "odd-K96-N80"],
)
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
def test_shapes_and_dtypes(tokens, experts, hidden, n, dtype, atol, rtol):
    x, w, ids = moe_make_inputs(tokens, experts, 2, hidden, n, seed=tokens, device=DEVICE, dtype=dtype)
    run_case(x, w, ids, params(), atol, rtol)


@pytest.mark.parametrize("block_m", [16, pytest.param(32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("block_n", [64, pytest.param(32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("block_k", [32, pytest.param(64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("group_m", [4, pytest.param(1, marks=pytest.mark.slow)])  # the slow lane has all 16
def test_every_tunable_combination(block_m, block_n, block_k, group_m):
    # N=128 gives 2-4 N tiles, K=128 2-4 K steps, 16 tokens x 2 routes over 8 experts several M blocks
    x, w, ids = moe_make_inputs(16, 8, 2, 128, 128, seed=3, device=DEVICE, dtype=torch.float16)
    run_case(x, w, ids, params(block_m, block_n, block_k, group_m), 1e-2, 1e-2)


def test_expert_group_spanning_several_blocks():
    # 40 tokens over 4 experts: ~20 pairs an expert, more than one BLOCK_M=16 block each
    x, w, ids = moe_make_inputs(40, 4, 2, 64, 64, seed=1, device=DEVICE, dtype=torch.float16)
    align = moe_align(ids, 4, 16)
    assert align.num_blocks > 4
    run_case(x, w, ids, params(group_m=2), 1e-2, 1e-2, align=align)


def test_expert_nobody_routes_to_is_never_read():
    x, w, _ = moe_make_inputs(5, 8, 2, 64, 64, seed=2, device=DEVICE, dtype=torch.float16)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [7, 1], [0, 7]], dtype=torch.int32, device=DEVICE)
    w[3:7] = float("nan")  # experts 3..6 have no token: a read of their weights would poison out
    align = moe_align(ids, 8, 16)
    assert sorted(align.block_expert.tolist()) == [0, 1, 2, 7]
    run_case(x, w, ids, params(), 1e-2, 1e-2, align=align)


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
def test_static_shape_align_skips_empty_blocks(dtype, atol, rtol):
    x, w, ids = moe_make_inputs(5, 8, 2, 64, 64, seed=4, device=DEVICE, dtype=dtype)
    align = moe_align(ids, 8, 16, static_shape=True)
    assert (align.block_expert == -1).any()
    run_case(x, w, ids, params(), atol, rtol, align=align)


def test_public_function_allocates_out_and_accepts_int64_ids():
    x, w, ids = moe_make_inputs(3, 4, 2, 64, 64, seed=5, device=DEVICE, dtype=torch.float32)
    out = moe_expert_gemm(x, w, ids.long(), params())
    assert out.shape == (3, 2, 64) and out.dtype == torch.float32
    assert_verbose_allclose(out, moe_expert_gemm_reference(x, w, ids), 5e-3, 5e-3)


def test_top_k_of_one_and_of_every_expert():
    for top_k in (1, 4):
        x, w, ids = moe_make_inputs(6, 4, top_k, 64, 64, seed=top_k, device=DEVICE, dtype=torch.float16)
        run_case(x, w, ids, params(), 1e-2, 1e-2)


# --------------------------------------------------------------------------- #
# Routing metadata
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("tokens", [1, 5, 16, 33])
@pytest.mark.parametrize("experts,top_k", [(4, 1), (4, 2), (8, 2), (32, 8)])
@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("static_shape", [False, True])
def test_moe_align_invariants(tokens, experts, top_k, block_m, static_shape):
    _, _, ids = moe_make_inputs(tokens, experts, top_k, 16, 16, seed=tokens * experts, device=DEVICE,
                                dtype=torch.float32)  # fmt: skip
    check_align(moe_align(ids, experts, block_m, static_shape=static_shape), ids, experts, block_m, static_shape)


def test_moe_align_static_shape_matches_exact():
    _, _, ids = moe_make_inputs(9, 8, 2, 16, 16, seed=7, device=DEVICE, dtype=torch.float32)
    exact = moe_align(ids, 8, 16)
    static = moe_align(ids, 8, 16, static_shape=True)
    assert torch.equal(static.sorted_ids[: exact.sorted_ids.numel()], exact.sorted_ids)
    assert torch.equal(static.block_expert[: exact.num_blocks], exact.block_expert)


def test_moe_align_hand_example():
    # pairs 0..5 = (t0: e2, e0), (t1: e2, e1), (t2: e0, e2); sentinel 6
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], dtype=torch.int32)
    sorted_ids, block_expert, num_blocks = moe_align(ids, 4, 16)
    assert num_blocks == 3 and block_expert.tolist() == [0, 1, 2]
    blocks = sorted_ids.view(3, 16)
    assert blocks[0, :2].tolist() == [1, 4] and blocks[1, :1].tolist() == [3] and blocks[2, :3].tolist() == [0, 2, 5]
    assert (blocks[0, 2:] == 6).all() and (blocks[1, 1:] == 6).all() and (blocks[2, 3:] == 6).all()


def test_make_inputs_is_reproducible_with_distinct_experts():
    a = moe_make_inputs(12, 16, 4, 32, 48, seed=11, device=DEVICE, dtype=torch.float16)
    b = moe_make_inputs(12, 16, 4, 32, 48, seed=11, device=DEVICE, dtype=torch.float16)
    c = moe_make_inputs(12, 16, 4, 32, 48, seed=12, device=DEVICE, dtype=torch.float16)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert not torch.equal(a[2], c[2])
    x, w, ids = a
    assert x.shape == (12, 32) and w.shape == (16, 48, 32) and ids.shape == (12, 4)
    assert x.dtype == w.dtype == torch.float16 and ids.dtype == torch.int32
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert ((ids >= 0) & (ids < 16)).all()


# --------------------------------------------------------------------------- #
# Cost model
# --------------------------------------------------------------------------- #
def test_cost_model():
    assert expected_active_experts(1, 32, 8) == pytest.approx(8)
    assert expected_active_experts(96, 32, 8) == pytest.approx(32 * (1 - 0.75**96))
    assert expected_active_experts(2, 4, 4) == pytest.approx(4)
    t, e, k, h, n = 4, 32, 8, 7168, 4096
    assert moe_bytes(t, e, k, h, n, 20) == (20 * n * h + t * h + t * k * n) * 2
    assert moe_bytes(t, e, k, h, n, 20, elt_bytes=4) == 2 * moe_bytes(t, e, k, h, n, 20)
    assert moe_flops(t, k, h, n) == 2 * t * k * n * h
    # the bound on blocks: P pairs, min(E, P) experts each padded by < block_m
    assert max_aligned_blocks(1, 8, 16) == 1
    assert max_aligned_blocks(768, 32, 16) == math.floor((768 + 32 * 15) / 16)


# --------------------------------------------------------------------------- #
# Bad input
# --------------------------------------------------------------------------- #
def test_bad_inputs_are_refused_with_the_problem():
    x, w, ids = moe_make_inputs(4, 8, 2, 64, 64, seed=0, device=DEVICE, dtype=torch.float16)
    p = params()
    cases = [
        ((x[:, :32], w, ids, p), {}, "hidden size"),
        ((x, w.float(), ids, p), {}, "w dtype"),
        ((x.to(torch.int16), w, ids, p), {}, "x dtype"),
        ((x, w, ids.float(), p), {}, "topk_ids dtype"),
        ((x, w, ids[:3], p), {}, "topk_ids has 3 rows"),
        ((x, w[0], ids, p), {}, r"w must be \[experts, n, hidden\]"),
        ((x, w, torch.zeros((4, 9), dtype=torch.int32), p), {}, "top_k=9"),
        ((x, w, ids, params(block_m=8)), {}, "BLOCK_M=8"),
        ((x, w, ids, params(block_n=48)), {}, "BLOCK_N=48"),
        ((x, w, ids, params(group_m=0)), {}, "GROUP_M=0"),
        ((x, w, ids, SimpleNamespace(BLOCK_M=16)), {}, "lacks BLOCK_N"),
        ((x, w, ids, p), {"align": moe_align(ids, 8, 32)}, "another block_m"),
        ((x, w, ids, p), {"out": torch.empty((4, 2, 32), dtype=x.dtype, device=x.device)}, "out is"),
        ((x, w, ids, p), {"out": torch.empty((4, 2, 64), dtype=torch.float32, device=x.device)}, "out is"),
        ((x, w.transpose(1, 2).contiguous().transpose(1, 2), ids, p), {}, "contiguous"),
    ]
    for args, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            moe_expert_gemm_launch(*args, **kwargs)
    with pytest.raises(ValueError, match="expert ids from 0 to 8"):
        moe_align(torch.tensor([[0, 8]], dtype=torch.int32), 8, 16)
    with pytest.raises(ValueError, match="topk_ids dtype"):
        moe_align(ids.float(), 8, 16)


# --------------------------------------------------------------------------- #
# bf16 on the GPU, DeepSeek-V3 shapes
# --------------------------------------------------------------------------- #
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 33, 96])
@pytest.mark.parametrize("block_m,block_n,block_k,group_m", [(16, 64, 128, 1), (16, 128, 64, 4), (32, 64, 64, 8)])
def test_gpu_bf16_deepseek_v3_shapes(tokens, block_m, block_n, block_k, group_m):
    x, w, ids = moe_make_inputs(tokens, 32, 8, 7168, 4096, seed=tokens, device=DEVICE, dtype=torch.bfloat16)
    p = params(block_m, block_n, block_k, group_m, num_warps=4, num_stages=4)
    run_case(x, w, ids, p, 3e-2, 3e-2)


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_new_routing():
    x, w, ids = moe_make_inputs(16, 32, 8, 1024, 512, seed=0, device=DEVICE, dtype=torch.bfloat16)
    p = params(16, 64, 64, 4)
    align = moe_align(ids, 32, 16, static_shape=True)
    out = poisoned(x, 8, 512)
    moe_expert_gemm_launch(x, w, ids, p, out=out, align=align)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_expert_gemm_launch(x, w, ids, p, out=out, align=align)
    for seed in (1, 2):
        _, _, new_ids = moe_make_inputs(16, 32, 8, 1024, 512, seed=seed, device=DEVICE, dtype=torch.bfloat16)
        new_align = moe_align(new_ids, 32, 16, static_shape=True)
        ids.copy_(new_ids)
        align.sorted_ids.copy_(new_align.sorted_ids)
        align.block_expert.copy_(new_align.block_expert)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_verbose_allclose(out, moe_expert_gemm_reference(x, w, new_ids), 3e-2, 3e-2)
