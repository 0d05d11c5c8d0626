"""The correctness gate, on CPU through the Triton interpreter (small stand-in levels)."""

from __future__ import annotations

import json

import pytest
import torch

from kinv.agent.store.db import Store
from kinv.agent.tools.measure import correctness
from kinv.agent.tools.worker import gate, tamper
from kinv.kernels.adapter import get_adapter
from kinv.kernels.mla_decode_adapter import MLADecodeAdapter

ADAPTER = get_adapter("mla_decode")
BASE = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}


def lvl(batch, context, shape="v4flash", heads=16, page_size=64):
    """An MLA level (the adapter builds it: key and label as everywhere else)."""
    return ADAPTER.level({"shape": shape, "heads": heads, "page_size": page_size, "context": context, "batch": batch})


LEVEL = lvl(batch=1, context=40, shape="v4flash", heads=16, page_size=16)


class WrongAdapter(MLADecodeAdapter):
    """Fast but wrong: a quarter too large (1% would sit inside the fp16 tolerance of 1e-2 + 1e-2 x |ref|)."""

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        res, compiled = super().launch(inputs, params, out=out, scratch=scratch, **mode)
        return res * 1.25, compiled


class NaNAdapter(MLADecodeAdapter):
    def launch(self, inputs, params, out=None, scratch=None, **mode):
        res, compiled = super().launch(inputs, params, out=out, scratch=scratch, **mode)
        res[0, 0, 0] = float("nan")
        return res, compiled


class BrokenAdapter(MLADecodeAdapter):
    def launch(self, inputs, params, out=None, scratch=None, **mode):
        raise RuntimeError("out of resource: shared memory, Required: 204800, Hardware limit: 101376\nmore detail")


class SpyAdapter(MLADecodeAdapter):
    def __init__(self):
        self.seen = []

    def make_inputs(self, level, seed, device="cuda", dtype=None, vary_lengths=False):
        inputs = super().make_inputs(level, seed, device, dtype, vary_lengths)
        self.seen.append((level, inputs["q"].clone(), inputs["seq_lens"].clone(), vary_lengths, dtype))
        return inputs

    def launch(self, inputs, params, out=None, scratch=None, **mode):  # skip the kernel: the reference is exact
        return self.reference(inputs).to(inputs["q"].dtype), None


class LazyInOneModeAdapter(MLADecodeAdapter):
    """Writes nothing in the one-split mode when handed an output: whatever the buffer held comes back."""

    def __init__(self):
        self.launches = 0

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        self.launches += 1
        if out is not None and mode.get("target_ctas") == 1:
            return out, None
        return super().launch(inputs, params, out=out, scratch=scratch, **mode)


def test_every_launch_mode_writes_into_a_poisoned_buffer_so_a_mode_that_writes_nothing_is_caught():
    lazy = LazyInOneModeAdapter()
    r = gate.check(lazy, BASE, [LEVEL], seed=3, device="cpu")
    assert not r["ok"]
    assert "not finite" in r["reason"] and "target_ctas=1" in r["reason"], r["reason"]
    # the adapter's empty output is the buffer: one launch per mode (the plain split count, one split), and the
    # first mode once more on inputs rewritten in place
    assert lazy.launches == len(lazy.check_modes()) + 1


class LazySizedByALaunchAdapter(LazyInOneModeAdapter):
    def make_output(self, inputs, params):
        return None  # no empty output: the gate sizes the buffer with a launch of its own


def test_without_an_empty_output_one_launch_sizes_the_poisoned_buffer_and_a_lazy_mode_is_still_caught():
    lazy = LazySizedByALaunchAdapter()
    r = gate.check(lazy, BASE, [LEVEL], seed=4, device="cpu")
    assert not r["ok"] and "not finite" in r["reason"] and "target_ctas=1" in r["reason"], r["reason"]
    assert lazy.launches == 1 + len(lazy.check_modes()) + 1


def test_stand_in_levels_are_small():
    big = lvl(96, 4096, "v3", 16, 64)
    # on CPU 4 heads of the tile's 16: the interpreter runs the merge once per (request, head, value block), and
    # the masked heads of a partly filled tile are checked too; every head is checked on a GPU
    assert ADAPTER.stand_in(big, "cpu") == lvl(2, 64, "v3", 4, 16)
    assert ADAPTER.stand_in(big, "cuda") == lvl(8, 4096, "v3", 16, 64)
    # on a GPU the context is the level's own: a kernel wrong only at long contexts is caught there
    assert ADAPTER.stand_in(lvl(64, 65536), "cuda") == lvl(8, 65536)
    assert ADAPTER.stand_in(lvl(1, 40, page_size=8), "cpu") == lvl(1, 40, "v4flash", 4, 8)


