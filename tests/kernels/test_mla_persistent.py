"""Persistent programs for the MLA kernel's stage 1, as the source patch a live investigation measures
(plans/patches/10a-persistent-stage1.diff): the patched kernel against the float32 reference, in the
interpreter on CPU (and in bf16 on a GPU), and the shipped source refusing a config that asks for them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kinv.kernels.mla_decode_adapter import mla_params
from kinv.kernels.mla_decode_ref import mla_decode_reference
from tests.kernels.test_mla_decode import make, sweep
from tests.utils import assert_verbose_allclose

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "plans" / "patches" / "10a-persistent-stage1.diff"


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """kernels/mla_decode.py with the patch applied, imported beside the shipped module (same package)."""
    from kinv.agent.tools.files.config_text import apply_unified_diff

    source = ROOT / "kernels" / "mla_decode.py"
    text = apply_unified_diff(source.read_text(), PATCH.read_text(), source)
    path = tmp_path_factory.mktemp("persistent") / "mla_decode_persistent.py"
    path.write_text(text)
    name = "kinv.kernels.mla_decode_persistent"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


@pytest.mark.parametrize("merge,num_splits,programs", sweep((1, 3, 2), (0, 3, 2), (1, 7, 4), (0, 1, 1)))
def test_persistent_programs_do_every_split_once_and_leave_the_queue_at_zero(patched, monkeypatch, merge,
                                                                           num_splits, programs):  # fmt: skip
    # fewer programs than (request, head tile, split) work items, each taking items from a queue: every item
    # done once, and the queue back at zero for the next launch (a CUDA graph replays the same scratch); two
    # launches on one scratch, lengths that leave some splits empty
    monkeypatch.setattr(patched, "_sm_count", lambda: programs)
    q, kv, bt, seq, d_v = make([200, 37, 1], 16, "v3", 16, torch.float16)
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    scratch = patched.mla_decode_scratch(3, 16, num_splits, d_v, q.device)
    for _ in range(2):
        out = torch.full((3, 16, d_v), float("nan"), dtype=q.dtype, device=q.device)
        patched.mla_decode_launch(q, kv, bt, seq, mla_params(BLOCK_T=32, MERGE=merge, PERSISTENT=1), d_v=d_v,
                                  num_splits=num_splits, scratch=scratch, out=out)  # fmt: skip
        assert_verbose_allclose(out, ref, 1e-2, 1e-2)
        assert int(scratch["queue"].abs().sum()) == 0 and int(scratch["counters"].abs().sum()) == 0


def test_the_patched_kernel_without_persistent_programs_is_still_right(patched):
    # the patch moves stage 1's body into a function both launch shapes call: the grid launch must not change
    q, kv, bt, seq, d_v = make([200, 37, 1], 16, "v4flash", 16, torch.float16)
    out = patched.mla_decode(q, kv, bt, seq, mla_params(BLOCK_T=32, MERGE=1), d_v=d_v, num_splits=3)
    assert_verbose_allclose(out, mla_decode_reference(q, kv, bt, seq, d_v=d_v), 1e-2, 1e-2)


def test_persistent_refuses_a_scratch_without_a_queue(patched):
    q, kv, bt, seq, d_v = make([40], 16, "v4flash", 16, torch.float16)
    scratch = patched.mla_decode_scratch(1, 16, 2, d_v, q.device)
    del scratch["queue"]
    with pytest.raises(ValueError, match=r"PERSISTENT needs scratch\['queue'\]"):
        patched.mla_decode_launch(q, kv, bt, seq, mla_params(PERSISTENT=2), d_v=d_v, num_splits=2, scratch=scratch)


def test_the_shipped_source_refuses_persistent_programs_instead_of_ignoring_them():
    from kinv.kernels.adapter import get_adapter

    a = get_adapter("mla_decode")
    level = a.level({"shape": "v4flash", "heads": 16, "page_size": 16, "context": 40, "batch": 1})
    inputs = a.make_inputs(level, seed=0, device="cpu", dtype=torch.float16)
    with pytest.raises(ValueError, match="PERSISTENT=2 needs persistent programs in kernels/mla_decode.py"):
        a.launch(inputs, mla_params(PERSISTENT=2))


def test_the_persistent_plan_loads_and_measures_the_patch_alone_first():
    from kinv.agent.plan_file import load_plan

    plan, _ = load_plan(ROOT / "plans" / "10a-decode-persistent.yaml")
    first = plan.variants[0]
    assert first.source_patch == "plans/patches/10a-persistent-stage1.diff" and set(first.patch) == {"overrides"}
    assert all(plan.variant_config(v)["overrides"] == plan.baseline["overrides"] for v in plan.variants)
    assert all(v.source_patch == first.source_patch for v in plan.variants)
    assert {plan.variant_config(v).get("PERSISTENT", 0) for v in plan.variants[1:]} - {0}


@pytest.mark.gpu
@pytest.mark.parametrize("merge", [0, 1])
@pytest.mark.parametrize("shape", ["v3", "v4flash"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_gpu_bf16_persistent_programs(patched, merge, shape, page_size):
    # the programs of every SM race for the queue's items
    params = mla_params(BLOCK_T=64, num_warps=4, num_stages=2, CTAS_PER_SM=2, TMA=1, MERGE=merge, PERSISTENT=1)
    q, kv, bt, seq, d_v = make([4096, 77, 2049, 1] * 8, 16, shape, page_size, torch.bfloat16)
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    for num_splits in (1, 4, 64):
        scratch = patched.mla_decode_scratch(32, 16, num_splits, d_v, q.device)
        for _ in range(3):
            out = patched.mla_decode_launch(q, kv, bt, seq, params, d_v=d_v, num_splits=num_splits,
                                            scratch=scratch)[0]  # fmt: skip
            assert_verbose_allclose(out, ref, 3e-2, 3e-2)
        assert int(scratch["queue"].abs().sum()) == 0
