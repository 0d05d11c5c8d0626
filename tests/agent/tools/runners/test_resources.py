"""Feasibility and why-figures: local heads, head tile, shared memory vs device limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinv.agent.plan_file import load_plan
from kinv.agent.store.db import Store
from kinv.agent.tools.runners import resources
from kinv.kernels.adapter import get_adapter
from kinv.kernels.devices import get_device
from kinv.kernels.mla_decode_adapter import block_h_for, local_heads

ROOT = Path(__file__).resolve().parents[4]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"
ADAPTER = get_adapter("mla_decode")


def lvl(batch, context, shape="v4flash", heads=16, page_size=64):
    """An MLA level by its dimensions (the adapter builds it, key and label included)."""
    return ADAPTER.level({"shape": shape, "heads": heads, "page_size": page_size, "context": context, "batch": batch})


def test_local_heads_and_block_h():
    assert local_heads(64, 4) == 16
    assert block_h_for(local_heads(64, 4)) == 16
    assert block_h_for(32) == 32
    assert block_h_for(17) == 32
    assert block_h_for(1) == 16
    assert block_h_for(512) == 128  # capped: the kernel loops over head tiles
    with pytest.raises(ValueError, match=r"64 heads do not split evenly over attention_tp=3; valid .*1, 2, 4"):
        local_heads(64, 3)
    with pytest.raises(ValueError, match="attention_tp=0 is invalid"):
        local_heads(64, 0)


def test_plan_3a_derives_its_levels_from_heads_and_tp():
    plan, _ = load_plan(PLAN)
    levels = plan.levels()
    assert [lv.label for lv in levels] == ["b1", "b8", "b32", "b64", "b96"]
    assert {(lv.shape, lv.heads, lv.page_size, lv.context) for lv in levels} == {("v4flash", 16, 64, 4096)}
    assert levels[0].key == "v4flash/h16/p64/ctx4096/b1"


def test_v2_of_plan_3a_fits_on_both_devices():
    plan, _ = load_plan(PLAN)
    v2 = plan.variant_config(plan.variant("V2"))
    levels = plan.levels()
    for arch in ("sm_90", "sm_120"):
        a = resources.assess(ADAPTER, v2, levels, get_device(arch))
        assert a["feasible"] and a["reason"] == ""
        assert 33_000 <= a["smem_estimate_max"] <= 34_000  # 32.6 KiB: far below 99 KB
        assert [lv["level"] for lv in a["levels"]] == [lv.key for lv in levels]
        for key in a["occupancy"]:
            assert a["occupancy"][key]["ctas_per_sm"] >= 1
            assert {"iterations_per_split", "tile", "ctas"} <= set(a["why"][key])
    json.dumps(a)  # storable as is


def test_a_config_too_big_for_sm_120_is_infeasible_there_only():
    cfg = {"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 64, "num_warps": 4, "num_stages": 1}
    levels = [lvl(8, 4096, "v3", 16, 64), lvl(96, 4096, "v3", 16, 64)]
    small = resources.assess(ADAPTER, cfg, levels, get_device("sm_120"))
    assert small["smem_estimate_max"] > 99 * 1024
    assert not small["feasible"]
    assert "99.0 KB" in small["reason"] and "sm_120" in small["reason"] and levels[0].key in small["reason"]
    assert small["occupancy"][levels[0].key]["ctas_per_sm"] == 0
    big = resources.assess(ADAPTER, cfg, levels, get_device("sm_90"))
    assert big["feasible"] and big["occupancy"][levels[0].key]["ctas_per_sm"] == 1


def test_per_level_overrides_are_honored():
    cfg = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
           "overrides": [{"batch_min": 9, "num_warps": 8}]}  # fmt: skip
    a = resources.assess(ADAPTER, cfg, [lvl(8, 4096), lvl(96, 4096)], get_device("sm_90"))
    assert [lv["params"]["num_warps"] for lv in a["levels"]] == [4, 8]


def test_predicted_change_and_record(state_dir):
    levels = [lvl(1, 4096), lvl(96, 4096)]
    dev = get_device("sm_90")
    base_cfg = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    base = resources.assess(ADAPTER, base_cfg, levels, dev)
    variant = resources.assess(ADAPTER, {**base_cfg, "BLOCK_T": 64}, levels, dev)
    delta = resources.predicted_change(base, variant)
    for lv in levels:
        d = delta[lv.key]
        assert d["smem_delta"] == d["smem_variant"] - d["smem_base"] > 0
        assert d["ctas_per_sm_delta"] == d["ctas_per_sm_variant"] - d["ctas_per_sm_base"] < 0
    store = Store(state_dir)
    exp = store.new_experiment(workstream=None, variant="V1")
    resources.record(store, None, exp, variant)
    assert json.loads(store.experiment(exp)["resources"])["config_hash"] == variant["config_hash"]
    assert store.events()[-1]["kind"] == "resources"
    store.close()