def test_baseline_passes_at_a_small_level():
    r = gate.check(MLADecodeAdapter(), BASE, [LEVEL], seed=0, device="cpu")
    assert r["ok"], r["reason"]
    assert r["dtype"] == "float16" and r["device"] == "cpu" and r["seed"] == 0 and r["reason"] == ""
    (lv,) = r["levels"]
    assert lv["ok"] and lv["mismatched"] == 0 and lv["nonfinite"] == 0 and lv["level"] == LEVEL.key
    assert 0 <= lv["rel_err"] < 1e-2 and lv["max_abs_err"] < 1e-2
    json.dumps(r)


def test_a_fast_but_wrong_kernel_is_caught(state_dir):
    r = gate.check(WrongAdapter(), BASE, [LEVEL], seed=0, device="cpu")
    assert not r["ok"] and r["levels"][0]["mismatched"] > 0
    assert r["reason"].startswith(f"{LEVEL.key}: ") and "outside atol=0.01, rtol=0.01" in r["reason"]
    store = Store(state_dir)
    exp = store.new_experiment(workstream=None, variant="V9")
    correctness.record(store, None, exp, r)
    row = store.experiment(exp)
    assert (row["status"], row["verdict"]) == ("rejected", "reject")
    assert row["reason"] == f"incorrect: {r['reason']}"
    assert json.loads(row["correctness"])["ok"] is False
    store.close()


def test_non_finite_output_is_caught():
    r = gate.check(NaNAdapter(), BASE, [LEVEL], seed=0, device="cpu")
    modes = len(NaNAdapter().check_modes())  # the planted NaN is caught in every launch mode
    assert not r["ok"] and r["levels"][0]["nonfinite"] == modes and "not finite" in r["reason"]


def test_a_launch_that_raises_is_a_failed_check():
    r = gate.check(BrokenAdapter(), BASE, [LEVEL, lvl(8, 64)], seed=0, device="cpu")
    assert not r["ok"]
    assert r["reason"] == "launch failed: RuntimeError: out of resource: shared memory, Required: 204800, " \
        "Hardware limit: 101376"  # fmt: skip
    assert len(r["levels"]) == 1  # the same failure is not repeated at every level


def test_fresh_varied_inputs_per_distinct_launch_and_seed(state_dir):
    """Every call draws fresh inputs for every distinct launch; levels that would launch the same program on
    the same stand-in problem share one launch and say so."""
    spy = SpyAdapter()
    levels = [lvl(96, 4096, "v3", 16, 64), lvl(8, 4096, "v3", 16, 64), lvl(1, 4096, "v3", 16, 64)]
    r1 = gate.check(spy, BASE, levels, seed=1, device="cpu")
    r2 = gate.check(spy, BASE, levels, seed=2, device="cpu")
    assert r1["ok"] and r2["ok"]
    assert len(spy.seen) == 4  # b96 and b8 both stand in as b2/ctx64: one launch per call; b1 its own
    assert [lv for lv, *_ in spy.seen] == [lvl(2, 64, "v3", 4, 16), lvl(1, 64, "v3", 4, 16)] * 2
    for _level, _q, lens, vary, dtype in spy.seen:
        assert vary and dtype == torch.float16 and lens.max() == 64
    assert [e["level"] for e in r1["levels"]] == [lv.key for lv in levels]
    assert [e.get("same_as") for e in r1["levels"]] == [None, levels[0].key, None]
    qs = [q for _, q, *_ in spy.seen if q.shape[0] == 2]
    assert not torch.equal(qs[0], qs[1])  # a second check draws new inputs
    store = Store(state_dir)
    exp = store.new_experiment(workstream=None, variant="V1")
    correctness.record(store, None, exp, r1)
    assert store.experiment(exp)["status"] == "running" and store.events()[-1]["kind"] == "correctness.ok"
    assert "2 distinct stand-in launch(es)" in store.events()[-1]["message"]
    store.close()


def test_levels_with_their_own_parameters_are_checked_on_their_own():
    """A per-level config (an override by batch) launches different programs: no level shares another's check,
    and a wrong kernel is caught at each level that ran it, naming the level."""
    cfg = {**BASE, "overrides": [{"batch_min": 2, "batch_max": 8, "BLOCK_T": 32}]}
    spy = SpyAdapter()
    levels = [lvl(96, 4096), lvl(8, 4096)]
    r = gate.check(spy, cfg, levels, seed=3, device="cpu")
    assert r["ok"] and len(spy.seen) == 2 and not any(e.get("same_as") for e in r["levels"])
    bad = gate.check(WrongAdapter(), BASE, [lvl(96, 64), lvl(8, 64)], seed=3, device="cpu")
    assert not bad["ok"] and [e["ok"] for e in bad["levels"]] == [False, False]
    assert bad["levels"][1]["same_as"] == lvl(96, 64).key
    assert bad["levels"][1]["reason"].startswith(f"{lvl(8, 64).key}: as {lvl(96, 64).key}")


