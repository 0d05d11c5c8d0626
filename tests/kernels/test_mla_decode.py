"""The MLA split-K decode kernel against its float32 reference.

On CPU every test runs the real Triton kernel in the interpreter (float16 /
float32; the interpreter's bf16 dot is wrong, docs/gpu.md).  The ``gpu`` tests run
in bf16 on a CUDA device.
"""

from __future__ import annotations

import math

import pytest
import torch

from kinv.kernels.mla_decode import mla_decode, num_kv_splits
from kinv.kernels.mla_decode_adapter import mla_params
from kinv.kernels.mla_decode_ref import mla_decode_reference
from tests.conftest import HAS_GPU
from tests.utils import assert_verbose_allclose

SHAPES = {"v3": (576, 512), "v4flash": (512, 512)}
DTYPES = [(torch.float16, 1e-2, 1e-2), (torch.float32, 2e-3, 2e-3)]
DEVICE = "cuda" if HAS_GPU else "cpu"


def sweep(first, *rest):
    """A sweep's cases: the first in the fast lane, the rest in the slow lane (each launch is seconds in the
    interpreter)."""
    return [first, *(pytest.param(*r if isinstance(r, tuple) else (r,), marks=pytest.mark.slow) for r in rest)]


def make(lens, heads, shape, page_size, dtype, seed=0, device=DEVICE):
    d_qk, d_v = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / page_size) for n in lens]
    max_pages = max(pages)
    num_pages = len(lens) * max_pages + 2  # spare pages nobody owns
    perm = torch.randperm(num_pages, generator=g)[: len(lens) * max_pages].view(len(lens), max_pages)
    kv = torch.randn((num_pages, page_size, d_qk), generator=g).to(dtype)
    q = torch.randn((len(lens), heads, d_qk), generator=g).to(dtype)
    seq = torch.tensor(lens, dtype=torch.int32)
    return [t.to(device) for t in (q, kv, perm.to(torch.int32), seq)] + [d_v]


def run_case(lens, heads, shape, page_size, dtype, atol, rtol, params=mla_params(), num_splits=None, seed=0):
    q, kv, bt, seq, d_v = make(lens, heads, shape, page_size, dtype, seed)
    out = mla_decode(q, kv, bt, seq, params, d_v=d_v, num_splits=num_splits)
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    assert out.shape == (len(lens), heads, d_v) and out.dtype == dtype
    assert_verbose_allclose(out, ref, atol, rtol)


@pytest.mark.parametrize("shape", ["v3", "v4flash"])
@pytest.mark.parametrize("dtype,atol,rtol", sweep(*DTYPES))  # float32 in the fast lane: the stage-2 test
def test_both_shapes_both_dtypes(shape, dtype, atol, rtol):
    run_case([40, 7], 16, shape, 16, dtype, atol, rtol, num_splits=3)


@pytest.mark.parametrize("page_size", sweep(1, 16, 64))
def test_page_sizes(page_size):
    run_case([70, 33, 5], 16, "v3", page_size, torch.float16, 1e-2, 1e-2, num_splits=2)


def test_unequal_lengths_not_multiple_of_block():
    # 1 token, one short of a tile, one past a tile, and a long odd one
    run_case([1, 15, 17, 101], 16, "v4flash", 16, torch.float16, 1e-2, 1e-2, num_splits=4)


@pytest.mark.parametrize("num_splits", sweep(12, 1, 2, 5, 7))
def test_split_counts_up_to_more_than_tiles(num_splits):
    # 100 tokens = 7 tiles of 16: splits beyond 7 leave programs with no tokens
    run_case([100, 20], 16, "v3", 16, torch.float16, 1e-2, 1e-2, num_splits=num_splits)


@pytest.mark.parametrize("heads", sweep(64, 16, 128))
def test_head_counts(heads):
    run_case([24], heads, "v4flash", 16, torch.float16, 1e-2, 1e-2, num_splits=1)


