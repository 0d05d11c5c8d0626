"""The roofline: one rule for the fewest seconds a call can take, and the bound that names it."""

from __future__ import annotations

import pytest

from kinv.kernels.devices import roofline


def test_the_slower_of_memory_and_compute_bounds_the_call():
    # 3.35 GB at 3350 GB/s: 1 ms of memory; 100 GFLOP at 1000 TFLOP/s: 0.1 ms of compute
    assert roofline(3.35e9, 1e11, 3350.0, 1000.0) == (pytest.approx(1e-3), "memory")
    # the same bytes with 10 TFLOP of work: 10 ms of compute
    assert roofline(3.35e9, 1e13, 3350.0, 1000.0) == (pytest.approx(1e-2), "compute")


def test_with_one_figure_the_other_bound_is_not_guessed():
    assert roofline(1e9, 1e12, None, 1000.0) == (pytest.approx(1e-3), "compute")
    assert roofline(1e9, 1e12, 1000.0, None) == (pytest.approx(1e-3), "memory")
    assert roofline(1e9, 1e12, None, None) is None


def test_an_adapter_asks_the_same_rule():
    from kinv.agent.plan_file import load_plan
    from kinv.kernels.adapter import project_root

    plan, _ = load_plan(project_root() / "plans" / "3a-attention-occupancy.yaml")
    for lv in plan.levels():
        assert plan.adapter.roofline(lv, 3350.0, 990.0) == roofline(plan.adapter.bytes_moved(lv),
                                                                     plan.adapter.flops(lv), 3350.0, 990.0)
