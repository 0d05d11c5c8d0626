"""The close-out figure: a forest plot of the change per level against the threshold band, beside throughput."""

from __future__ import annotations

import math
from pathlib import Path

from kinv.agent.plan_file import load_plan
from kinv.agent.report.figure import figure

ROOT = Path(__file__).resolve().parents[3]


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


def test_the_change_axis_ticks_cover_every_point_and_the_throughput_legend_names_the_baseline():
    """Effects of -31% to -41% and +72% all lie inside the axis, with a labelled tick at or beyond each extreme
    (none piled up past the last tick, none clipped); the throughput panel's legend names the baseline."""
    plan, _ = load_plan(ROOT / "plans" / "3a-attention-occupancy.yaml")
    levels = plan.levels()
    changes = [-0.31, -0.35, -0.38, -0.41, 0.72]
    rows = [r for lv, c in zip(levels, changes) for r in _rows([lv], c, 0.01)]
    data = {"variants": [{"exp": {"variant": "V1", "verdict": "mixed"}, "verdicts": rows}]}
    fig = figure(data, plan.adapter, levels, baseline="BT16/BH16/w4/s2")
    forest, thr = fig.axes
    fig.canvas.draw()
    lo, hi = forest.get_xlim()
    points = [100 * math.expm1(r[k]) for r in rows for k in ("effect", "ci_low", "ci_high")]
    assert lo < min(points) and max(points) < hi, (lo, hi, points)
    ticks = [t for t in forest.get_xticks() if lo <= t <= hi]
    assert min(ticks) <= min(points) and max(ticks) >= max(points), ticks
    assert -50 in ticks and 100 in ticks and -20 in ticks and 10 in ticks, ticks
    labels = {t.get_text() for t in forest.get_xticklabels()}
    assert {"-50%", "+100%", "0"} <= labels, labels
    legend = thr.get_legend()
    assert legend is not None and "baseline BT16/BH16/w4/s2" in [t.get_text() for t in legend.get_texts()]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plotting_loaded_ahead_of_the_close_out_is_the_headless_backend():
    """A run loads matplotlib in the background while its baseline is checked; the close-out's figure then draws
    with the file backend (Agg), never a display's, even with a DISPLAY set."""
    import os
    import subprocess
    import sys

    code = ("import threading, sys\nfrom kinv.agent.report.figure import prefetch_plotting\nprefetch_plotting()\n"
            "[t.join() for t in threading.enumerate() if t.name == 'kinv-prefetch-matplotlib']\n"
            "import matplotlib\nprint('matplotlib.pyplot' in sys.modules, matplotlib.get_backend().lower())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DISPLAY": ":0", "MPLBACKEND": ""}).stdout.split()  # fmt: skip
    assert out == ["True", "agg"]