@pytest.mark.parametrize("block_t", sweep(32, 16))
@pytest.mark.parametrize("num_warps", sweep(8, 4))
@pytest.mark.parametrize("num_stages", sweep(3, 1, 2))  # fast: BT32/w8/s3, the far corner from the seed's
def test_every_config_of_the_3a_space(block_t, num_warps, num_stages):
    params = mla_params(BLOCK_T=block_t, BLOCK_H=16, num_warps=num_warps, num_stages=num_stages)
    run_case([50, 9], 16, "v3", 16, torch.float16, 1e-2, 1e-2, params=params, num_splits=2)


def test_split_count_follows_target_ctas(monkeypatch):
    # 512 CTAs over batch 8 x 1 head tile -> 64 splits, within 4096/16 tiles
    assert num_kv_splits(8, 1, 4096, 16, 512) == 64
    assert num_kv_splits(96, 1, 4096, 16, 512) == 6  # ceil(512 / 96)
    assert num_kv_splits(1, 1, 100, 16, 512) == 7  # bounded by ceil(100 / 16) tiles
    assert num_kv_splits(1024, 1, 4096, 16, 512) == 1  # never below one
    monkeypatch.setenv("TARGET_CTAS", "1024")
    assert num_kv_splits(8, 1, 4096, 16) == 128
    monkeypatch.setenv("TARGET_CTAS", "lots")
    with pytest.raises(ValueError, match="TARGET_CTAS='lots'"):
        num_kv_splits(8, 1, 4096, 16)


def test_default_split_count_is_used_and_correct():
    # no num_splits given: it comes from TARGET_CTAS (default 512) -> one split per tile here
    run_case([33, 64], 16, "v4flash", 16, torch.float16, 1e-2, 1e-2)


def test_wave_rule_fills_whole_waves_and_beats_the_target_ctas_rule_at_batch_96():
    # batch 96 at 4096 tokens, BLOCK_T 32 (128 tiles), 132 SMs x 2 resident CTAs = 264 slots:
    # TARGET_CTAS=512 gives 6 splits = 576 programs = 2.2 waves, the third almost empty
    waves = lambda s: math.ceil(96 * s / 264)  # noqa: E731
    cost = lambda s: waves(s) * (math.ceil(128 / s) + 2)  # noqa: E731
    seed_rule = num_kv_splits(96, 1, 4096, 32, 512)
    wave_rule = num_kv_splits(96, 1, 4096, 32, 512, ctas_per_sm=2, sms=132)
    assert seed_rule == 6 and wave_rule == 8  # 768 programs: 2.9 waves
    assert cost(wave_rule) < cost(seed_rule)
    assert all(cost(wave_rule) <= cost(s) for s in range(1, 129))
    # TARGET_CTAS does not move the wave rule; a split still never gets less than one tile
    assert num_kv_splits(96, 1, 4096, 32, 64, ctas_per_sm=2, sms=132) == wave_rule
    assert num_kv_splits(1, 1, 100, 32, ctas_per_sm=3, sms=132) == 4


@pytest.mark.parametrize("cps", sweep(3, 1))
def test_wave_rule_config_is_correct(cps):
    params = mla_params(BLOCK_T=16, CTAS_PER_SM=cps)
    run_case([100, 33, 5], 16, "v3", 16, torch.float16, 1e-2, 1e-2, params=params)


@pytest.mark.parametrize("shape", sweep("v4flash", "v3"))
@pytest.mark.parametrize("page_size,block_t", sweep((64, 32), (16, 16), (16, 32)))
def test_tma_path_in_the_interpreter(monkeypatch, shape, page_size, block_t):
    # bulk loads need a Hopper GPU; the interpreter runs tensor descriptors, so the path's logic is checked
    # here by letting it through (a page size that BLOCK_T does not divide falls back to gathered rows)
    import kinv.kernels.mla_decode as mla

    monkeypatch.setattr(mla, "_tma_ok", lambda p, kv, d_v: bool(p.TMA) and kv.shape[1] % p.BLOCK_T == 0)
    params = mla_params(BLOCK_T=block_t, TMA=1)
    for num_splits in (1, 3):
        run_case([130, 37, 64], 16, shape, page_size, torch.float16, 1e-2, 1e-2, params=params, num_splits=num_splits)


def test_stage2_merges_more_splits_than_one_load_holds():
    # 70 splits: three loads of STAGE2_BLOCK_S = 32 partial outputs, the last one masked
    run_case([1120, 300], 16, "v4flash", 16, torch.float32, 2e-3, 2e-3, num_splits=70)


