"""The measurement protocol and the backend plugins: one round order and seed for every loop, screening
estimates with the A/B's intervals, and a backend added by one registration."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kinv.agent.errors import BackendError, NoRecording
from kinv.agent.plan_file import load_plan
from kinv.agent.tools.backends import base, replay
from kinv.agent.tools.measure import protocol
from kinv.agent.tools.runners import bench
from kinv.agent.tools.runners.space import feasibility, space_configs

ROOT = Path(__file__).resolve().parents[4]


def test_round_order_is_abba_for_a_pair_and_rotated_for_more_arms():
    assert [protocol.round_order(2, r, abba=True) for r in range(4)] == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert [protocol.round_order(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert protocol.rotated(["I", "C1", "C2"], 4) == ["C1", "C2", "I"]
    assert base.round_seed(0) == 1000 and base.round_seed(7) == 1007  # what the recordings drew


def test_the_gpu_second_ledger_sums_samples_without_a_time_as_zero():
    assert protocol.gpu_seconds([{"gpu_s": 0.5}, {"gpu_s": None}, {}, {"gpu_s": 0.25}]) == 0.75


def test_kinv_bench_and_the_graph_build_the_sequential_ab_in_one_place():
    plan = load_plan(str(ROOT / "plans/3a-attention-occupancy.yaml"))[0]
    full = protocol.sequential_plan(plan.stats)
    assert (full.quick_rounds, full.step_rounds, full.max_rounds, full.conf) == (
        plan.stats.quick_rounds, plan.stats.step_rounds, plan.stats.max_rounds, plan.stats.conf)  # fmt: skip
    capped = protocol.sequential_plan(plan.stats, max_rounds=4)
    assert capped.max_rounds == 4 and capped.quick_rounds == 4  # the quick look never after the cap


def test_a_screening_estimate_comes_with_the_ab_interval_around_the_mean_log_ratio():
    base, cand = [100.0, 101.0, 99.5, 100.2], [95.0, 96.5, 94.0, 95.1]
    e = protocol.screen_effect(base, cand, "b32")
    mean = sum(math.log(b / c) for b, c in zip(base, cand)) / len(base)
    assert e["gain"] == pytest.approx(math.expm1(mean), rel=1e-12) and e["n"] == 4
    assert e["ci_low"] < e["gain"] < e["ci_high"]
    one = protocol.screen_effect([100.0], [95.0], "b32")  # one round: an estimate, no interval
    assert one["gain"] == pytest.approx(100 / 95 - 1) and one["ci_low"] is None and one["ci_high"] is None


def test_a_screened_candidate_on_replay_has_a_gain_and_an_interval_at_every_level(monkeypatch):
    """screen_shard on the recorded sweep of campaign #7: each candidate's per-level change is the paired
    estimate of its stored rows against the incumbent's (the same numbers the optimizer is told), inside
    its interval."""
    from kinv.agent.tools.runners.screening import screen_shard

    monkeypatch.setenv("KINV_FORCE_NO_GPU", "1")
    plan = load_plan(str(ROOT / "plans/7-decode-ceiling.yaml"))[0]
    seed = {**plan.baseline, "kernel": plan.adapter.name}
    cands = [c for c in space_configs(plan) if feasibility(plan, c)[0] and c != seed][:2]
    from kinv.kernels.launch_config import config_hash

    levels = [lv.to_dict() for lv in plan.levels()[2:4]]
    res = screen_shard("replay", plan.kernel, dict(plan.environment), seed, {config_hash(c): c for c in cands},
                       levels, rounds=3, round0=0, exp=1)  # fmt: skip
    assert not res["failed"] and set(res["gains"]) == set(res["intervals"]) == {config_hash(c) for c in cands}
    assert res["gpu_s"] == pytest.approx(protocol.gpu_seconds(res["rows"]))
    for h, by in res["gains"].items():
        assert len(by) == 2
        for level, g in by.items():
            inc = [r["us"] for r in res["rows"] if r["arm"] == "I" and r["level"] == level]
            mine = [r["us"] for r in res["rows"] if r["arm"] == f"C{h[:6]}" and r["level"] == level]
            assert len(inc) == len(mine) == 3
            assert g == pytest.approx(math.expm1(sum(math.log(a / b) for a, b in zip(inc, mine)) / 3), rel=1e-9)
            lo, hi = res["intervals"][h][level]
            assert lo < g < hi


def test_a_backend_is_one_class_and_one_registration(monkeypatch):
    """A registered backend is a valid --backend name and what bench.get_backend builds."""
    from kinv.agent.tools import backends

    class Lone(base.Backend):
        name = "lone"
        loud = "LONE backend"

        def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant"):
            raise NoRecording("nothing to open")

    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setattr(backends, "BACKENDS", list(backends.BACKENDS))
    backends.register_backend("lone", Lone)
    assert "lone" in backends.BACKENDS and isinstance(bench.get_backend("lone"), Lone)
    with pytest.raises(BackendError, match="unknown backend 'nope'; valid: auto, cuda, replay, command, lone"):
        bench.get_backend("nope")
    with pytest.raises(ValueError):
        backends.register_backend("auto", Lone)
    assert replay.ReplayBackend is backends.backend_class("replay")


def test_every_backend_and_its_arms_subclass_the_interface():
    from kinv.agent.tools.backends.cuda import CudaArm, CudaBackend
    from kinv.agent.tools.backends.ray import RayBackend
    from kinv.agent.tools.backends.replay import ReplayArm, ReplayBackend

    for cls in (CudaBackend, ReplayBackend, RayBackend):
        assert issubclass(cls, base.Backend)
    for cls in (CudaArm, ReplayArm):
        assert issubclass(cls, base.Arm)
