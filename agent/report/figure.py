"""The close-out's figure: a forest plot of each measured variant's throughput change per level beside
throughput by level, drawn from the data the close-out node collected (it reads and measures nothing)."""

from __future__ import annotations

import math
from pathlib import Path

from kinv.agent.report.closeout import in_level_order
from kinv.agent.words import MEASURED_VERDICTS


def prefetch_plotting() -> None:
    """Import matplotlib in a background thread now, so that the close-out's figure does not wait for it at the
    end of a run (its import, and its font cache on a fresh machine, take seconds).  Called while a run waits on
    something else (a correctness check); a later import of it simply finds it loaded, or waits for it."""
    import threading

    def load():
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except Exception:  # noqa: BLE001 - the close-out's own import reports any real problem
            pass

    threading.Thread(target=load, name="kinv-prefetch-matplotlib", daemon=True).start()


def plot(data: dict, path: Path, adapter, levels, title: str = "", baseline: str = "") -> Path | None:
    """Write :func:`figure` to ``path`` (PNG); None when no variant was measured."""
    import matplotlib.pyplot as plt

    fig = figure(data, adapter, levels, title, baseline)
    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure(data: dict, adapter, levels, title: str = "", baseline: str = ""):
    """The close-out's figure: a forest plot of every measured variant's throughput change per level with its
    interval against the plan's threshold band (left), beside throughput by level (right, its legend naming the
    ``baseline`` config).  The change axis is linear within a few thresholds and logarithmic beyond, so a 1%
    effect stays visible beside a 50% one; its limits and ticks (:func:`change_axis`) cover every point.
    Variants never measured (voided, failed, rejected by a person) are not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [(v, in_level_order(v["verdicts"], levels)) for v in data["variants"]
                if (v["exp"]["verdict"] or "") in MEASURED_VERDICTS]  # fmt: skip
    measured = [(v, rows) for v, rows in measured if rows]
    if not measured:
        return None
    shown = [lv for lv in levels if any(lv.key == r[0].key for _, rows in measured for r in rows)]
    pos = {lv.key: i for i, lv in enumerate(shown)}
    fig, (fx, tx) = plt.subplots(1, 2, figsize=(11, 1.6 + 0.55 * len(shown) * max(1, len(measured)) ** 0.5),
                                 gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    # ---- forest: change and interval per level and variant, against the threshold band ----
    k = len(measured)
    thr_max = 0.0
    for i, lv in enumerate(shown):
        thr = next((r["threshold"] for _, rows in measured for lv2, r in rows if lv2.key == lv.key and r["threshold"]),
                   0.01)  # fmt: skip
        thr_max = max(thr_max, thr)
        fx.fill_betweenx([i - 0.45, i + 0.45], -100 * thr, 100 * thr, color="0.88", lw=0)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, (v, rows) in enumerate(measured):
        off = (j - (k - 1) / 2) * (0.7 / max(k, 1))
        ys = [pos[lv.key] + off for lv, _ in rows]
        xs = [100 * _exp_m1(r["effect"]) for _, r in rows]
        lo = [100 * _exp_m1(r["ci_low"]) for _, r in rows]
        hi = [100 * _exp_m1(r["ci_high"]) for _, r in rows]
        c = colors[j % len(colors)]
        fx.errorbar(xs, ys, xerr=[[x - a for x, a in zip(xs, lo)], [b - x for x, b in zip(xs, hi)]], fmt="o",
                    color=c, capsize=3, ms=4, label=f"{v['exp']['variant']} ({v['exp']['verdict']})")  # fmt: skip
    fx.axvline(0, color="k", lw=0.8)
    lin = max(2.0, 300 * thr_max)
    fx.set_xscale("symlog", linthresh=lin)
    every = [100 * _exp_m1(r[k]) for _, rows in measured for _, r in rows for k in ("effect", "ci_low", "ci_high")
             if r.get(k) is not None and math.isfinite(r[k])]  # fmt: skip
    (lo_x, hi_x), ticks = change_axis(every + [-100 * thr_max, 100 * thr_max], lin)
    fx.set_xlim(lo_x, hi_x)
    fx.set_xticks(ticks, [f"{t:+g}%" if t else "0" for t in ticks])
    fx.minorticks_off()
    fx.set_yticks(range(len(shown)), [lv.label for lv in shown])
    fx.set_ylim(len(shown) - 0.5, -0.5)
    conf = next((r.get("conf") for v, _ in measured for r in v["verdicts"] if r.get("conf")), None)
    fx.set_xlabel(f"throughput change, % ({conf:.3%} interval; grey: ±threshold)" if conf else "throughput change, %")
    fx.grid(axis="x", alpha=0.3)
    fx.legend(fontsize=7, loc="best")
    # ---- throughput by level ----
    unit = adapter.throughput_unit
    _, rows0 = measured[0]
    xs = [pos[lv.key] for lv, _ in rows0]
    tx.plot([adapter.throughput(lv, r["base_us"]) for lv, r in rows0], xs, "k-o", ms=4,
            label=f"baseline {baseline}" if baseline else "baseline")
    for j, (v, rows) in enumerate(measured):
        tx.plot([adapter.throughput(lv, r["variant_us"]) for lv, r in rows], [pos[lv.key] for lv, _ in rows], "s--",
                color=colors[j % len(colors)], ms=4, label=v["exp"]["variant"])  # fmt: skip
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    tx.xaxis.set_major_locator(MaxNLocator(5))
    tx.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x >= 1000 else f"{x:g}"))
    tx.set_yticks(range(len(shown)), [lv.label for lv in shown])
    tx.set_ylim(len(shown) - 0.5, -0.5)
    tx.set_xlabel(f"throughput ({unit})")
    tx.grid(alpha=0.3)
    tx.legend(fontsize=7, loc="best")
    fig.suptitle(title or f"{adapter.name}: throughput change by level", fontsize=10)
    fig.tight_layout()
    return fig


LADDER = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
"""The change axis's tick values (percent): labelled steps of 1-2-5 per decade."""


def change_axis(values: list[float], lin: float) -> tuple[tuple[float, float], list[float]]:
    """Limits and ticks (percent) for the forest plot's symlog change axis: every value lies inside the limits,
    with a labelled tick at or beyond the most extreme value on each side, and the decades' 1-2-5 steps between
    (±10, ±20, ±50 ... wherever they fall inside), so no point sits beyond the last tick or off the axis."""
    lo = min([0.0, *values])
    hi = max([0.0, *values])

    def outer(x: float) -> float:
        return next((t for t in LADDER if t >= x), LADDER[-1]) if x > 0 else 0.0

    left, right = -outer(-lo), outer(hi)
    left, right = min(left, -1.0), max(right, 1.0)  # the zero line is never at an edge
    ticks = [0.0] + [s * t for t in LADDER for s in (-1, 1) if (-t >= left if s < 0 else t <= right)]
    pad = 0.12  # in the symlog's own units, so the outer ticks and points sit inside the frame

    def expand(x: float) -> float:  # move x outwards by ``pad`` decades of the symlog transform
        if abs(x) <= lin:
            return x + math.copysign(pad * lin, x)
        return math.copysign(abs(x) * 10**pad, x)

    return (expand(left), expand(right)), sorted(set(ticks))


def _exp_m1(x: float) -> float:
    return math.expm1(x)