@pytest.mark.parametrize("num_splits", sweep(7, 1, 2))
def test_merge_in_stage1_is_correct_and_leaves_its_tickets_at_zero(num_splits):
    # MERGE 1: the last split of each request merges in stage 1 (one split writes its output directly);
    # the tickets it counts with must be back at zero so that the next launch (a CUDA graph replays the same
    # scratch) merges again; two launches on one scratch, lengths that leave some splits empty
    from kinv.kernels.mla_decode import mla_decode_launch, mla_decode_scratch

    q, kv, bt, seq, d_v = make([200, 37, 1], 16, "v3", 16, torch.float16)
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    scratch = mla_decode_scratch(3, 16, num_splits, d_v, q.device)
    for _ in range(2):
        out = torch.full((3, 16, d_v), float("nan"), dtype=q.dtype, device=q.device)
        mla_decode_launch(q, kv, bt, seq, mla_params(BLOCK_T=32, MERGE=1), d_v=d_v, num_splits=num_splits,
                          scratch=scratch, out=out)  # fmt: skip
        assert_verbose_allclose(out, ref, 1e-2, 1e-2)
        assert int(scratch["counters"].abs().sum()) == 0


def test_merge_refuses_a_scratch_without_tickets():
    from kinv.kernels.mla_decode import mla_decode_launch, mla_decode_scratch

    q, kv, bt, seq, d_v = make([40], 16, "v4flash", 16, torch.float16)
    scratch = mla_decode_scratch(1, 16, 2, d_v, q.device)
    del scratch["counters"]
    with pytest.raises(ValueError, match="MERGE=1 needs scratch\\['counters'\\]"):
        mla_decode_launch(q, kv, bt, seq, mla_params(MERGE=1), d_v=d_v, num_splits=2, scratch=scratch)


def test_optional_tunables_left_out_or_at_default_are_the_same_config():
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.launch_config import config_hash, describe, validate_config

    seed = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    explicit = validate_config({**seed, "CTAS_PER_SM": 0, "TMA": 0, "MERGE": 0})
    assert config_hash(explicit) == config_hash(seed) == "a5991bb8b0f6"  # the seed's hash, unchanged
    assert describe(explicit) == "BT16/BH16/w4/s2"
    assert describe({**seed, "CTAS_PER_SM": 2, "TMA": 1}) == "BT16/BH16/w4/s2/cps2/tma1"
    assert describe({**seed, "MERGE": 1}) == "BT16/BH16/w4/s2/mrg1"
    assert config_hash({**seed, "TMA": 1}) != config_hash(seed)
    with pytest.raises(ConfigError, match=r"TMA=2 is invalid: must be 0 \(gathered KV rows\) or 1"):
        validate_config({**seed, "TMA": 2})
    # the register cap: absent or 0 is no cap and the seed's config; a cap is a config of its own
    assert config_hash(validate_config({**seed, "maxnreg": 0})) == "a5991bb8b0f6"
    assert describe({**seed, "num_warps": 8, "maxnreg": 64}) == "BT16/BH16/w8/s2/nreg64"
    with pytest.raises(ConfigError, match=r"maxnreg=60 is invalid: must be 0 \(no cap\) or a cap on registers"):
        validate_config({**seed, "maxnreg": 60})
    # the least tiles per split: absent or 0 is the split rule alone and the seed's config
    assert config_hash(validate_config({**seed, "MIN_SPLIT_TILES": 0})) == "a5991bb8b0f6"
    assert describe({**seed, "MIN_SPLIT_TILES": 4}) == "BT16/BH16/w4/s2/mst4"
    assert config_hash(validate_config({**seed, "MERGE_BLOCK_DV": 0, "MERGE_BLOCK_S": 0})) == "a5991bb8b0f6"
    assert describe({**seed, "MERGE_BLOCK_DV": 32, "MERGE_BLOCK_S": 64}) == "BT16/BH16/w4/s2/mdv32/mbs64"
    with pytest.raises(ConfigError, match=r"MIN_SPLIT_TILES=3 is invalid"):
        validate_config({**seed, "MIN_SPLIT_TILES": 3})


