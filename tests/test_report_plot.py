"""The close-out figure: a forest plot of the change per level against the threshold band, beside throughput."""

from __future__ import annotations

import math
from pathlib import Path

from kinv.agent.models import load_plan
from kinv.agent.report import figure

ROOT = Path(__file__).resolve().parents[1]


def _rows(levels, change: float, half: float) -> list[dict]:
    e = math.log1p(change)
    return [{"level": lv.key, "base_us": 100.0, "variant_us": 100.0 / (1 + change), "effect": e,
             "ci_low": e - half, "ci_high": e + half, "threshold": 0.01, "verdict": "improved", "conf": 0.999}
            for lv in levels]  # fmt: skip


def test_the_forest_plot_draws_each_measured_variant_per_level_and_never_an_unmeasured_one():
    plan, _ = load_plan(ROOT / "plans" / "3a-attention-occupancy.yaml")
    levels = plan.levels()
    data = {"variants": [
        {"exp": {"variant": "V1", "verdict": "accept"}, "verdicts": _rows(levels, 0.005, 0.002)},  # small: +0.5%
        {"exp": {"variant": "V2", "verdict": "reject"}, "verdicts": _rows(levels, -0.4, 0.01)},   # large: -40%
        {"exp": {"variant": "V3", "verdict": "void"}, "verdicts": _rows(levels, 0.0, 0.0)},       # never data
    ]}  # fmt: skip
    fig = figure(data, plan.adapter, levels, title="#3a test [REPLAY of H200 recordings]")
    forest, thr = fig.axes
    assert [t.get_text() for t in forest.get_yticklabels()] == ["b1", "b8", "b32", "b64", "b96"]
    assert [t.get_text() for t in forest.get_legend().get_texts()] == ["V1 (accept)", "V2 (reject)"]
    assert "REPLAY" in fig._suptitle.get_text() and "#3a" in fig._suptitle.get_text()
    # a +0.5% effect stays visible beside -40%: the axis is linear near zero (symlog), so +0.5% sits clearly
    # away from 0 on screen (at least 5% of the axis width)
    x0, x1 = forest.transData.transform([(0, 0), (0.5, 0)])[:, 0]
    width = forest.get_window_extent().width
    assert (x1 - x0) / width > 0.05
    assert forest.get_xscale() == "symlog" and len(forest.collections) >= 5  # one threshold band per level
    assert figure({"variants": data["variants"][2:]}, plan.adapter, levels) is None