@pytest.mark.gpu
def test_gpu_baseline_bf16():
    r = gate.check(MLADecodeAdapter(), BASE, [lvl(1, 4096), lvl(96, 4096)], seed=0)
    assert r["ok"], r["reason"]
    assert r["device"] == "cuda" and r["dtype"] == "bfloat16"


class PointerCacheAdapter(MLADecodeAdapter):
    """Returns the first result it computed for the same input addresses (a known benchmark exploit)."""

    def __init__(self):
        self.cache = {}

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        key = (inputs["q"].data_ptr(), inputs["kv_cache"].data_ptr())
        if key in self.cache:
            return (out.copy_(self.cache[key]) if out is not None else self.cache[key].clone()), None
        res, compiled = super().launch(inputs, params, out=out, scratch=scratch, **mode)
        self.cache[key] = res.clone()
        return res, compiled


def test_a_result_cached_by_input_address_is_caught_when_the_inputs_change_in_place():
    r = gate.check(PointerCacheAdapter(), BASE, [LEVEL], seed=5, device="cpu")
    assert not r["ok"]
    assert "rewritten in place at the same addresses" in r["reason"], r["reason"]


class TimerPatchingAdapter(MLADecodeAdapter):
    """Its launch replaces the event timer the harness reads (as a kernel module could at import)."""

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        torch.cuda.Event.elapsed_time = lambda self, end: 0.0
        return super().launch(inputs, params, out=out, scratch=scratch, **mode)


def test_a_kernel_that_replaces_the_timer_fails_the_gate_whatever_its_outputs(monkeypatch):
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", torch.cuda.Event.elapsed_time)  # restored afterwards
    tamper.timer_snapshot()  # resolvable on a machine without a GPU
    r = gate.check(TimerPatchingAdapter(), BASE, [LEVEL], seed=6, device="cpu")
    assert not r["ok"]
    assert "replaced the harness's timer" in r["reason"] and "torch.cuda.Event.elapsed_time" in r["reason"], r["reason"]
    assert r["levels"][0]["tampered"] == ["torch.cuda.Event.elapsed_time"]


class Float8KVAdapter(MLADecodeAdapter):
    """Reads the KV at float8 precision: 1-7% error, a silent downcast."""

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        kv = inputs["kv_cache"].to(torch.float8_e4m3fn).to(inputs["kv_cache"].dtype)
        return super().launch({**inputs, "kv_cache": kv}, params, out=out, scratch=scratch, **mode)


def test_a_kv_read_at_float8_precision_fails_the_gate():
    r = gate.check(Float8KVAdapter(), BASE, [LEVEL], seed=7, device="cpu")
    assert not r["ok"] and r["levels"][0]["rel_err"] > 1e-2, r["reason"]


class SlightlyScaledAdapter(MLADecodeAdapter):
    """Every output 0.5% too large: inside the element-wise tolerance (1e-2 + 1e-2 x |ref|), and a precision
    loss well beyond float16's own (2.6e-4 measured in the interpreter)."""

    def launch(self, inputs, params, out=None, scratch=None, **mode):
        return self.reference(inputs).to(inputs["q"].dtype) * 1.005, None


def test_the_error_norm_bound_catches_a_precision_loss_the_element_wise_tolerance_lets_through():
    r = gate.check(SlightlyScaledAdapter(), BASE, [LEVEL], seed=8, device="cpu")
    assert not r["ok"] and r["levels"][0]["mismatched"] == 0
    assert "above the level's bound" in r["reason"], r["reason"]


def test_the_tolerance_follows_the_outputs_scale_so_long_contexts_are_checked_as_hard_as_short_ones():
    small = torch.full((4, 16, 512), 0.05)  # the rms of attention outputs on random data at 4096 tokens
    atol_small, rtol, norm = ADAPTER.tolerance_at(torch.bfloat16, lvl(8, 4096), small)
    atol_big, _, _ = ADAPTER.tolerance_at(torch.bfloat16, lvl(8, 64), torch.ones(4, 16, 512))
    assert atol_big == ADAPTER.tolerance(torch.bfloat16)[0] == 3e-2
    assert atol_small == pytest.approx(0.25 * 0.05)  # a fixed 3e-2 would let a 60% error through
    assert norm == 6e-3 and rtol == 3e-2