def _launch(adapter, params, shape="v4flash"):
    q, kv, bt, seq, d_v = make([40, 7], 16, shape, 16, torch.float32)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 40, "d_v": d_v}
    out, _ = adapter.launch(inputs, params)
    return out, mla_decode_reference(q, kv, bt, seq, d_v=d_v)


def test_a_least_tile_count_per_split_caps_the_splits_and_stays_correct():
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.mla_decode_adapter import splits_at

    # 4096 tokens in 64-token tiles at batch 1: the wave rule gives one tile a split (64 splits); at least 4 tiles
    # a split leaves 16; batch 32 already has 8 tiles a split, so the floor changes nothing there
    wave = mla_params(BLOCK_T=64, CTAS_PER_SM=2)
    least4 = mla_params(BLOCK_T=64, CTAS_PER_SM=2, MIN_SPLIT_TILES=4)
    assert splits_at(wave, 1, 16, 4096) == 64 and splits_at(least4, 1, 16, 4096) == 16
    assert splits_at(least4, 32, 16, 4096) == splits_at(wave, 32, 16, 4096) == 8
    assert splits_at(least4, 1, 16, 4096, target_ctas=1) == 1  # a check's one split is the rule alone
    adapter = get_adapter("mla_decode")
    level = adapter.level({"shape": "v3", "heads": 16, "page_size": 64, "context": 4096, "batch": 1})
    env = adapter.derived_env(level, least4, {})
    assert env["num_splits"] == 16 and "at least 4 tiles per split" in env["split_rule"]
    # the launch and its scratch agree on the count, and the output is the reference's (40 tokens, 16-token tiles:
    # 3 tiles, at most 2 splits at 2 tiles each)
    params = mla_params(BLOCK_T=16, MIN_SPLIT_TILES=2)
    q, kv, bt, seq, d_v = make([40, 7], 16, "v4flash", 16, torch.float32)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 40, "d_v": d_v}
    scratch = adapter.make_scratch(inputs, params)
    assert scratch["partial_o"].shape[2] == 2
    out, _ = adapter.launch(inputs, params, scratch=scratch)
    assert_verbose_allclose(out, mla_decode_reference(q, kv, bt, seq, d_v=d_v), 2e-3, 2e-3)


def test_the_merge_kernels_blocks_come_from_the_config_and_stay_correct():
    from kinv.kernels import mla_decode as kernel
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.mla_decode_adapter import capped_launch

    fn = capped_launch(0, 32, 8)
    assert fn.__code__ is kernel.mla_decode_launch.__code__  # the source's own launch code, its constants the config's
    assert fn.__globals__["STAGE2_BLOCK_DV"] == 32 and fn.__globals__["STAGE2_BLOCK_S"] == 8
    assert kernel.STAGE2_BLOCK_DV == 128 and kernel.STAGE2_BLOCK_S == 32  # nothing patched in place
    # 200 tokens in 16-token tiles at TARGET_CTAS 512: 13 splits a request, merged 8 at a time over 32 value columns
    adapter = get_adapter("mla_decode")
    params = mla_params(BLOCK_T=16, MERGE_BLOCK_DV=32, MERGE_BLOCK_S=8)
    q, kv, bt, seq, d_v = make([200, 7], 16, "v4flash", 16, torch.float32)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 200, "d_v": d_v}
    assert adapter.make_scratch(inputs, params)["partial_o"].shape[2] == 13
    out, _ = adapter.launch(inputs, params)
    assert_verbose_allclose(out, mla_decode_reference(q, kv, bt, seq, d_v=d_v), 2e-3, 2e-3)


@pytest.mark.parametrize("merge", [0, 1])
def test_sixteen_bit_partial_outputs_halve_the_scratch_and_stay_correct(merge):
    """PARTIAL_DTYPE 16: stage 1 stores its partial outputs in the inputs' 16-bit dtype (the merge, in stage 2 or in
    stage 1's last split, still sums in float32); float32 inputs keep float32 partials; 0 is the seed's config."""
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.launch_config import config_hash, describe, validate_config

    seed = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    assert config_hash(validate_config({**seed, "PARTIAL_DTYPE": 0})) == "a5991bb8b0f6"
    assert describe({**seed, "PARTIAL_DTYPE": 16}) == "BT16/BH16/w4/s2/pdt16"
    adapter = get_adapter("mla_decode")
    params = mla_params(BLOCK_T=16, MERGE=merge, PARTIAL_DTYPE=16)
    q, kv, bt, seq, d_v = make([200, 7], 16, "v3", 16, torch.float16, seed=5)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 200, "d_v": d_v}
    scratch = adapter.make_scratch(inputs, params)
    assert scratch["partial_o"].dtype == torch.float16 and scratch["partial_lse"].dtype == torch.float32
    assert scratch["partial_o"].shape[2] == 13  # 13 splits of one 16-token tile: every merge path has work
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    for out, _ in (adapter.launch(inputs, params, scratch=scratch), adapter.launch(inputs, params)):
        assert out.dtype == torch.float16
        assert_verbose_allclose(out, ref, 1e-2, 1e-2)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-3
    wide = {**inputs, "q": q.float(), "kv_cache": kv.float()}
    assert adapter.make_scratch(wide, params)["partial_o"].dtype == torch.float32


def test_a_register_cap_launches_stage_one_capped_and_stays_correct():
    """maxnreg reaches stage 1's launch as Triton's ``maxnreg`` (the interpreter takes and ignores it), through
    the kernel's own launch code; no other launch in the process is capped, and no cap is the function itself."""
    from kinv.kernels import mla_decode as kernel
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.mla_decode_adapter import capped_launch

    adapter = get_adapter("mla_decode")
    capped = capped_launch(64)
    assert capped_launch(0) is kernel.mla_decode_launch and capped.__code__ is kernel.mla_decode_launch.__code__
    assert capped.__globals__["_mla_decode_stage1"].maxnreg == 64
    assert kernel._mla_decode_stage1 is capped.__globals__["_mla_decode_stage1"].kernel  # the module's own: uncapped
    seen = []
    stage1 = kernel._mla_decode_stage1

    class Spy:
        def __getitem__(self, grid):
            launch = stage1[grid]
            return lambda *a, **kw: (seen.append(kw.get("maxnreg")), launch(*a, **kw))[1]

        def __getattr__(self, name):
            return getattr(stage1, name)

    kernel._mla_decode_stage1 = Spy()
    try:
        out, ref = _launch(adapter, mla_params(num_warps=8, maxnreg=64))
        _launch(adapter, mla_params())
    finally:
        kernel._mla_decode_stage1 = stage1
    assert seen == [64, None], seen
    assert_verbose_allclose(out, ref, 2e-3, 2e-3)


def test_an_override_can_name_the_model_shape():
    # V3 and V4-Flash want different tiles at batch 96; "shape" is matched by value, first match wins
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.launch_config import describe, validate_config

    cfg = validate_config({"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
                           "overrides": [{"shape": "v3", "batch_min": 96, "BLOCK_T": 32, "CTAS_PER_SM": 3},
                                         {"batch_min": 64, "MERGE": 1}]})  # fmt: skip
    assert describe(cfg) == "BT64/BH16/w4/s2 [v3 b>=96: BT32,cps3; b>=64: mrg1]"
    a = get_adapter("mla_decode")

    def at(shape, b):
        return a.params_for(cfg, a.level({"shape": shape, "heads": 16, "page_size": 64, "context": 4096, "batch": b}))

    assert at("v3", 96).short() == "BT32/BH16/w4/s2/cps3" and at("v3", 64).short() == "BT64/BH16/w4/s2/mrg1"
    assert at("v4flash", 96).short() == "BT64/BH16/w4/s2/mrg1"
    with pytest.raises(ConfigError, match=r"overrides\[0\]\.shape='v2' is invalid: must be one of v3, v4flash"):
        validate_config({**cfg, "overrides": [{"shape": "v2", "BLOCK_T": 32}]})


def test_bad_inputs_are_refused_with_the_shape():
    q, kv, bt, seq, d_v = make([8], 16, "v3", 16, torch.float16)
    with pytest.raises(ValueError, match="row width"):
        mla_decode(q[..., :512], kv, bt, seq, mla_params(), d_v=d_v)
    with pytest.raises(ValueError, match="dtype"):
        mla_decode(q.float(), kv, bt, seq, mla_params(), d_v=d_v)


# --------------------------------------------------------------------------- #
# bf16 on the GPU
# --------------------------------------------------------------------------- #
@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["v3", "v4flash"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_gpu_bf16_shapes_pages_heads(shape, page_size, heads):
    lens = [1, 15, 17, 1000, 4096, 333]
    run_case(lens, heads, shape, page_size, torch.bfloat16, 3e-2, 3e-2, seed=heads + page_size)


@pytest.mark.gpu
@pytest.mark.parametrize("block_t", [16, 32])
@pytest.mark.parametrize("num_warps", [4, 8])
@pytest.mark.parametrize("num_stages", [1, 2, 3])
@pytest.mark.parametrize("shape", ["v3", "v4flash"])
def test_gpu_bf16_every_config(block_t, num_warps, num_stages, shape):
    params = mla_params(BLOCK_T=block_t, BLOCK_H=16, num_warps=num_warps, num_stages=num_stages)
    for num_splits in (1, 6, 64, 300):
        run_case([4096, 77, 2049], 16, shape, 64, torch.bfloat16, 3e-2, 3e-2, params=params, num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("num_warps,maxnreg,ctas", [(4, 80, 6), (8, 64, 4)])
def test_gpu_register_cap_raises_warps_per_sm_and_stays_correct(num_warps, maxnreg, ctas):
    """A register cap shows in the compiled kernel: at most ``maxnreg`` registers per thread, and the CTAs per SM
    it was chosen for (shared memory allows 6 of the seed's BT16/s2 CTAs on an H100/H200)."""
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.devices import get_device

    adapter = get_adapter("mla_decode")
    params = mla_params(num_warps=num_warps, maxnreg=maxnreg)
    q, kv, bt, seq, d_v = make([4096, 77, 2049], 16, "v4flash", 64, torch.bfloat16)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 4096, "d_v": d_v}
    out, compiled = adapter.launch(inputs, params)
    assert_verbose_allclose(out, mla_decode_reference(q, kv, bt, seq, d_v=d_v), 3e-2, 3e-2)
    assert compiled.n_regs <= maxnreg, compiled.n_regs
    level = adapter.level({"shape": "v4flash", "heads": 16, "page_size": 64, "context": 4096, "batch": 3})
    occ = adapter.resources(params, level, get_device("sm_90"), compiled).occupancy
    assert occ["ctas_per_sm"] == ctas and occ["warps_per_sm"] == ctas * num_warps, occ


@pytest.mark.gpu
@pytest.mark.parametrize("block_t", [32, 64])
@pytest.mark.parametrize("num_warps,num_stages", [(4, 3), (8, 4)])
@pytest.mark.parametrize("shape", ["v3", "v4flash"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_gpu_bf16_tma_and_wave_rule(block_t, num_warps, num_stages, shape, page_size):
    # bulk loads where BLOCK_T divides the page (64), gathered rows elsewhere (1, 16)
    params = mla_params(BLOCK_T=block_t, num_warps=num_warps, num_stages=num_stages, CTAS_PER_SM=2, TMA=1)
    for num_splits in (None, 1, 64):
        run_case([4096, 77, 2049], 16, shape, page_size, torch.bfloat16, 3e-2, 3e-2, params=params, num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [0, 1])
@pytest.mark.parametrize("shape", ["v3", "v4flash"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_gpu_bf16_merge_in_stage1(tma, shape, page_size):
    # the shipped batch >= 64 config (#9b): splits merged by the last one to finish, tickets across programs
    params = mla_params(BLOCK_T=64, num_warps=4, num_stages=2, CTAS_PER_SM=2, TMA=tma, MERGE=1)
    for num_splits in (None, 1, 4, 64):
        run_case([4096, 77, 2049, 1], 16, shape, page_size, torch.bfloat16, 3e-2, 3e-2, params=params,
                 num_splits=num_splits)  # fmt: skip


def test_a_variant_of_the_merge_kernels_blocks_moves_its_own_premise_not_stage_ones_ctas():
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.devices import get_device

    adapter = get_adapter("mla_decode")
    level = adapter.level({"shape": "v3", "heads": 16, "page_size": 64, "context": 4096, "batch": 1})
    shipped = mla_params(BLOCK_T=64, num_warps=8, CTAS_PER_SM=2, TMA=1)
    blocks = mla_params(BLOCK_T=64, num_warps=8, CTAS_PER_SM=2, TMA=1, MERGE_BLOCK_DV=16, MERGE_BLOCK_S=128)
    read = adapter.premises["merge_parallelism"].read
    figures = [{"compiled": {"ctas_per_sm": 2}, "why": adapter.resources(p, level, get_device("sm_90")).why}
               for p in (shipped, blocks)]  # fmt: skip
    assert [f["why"]["ctas"] for f in figures] == [64, 64]  # stage 1 as it was: the builtin premise cannot see it
    assert read(figures[0]) == (64, "128 value columns x 32 splits a load")  # 1 request x 16 heads x 4 blocks
    assert read(figures[1]) == (512, "16 value columns x 64 splits a load")  # 64 splits: one load of all of them
    merged = {"compiled": {"ctas_per_sm": 2}, "why": adapter.resources(mla_params(MERGE=1), level, get_device("sm_90")).why}
    assert read(merged) == (0, "merged in stage 1") and read({"compiled": None, "why": figures[0]["why"]}) is None


def test_sixteen_bit_partial_outputs_move_the_partial_bytes_premise_down():
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.devices import get_device

    adapter = get_adapter("mla_decode")
    level = adapter.level({"shape": "v3", "heads": 16, "page_size": 64, "context": 4096, "batch": 8})
    read = adapter.premises["partial_bytes"].read
    assert adapter.premises["partial_bytes"].direction == "down"
    wide, narrow = (mla_params(BLOCK_T=64, CTAS_PER_SM=2, PARTIAL_DTYPE=p) for p in (0, 16))
    figures = [{"compiled": {"ctas_per_sm": 2}, "why": adapter.resources(p, level, get_device("sm_90")).why}
               for p in (wide, narrow)]  # fmt: skip
    # 8 requests x 16 heads x 32 splits x 512 values: 8 MiB of float32, half of it in bf16
    assert read(figures[0]) == (8 * 16 * 32 * 512 * 4, "32 splits x float32 partial outputs")
    assert read(figures[1]) == (8 * 16 * 32 * 512 * 2, "32 splits x 16-bit partial outputs")
    assert read({"compiled": None, "why": figures[0]["why"]}) is None  # an arm that did not compile shows nothing


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["v3", "v4flash"])
@pytest.mark.parametrize("merge,tma", [(0, 0), (0, 1), (1, 0)])
def test_gpu_bf16_partial_outputs_stay_within_the_gate(shape, merge, tma):
    """bf16 partial outputs on the GPU: within the adapter's own error bound at context 4096, every split count."""
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.mla_decode import mla_decode_scratch

    adapter = get_adapter("mla_decode")
    params = mla_params(BLOCK_T=64, CTAS_PER_SM=2, TMA=tma, MERGE=merge, PARTIAL_DTYPE=16)
    q, kv, bt, seq, d_v = make([4096, 77, 2049], 16, shape, 64, torch.bfloat16, seed=9)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 4096, "d_v": d_v}
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    level = adapter.level({"shape": shape, "heads": 16, "page_size": 64, "context": 4096, "batch": 3})
    norm = adapter.tolerance_at(torch.bfloat16, level, ref)[2]
    for splits in (None, 1, 8, 64):
        scratch = adapter.make_scratch(inputs, params)  # the adapter's split count, or a forced one below
        if splits is not None:
            scratch = mla_decode_scratch(3, 16, splits, d_v, q.device)
            scratch["partial_o"] = scratch["partial_o"].to(torch.bfloat16)
        out = mla_decode(q, kv, bt, seq, params, d_v=d_v, max_seq_len=4096, num_splits=scratch["partial_o"].shape[2],
                         scratch=scratch)  # fmt: skip
        assert ((out.float() - ref).norm() / ref.norm()).item() < norm
