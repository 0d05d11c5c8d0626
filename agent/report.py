"""The close-out: Markdown with tables, the noise band, resources, state restored,
the recommendation and the ledger, plus a PNG plot of throughput by level."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from kinv.agent import planner, summary
from kinv.agent.enums import MEASURED_VERDICTS
from kinv.agent.ids import stamp
from kinv.agent.store import Store
from kinv.kernels.launch_config import describe, load_config


def _ordered(rows: list[dict], levels) -> list[tuple]:
    """(level, row) in the plan's level order, for rows keyed by level key."""
    by = {r["level"]: r for r in rows}
    return [(lv, by[lv.key]) for lv in levels if lv.key in by]


def collect(store: Store, ws: str, version: int | None = None) -> dict:
    """Everything the close-out shows, from the store: the experiments of one plan version when ``version`` is
    given (a new version's close-out never shows, relabels or counts an earlier version's work)."""
    exps = store.experiments(ws)
    if version is not None:
        exps = [e for e in exps if int(e.get("version") or 1) == int(version)]
    ids = {e["id"] for e in exps}
    noise = [n for n in store.noise(ws) if n["experiment"] in ids]
    ab = [e for e in exps if e["kind"] == "ab"]
    variants = []
    for e in ab:
        rows = store.verdicts(e["id"])
        variants.append({"exp": e, "verdicts": rows, "resources": json.loads(e["resources"] or "{}"),
                         "correctness": json.loads(e["correctness"] or "{}")})  # fmt: skip
    baseline = next((e for e in exps if e["kind"] == "baseline"), None)
    return {"experiments": exps, "noise": noise, "variants": variants, "baseline": baseline,
            "todos": store.todos(ws), "events": store.events(ws, limit=500)}  # fmt: skip


def roofline(store: Store, ws: str, adapter, levels, copy_gbps: float | None, matrix_tflops: float | None,
             version: int | None = None, l2_bytes: int | None = None) -> dict:
    """Where the measured baseline sits against the roofline that bounds this kernel at each level.

    At each level the floor is ``max(bytes / copy bandwidth, FLOPs / matrix peak)``; the larger term names
    the bound (memory or compute: the level's arithmetic intensity against the ridge point).  A fraction above
    100% of the bound, or a memory-bound level whose *timed* working set (all the input sets the workers rotated
    through, from their set-ups) fits in the L2 cache (then repeated calls need not reach device memory at all),
    is *implausible*: it is kept with the reason and never counted
    as headroom.  Returns ``{"levels": {key: {bound, intensity, fraction, implausible}}, "headroom": 1 - the
    best plausible fraction (None without one), "bound": text}``.
    """
    data = collect(store, ws, version)
    base_us: dict[str, float] = {}
    best: dict[str, tuple[float, str]] = {}  # the fastest measured config per level: a confirmed win, else baseline
    for v in data["variants"]:
        for row in v["verdicts"]:
            if row["base_us"]:
                base_us.setdefault(row["level"], row["base_us"])
            won = v["exp"]["verdict"] in ("accept", "mixed") and row["verdict"] == "improved"
            if won and row["variant_us"] and row["variant_us"] < best.get(row["level"], (math.inf, ""))[0]:
                best[row["level"]] = (row["variant_us"], v["exp"]["variant"])
    for k, us in base_us.items():
        best.setdefault(k, (us, "baseline"))
    # what the timing read: the input sets the workers rotated through per level (their set-ups report it)
    timed: dict[str, dict] = {}
    for v in data["variants"]:
        for k, t in (v["resources"].get("timed") or {}).items():
            if t and t.get("working_set"):
                timed.setdefault(k, t)
    out: dict = {"levels": {}, "headroom": None, "bound": "unknown"}
    ridge = matrix_tflops * 1e12 / (copy_gbps * 1e9) if copy_gbps and matrix_tflops else None
    for lv in levels:
        b, f = adapter.bytes_moved(lv), adapter.flops(lv)
        roof = adapter.roofline(lv, copy_gbps, matrix_tflops)
        if roof is None:
            continue
        floor, bound = roof
        us, who = best.get(lv.key, (None, None))
        fraction = floor / (us * 1e-6) if us else None
        odd = None
        if fraction is not None and fraction > 1.0:
            odd = ("above 100% of the roofline, which no kernel reaches: the bytes or FLOPs it is charged, or the "
                   "bound, are wrong for this level")  # fmt: skip
        elif bound == "memory" and (t := timed.get(lv.key)) and t["working_set"] <= (t.get("l2_bytes") or l2_bytes or 0):
            odd = (f"its timed working set ({t['working_set'] / 2**20:.1f} MiB) fits in L2 "
                   f"({(t.get('l2_bytes') or l2_bytes) / 2**20:.0f} MiB), so a fraction of device-memory bandwidth "
                   "says nothing there")  # fmt: skip
        out["levels"][lv.key] = {"label": lv.label, "bound": bound, "intensity": f / b if b else None,
                                 "fraction": fraction, "config": who, "implausible": odd}  # fmt: skip
    fr = [x["fraction"] for x in out["levels"].values() if x["fraction"] and not x["implausible"]]
    if fr:
        out["headroom"] = max(0.0, 1.0 - max(fr))
    out["implausible"] = [x["label"] for x in out["levels"].values() if x["implausible"]]
    bounds = {x["bound"] for x in out["levels"].values()}
    out["bound"] = ("copy bandwidth" if bounds == {"memory"} else "matrix peak" if bounds == {"compute"}
                    else "copy bandwidth or matrix peak, by level") if bounds else "unknown"  # fmt: skip
    out["ridge"] = ridge
    return out


def roofline_text(roof: dict) -> str:
    """The Roofline section's sentence: each level's bound and fraction, an implausible one flagged as such."""
    parts = []
    for x in roof["levels"].values():
        if x["implausible"]:
            got = f", {x['fraction']:.0%} of it" if x["fraction"] else ""
            parts.append(f"{x['label']} {x['bound']}-bound{got} flagged implausible ({x['implausible']})")
        elif x["fraction"]:
            parts.append(f"{x['label']} {x['bound']}-bound at {x['fraction']:.0%} of its bound ({x['config']})")
        else:
            parts.append(f"{x['label']} {x['bound']}-bound")
    ridge = f" (ridge point {roof['ridge']:.0f} FLOP/byte)" if roof.get("ridge") else ""
    return (f"Bound at each level by arithmetic intensity{ridge}: {'; '.join(parts)} (the fastest measured config "
            "at that level, a confirmed win or else the baseline, against max(bytes / copy bandwidth, FLOPs / "
            "matrix peak)).")  # fmt: skip


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

    measured = [(v, _ordered(v["verdicts"], levels)) for v in data["variants"]
                if (v["exp"]["verdict"] or "") in _MEASURED]  # fmt: skip
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


def _exp(x: float) -> float:
    import math

    return math.exp(x)


def results_conf(store: Store, data: dict) -> float | None:
    """The per-look confidence the workstream's intervals were computed at (one value per workstream)."""
    for v in data["variants"]:
        for r in v["verdicts"]:
            if r.get("conf"):
                return r["conf"]
    return None


_MEASURED = MEASURED_VERDICTS
"""Verdicts that come from timing; a void, failed or unmeasured variant's rows are not data."""


def _chg(log_ratio: float | None) -> str:
    """A paired log-ratio as the throughput change a person reads: variant / baseline - 1."""
    import math

    if log_ratio is None or not math.isfinite(log_ratio):
        return "—"
    return f"{math.expm1(log_ratio):+.2%}"


def _rules_lines(res: dict) -> list[str]:
    """What the sequential A/B checked beyond its rounds: the timed captures the judge passed, the ceilings it held
    the times to (and where they came from), and every rule it skipped, in words."""
    rules, ceil = (res or {}).get("rules") or {}, (res or {}).get("ceilings") or {}
    out = []
    if rules.get("verified"):
        arms = sorted({a for a, _lv, _why in rules["verified"]})
        out.append(f"Timed outputs checked by the judge (a process that never imported the variant): "
                   f"{len(rules['verified'])} captures of {', '.join(arms)}, each on new inputs in its own buffers, "
                   "every input set.")  # fmt: skip
    if ceil:
        peak = ceil.get("matrix_peak")
        yard = f", yardstick {ceil['yard_gbps']:,.0f} GB/s" if ceil.get("yard_gbps") else ""
        out.append(f"Ceilings: copy {ceil.get('copy_gbps') or 0:,.0f} GB/s{yard}, matrix peak "
                   f"{f'{peak:,.0f} TFLOP/s' if peak else 'unknown'} ({ceil.get('matrix_source', '')}; "
                   f"{ceil.get('source', '')}).")  # fmt: skip
    out += [f"Rule skipped: {r}." for r in rules.get("skipped") or []]
    return out + [""] if out else []


def _reason(verdict: str | None, reason: str | None) -> str:
    """The reason without the verdict word doubled in front of it ("void — void: ...")."""
    text = reason or ""
    if verdict and text.lower().startswith(verdict.lower() + ":"):
        text = text[len(verdict) + 1 :].strip()
    return text


def verdict_objects(plan, data: dict, levels) -> list[summary.VariantVerdict]:
    """Each of the plan's variants as the close-out's tables show it: its latest A/B of this version (the same
    rows its table prints), or why it has none (a person rejected it, it was moot, it failed before timing, it
    never ran).  The summary sentences are :func:`kinv.agent.summary.summarize` of these."""
    by_exp = {}
    for v in data["variants"]:
        by_exp[v["exp"]["variant"]] = v  # the latest experiment of each variant wins
    todos = {t["id"]: t for t in data["todos"]}
    out = []
    for var in plan.variants:
        changes = var.title
        v = by_exp.get(var.id)
        e = v["exp"] if v else {}
        todo = todos.get(planner.todo_id(plan.ws, var.id)) or {}
        reason = todo.get("reason") or e.get("reason") or ""
        if v and (e.get("verdict") or "") in _MEASURED and v["verdicts"]:
            rows = {r["level"]: r for r in v["verdicts"]}
            lvs = tuple(summary.LevelVerdict(lv.label, rows[lv.key]["verdict"], rows[lv.key]["effect"],
                                             rows[lv.key]["ci_low"], rows[lv.key]["ci_high"],
                                             rows[lv.key]["threshold"])
                        if lv.key in rows else summary.LevelVerdict(lv.label, "unmeasured") for lv in levels)  # fmt: skip
            out.append(summary.VariantVerdict(var.id, "measured", e["verdict"], lvs, changes=changes))
        elif reason.startswith("rejected by a person"):
            out.append(summary.VariantVerdict(var.id, "rejected", note=reason, changes=changes))
        elif reason.startswith("moot"):
            out.append(summary.VariantVerdict(var.id, "moot", note=reason, changes=changes))
        elif e.get("verdict") == "void" and (e.get("rounds") or e.get("gpu_s")):  # timed, then voided by a rule
            out.append(summary.VariantVerdict(var.id, "void", "void", note=_reason("void", e.get("reason")),
                                              changes=changes))  # fmt: skip
        elif e.get("verdict"):
            out.append(summary.VariantVerdict(var.id, "failed", e["verdict"], note=_reason(e["verdict"], e.get(
                "reason")), changes=changes))  # fmt: skip
        else:
            out.append(summary.VariantVerdict(var.id, "not run", note=reason if todo.get("status") == "cancelled"
                                              else "", changes=changes))  # fmt: skip
    return out


def summarize(store: Store, plan, data: dict, ctx) -> summary.Summary:
    """The close-out's sentences for this workstream: :func:`kinv.agent.summary.summarize` of its verdicts, with
    the live file as it is on disk."""

    try:
        live = describe(load_config(ctx.config_path, ctx.adapter.name))
    except Exception:  # noqa: BLE001 - an unreadable live file is named as such, the close-out still written
        live = "(unreadable)"
    parent = plan.workstream.parent
    campaign = parent if parent and store.campaign(parent) else None
    return summary.summarize(verdict_objects(plan, data, ctx.levels()), baseline=describe(plan.baseline), live=live,
                             live_file=Path(ctx.config_path).name, expect=plan.expect,
                             expect_levels=tuple(plan.expect_levels), incumbent_of=campaign)  # fmt: skip


def recordings_source(be, kernel: str) -> str:
    """Where a replay's recordings come from, in their own words: the GPU their headers name, or "synthetic"
    when their header says so (a test fixture, not a measurement)."""
    try:
        headers = be.for_kernel(kernel).headers
    except Exception:  # noqa: BLE001 - a backend without per-kernel recordings: its first header
        headers = getattr(getattr(be, "recording", None), "headers", []) or []
    if any(h.get("synthetic") for h in headers):
        return "synthetic recordings (not measurements)"
    gpus = sorted({str((h.get("fingerprint") or {}).get("gpu")) for h in headers if (h.get("fingerprint") or {}).get("gpu")})
    return f"{', '.join(gpus)} recordings" if gpus else "recordings that name no GPU"


def _l2_bytes(be, kernel: str) -> int | None:
    """The L2 size the samples were taken with: the recordings' fingerprint on replay, the visible GPU live."""
    try:
        if be.name == "replay":
            return int(be.for_kernel(kernel).headers[0]["fingerprint"].get("l2_bytes") or 0) or None
        import torch

        return int(torch.cuda.get_device_properties(0).L2_cache_size) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - unknown: no L2 check
        return None


def _predicted_table(pred: dict, label: dict | None = None) -> list[str]:
    """The predicted resource change per level, as a table (shared memory, CTAs and warps per SM, limiter)."""
    rows = [(lv, p) for lv, p in pred.items() if isinstance(p, dict)]
    if not rows:
        return []
    out = ["", "Predicted change vs baseline (analytical resource model: no compiler was asked):", "",
           "| level | shared memory / CTA | CTAs per SM | warps per SM | limited by | feasible |",
           "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip

    def pair(p, k, unit=""):
        a, b = p.get(f"{k}_base"), p.get(f"{k}_variant")
        return "—" if a is None and b is None else f"{a}{unit} → {b}{unit}"

    for lv, p in rows:
        smem = (f"{p['smem_base'] / 1024:.1f} → {p['smem_variant'] / 1024:.1f} KB"
                if p.get("smem_base") is not None and p.get("smem_variant") is not None else "—")  # fmt: skip
        out.append(f"| {(label or {}).get(lv, lv)} | {smem} | {pair(p, 'ctas_per_sm')} | "
                   f"{pair(p, 'warps_per_sm')} | {pair(p, 'limited_by')} | "
                   f"{'yes' if p.get('feasible_variant', True) else 'NO'} |")  # fmt: skip
    return out


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def render(store: Store, plan, state: dict, ctx) -> str:
    ws = plan.ws
    levels = ctx.levels()
    data = collect(store, ws, getattr(ctx, "version", None))
    wsrow = store.workstream(ws)
    bands = {n["level"]: n for n in data["noise"]}
    results = state.get("results", {})
    said = summarize(store, plan, data, ctx)
    titles = {v.id: v.title for v in plan.variants}
    out = [f"# Close-out {ws}: {plan.workstream.title}", ""]
    if plan.workstream.parent:
        out += [f"Part of {plan.workstream.parent} ({plan.workstream.parent_title or ''}).", ""]
    out += ["## Hypothesis", "", plan.hypothesis.strip(), ""]

    # ---- summary ------------------------------------------------------------------
    out += ["## Outcome", ""]
    out += [f"- **{vid}** ({titles[vid]}): {line}" for vid, line in said.outcome.items()]
    out += said.lines + [""]

    # ---- backend -------------------------------------------------------------------
    be = ctx.backend
    loud = (f"REPLAY backend: no GPU is measured; serving {recordings_source(be, plan.kernel)}"
            if be.name == "replay" else be.loud)  # fmt: skip
    out += ["## Where this was measured", "", f"- Backend: `{be.name}` — {loud}"]
    env = " ".join(f"{k}={v}" for k, v in plan.environment.items()) or "(none)"
    out += [f"- Environment expected and confirmed in every worker: {env}", ""]

    # ---- noise -------------------------------------------------------------------
    lost: dict[int, list[str]] = {}  # experiment -> its lost samples' lines (a command that failed, hung, printed none)
    for ev in store.events(ws, limit=100_000):
        if ev["kind"] == "sample.lost":
            lost.setdefault(json.loads(ev["data"] or "{}").get("experiment"), []).append(ev["message"])
    s = plan.stats
    out += ["## Noise (A/A of the baseline)", "",
            f"{s.aa_arms} baseline workers timed in every one of {s.aa_rounds} rounds; {be.each_sample}.", "",
            "| level | round band (95% of single rounds) | between-arm offset SD | widest A/A pair [95% CI] | "
            "outliers | threshold (plan) |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    label = {x.key: x.label for x in levels}
    for key, n in bands.items():
        th = n.get("threshold") or state.get("thresholds", {}).get(key)
        lv = label.get(key, key)
        out.append(f"| {lv} | ±{n['band']:.2%} | {(n.get('offset_sd') or 0):.2%} | {n['effect']:+.2%} "
                   f"[{n['ci_low']:+.2%}, {n['ci_high']:+.2%}] | {n.get('outliers') or 0} | "
                   f"{th:.1%} |" if th else f"| {lv} | ±{n['band']:.2%} | | | | |")  # fmt: skip
    warnings = [n["warning"] for n in bands.values() if n.get("warning")]
    out += ["", "The threshold at each level is the plan's, fixed before any data were seen; the A/A never "
            "widens it. The between-arm offset enters every A/B interval as a variance component."]  # fmt: skip
    out += [f"- Warning: {w}" for w in warnings] + [""]
    aa_lost = [m for e in data["experiments"] if e["kind"] == "noise" for m in lost.get(e["id"], [])]
    if aa_lost:
        out += [f"Lost A/A samples: {len(aa_lost)}, each dropped with its round at that level for every worker; the "
                f"last: {aa_lost[-1]}.", ""]  # fmt: skip
    look = results_conf(store, data)
    if look:
        out += [f"Decision rule: a level is improved when its interval excludes 0 and the estimate reaches the "
                f"threshold, regressed in the mirror case, equivalent when the interval lies inside ±threshold. "
                f"Intervals are shown at their per-look confidence ({look:.3%}): Bonferroni over "
                f"{len(levels)} levels × the looks × {len(plan.variants)} variants of this workstream, so "
                f"the chance of any wrong claim in the whole workstream is at most {(1 - s.conf) / 2:.1%}.", ""]

    # ---- per-variant tables -------------------------------------------------------
    latest = {v["exp"]["variant"]: v["exp"]["id"] for v in data["variants"]}
    for v in data["variants"]:
        e = v["exp"]
        verdict_line = (said.outcome[e["variant"]] if latest.get(e["variant"]) == e["id"] and e["variant"] in said.outcome
                        else f"**{e['verdict'] or e['status']}** — {_reason(e['verdict'] or e['status'], e['reason'])}")
        out += [f"## {e['variant']}: {titles.get(e['variant'], '')}", "", f"Verdict: {verdict_line}", ""]  # fmt: skip
        if e["variant"] in [x.id for x in plan.variants]:
            var = plan.variant(e["variant"])
            src = f" + source patch `{var.source_patch}`" if var.source_patch else ""
            envs = "".join(f", {k}={val} in its processes (the baseline's: {plan.environment.get(k, 'unset')})"
                           for k, val in var.env.items())  # fmt: skip
            out += [f"Config: `{describe(plan.variant_config(var))}`{src}{envs} against the baseline `{describe(plan.baseline)}`.", ""]
        if e["void_reason"]:
            out += [f"**Void:** {e['void_reason']}", ""]
        out += _rules_lines(v["resources"])
        if v["verdicts"] and (e["verdict"] or "") in _MEASURED:
            conf = v["verdicts"][0].get("conf")
            label = f"{conf:.3%} CI" if conf else "CI"
            unit = ctx.adapter.throughput_unit
            out += [f"| level | baseline {unit} | variant {unit} | throughput change [{label}] | threshold | verdict |",
                    "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
            us = (lambda x: f" ({x:.1f} µs)") if ctx.adapter.shows_time else (lambda x: "")
            for lv, r in _ordered(v["verdicts"], levels):
                out.append(f"| {lv.label} | {_num(ctx.adapter.throughput(lv, r['base_us']))}{us(r['base_us'])} | "
                           f"{_num(ctx.adapter.throughput(lv, r['variant_us']))}{us(r['variant_us'])} | "
                           f"{_chg(r['effect'])} [{_chg(r['ci_low'])}, {_chg(r['ci_high'])}] | {r['threshold']:.1%} | "
                           f"{r['verdict']} |")  # fmt: skip
            out += ["", f"Rounds: {e['rounds']} (ABBA-paired), {be.time_word} {e['gpu_s'] or 0:.2f} s.", ""]
        out += _also_lines(v["resources"].get("also"), v["verdicts"], levels)
        gone = lost.get(e["id"], [])
        if gone:
            out += [f"Lost samples: {len(gone)}, each dropped with its round at that level; the last: "
                    f"{gone[-1]}.", ""]  # fmt: skip
        res = v["resources"]
        if res and (ctx.adapter.resource_model or res.get("compiled")):
            out += _resource_lines(res, {x.key: x.label for x in levels}, replayed=be.name == "replay")
        out += _profile_lines(store.profiles(exp_id=e["id"]), {x.key: x.label for x in levels})
        corr = v["correctness"]
        if corr:
            lv_rows = corr.get("levels") or []
            ran = sum(1 for e in lv_rows if not e.get("same_as"))
            shared = (f"; {len(lv_rows)} levels in {ran} launches, levels with one stand-in and one set of parameters "
                      "sharing one") if ran < len(lv_rows) else ""  # fmt: skip
            if corr.get("what"):  # a backend's own check (a command: it ran and printed its metric)
                out += [f"Check before timing: {'passed' if corr.get('ok') else 'FAILED'} — {corr['what']}.", ""]
                continue
            out += [f"Correctness before timing: {'passed' if corr.get('ok') else 'FAILED'} on fresh random inputs "
                    f"({corr.get('device')}, {corr.get('dtype')}{shared}){': ' + corr.get('reason', '') if not corr.get('ok') else ''}.", ""]  # fmt: skip

    # ---- moot / cancelled -----------------------------------------------------------
    cancelled = [t for t in data["todos"] if t["status"] == "cancelled"]
    if cancelled:
        out += ["## Not run", ""] + [f"- {t['id']}: {t['reason']}" for t in cancelled] + [""]

    # ---- state restored -----------------------------------------------------------
    from kinv.agent.tools import configs

    now_sha = configs.sha(ctx.config_path)
    backups = [b for b in store.backups() if b["workstream"] == ws]
    ok = now_sha == wsrow["baseline_hash"]
    out += ["## State", "",
            f"- State restored: the config file's sha {'matches' if ok else 'DOES NOT MATCH'} the baseline's ({now_sha}), "
            + (f"backup kept at {backups[-1]['backup_path']}." if backups else "no backup was needed (no file was patched)."),
            f"- Open patches in the journal: {len(store.dangling_patches())}.", ""]  # fmt: skip

    # ---- recommendation -----------------------------------------------------------
    adapter = ctx.adapter
    from kinv.agent.tools.sequential import matrix_peak
    from kinv.kernels.devices import get_device

    ceil = be.ceilings()
    roof = roofline(store, ws, adapter, levels, ceil.get("copy_gbps"), matrix_peak(ceil, get_device(plan.device).matrix_tflops)[0],
                    version=getattr(ctx, "version", None), l2_bytes=_l2_bytes(be, plan.kernel))  # fmt: skip
    if roof["levels"]:
        out += ["## Roofline", "", roofline_text(roof), ""]
    winners = sorted({x["config"] for x in roof["levels"].values()
                      if x.get("config") not in (None, "baseline") and not x["implausible"]})  # fmt: skip
    never = [v.id for v in verdict_objects(plan, data, levels) if v.status in ("rejected", "not run")]
    ranked = planner.recommend(plan, results, roof["headroom"], roof["bound"], measured_by=", ".join(winners),
                               unmeasured=never, implausible=roof["implausible"])  # fmt: skip
    if ranked:
        top = ranked[0]
        out += ["## Recommendation", "", f"Next: **{top['id']} — {top['title']}**. {top['rationale']}", "",
                "| rank | candidate | score | evidence |", "| --- | --- | --- | --- |"]  # fmt: skip
        out += [f"| {i + 1} | {r['id']}: {r['title']} | {r['score']:.2f} | {r['evidence']} |" for i, r in enumerate(ranked)]
        out.append("")
        store.update_workstream(ws, recommendation=f"{top['id']}: {top['title']}")
    proposed = {t["id"].rsplit(".", 1)[-1].removesuffix("-cond"): t for t in data["todos"]
                if (t["reason"] or "").startswith("proposed:")}  # fmt: skip
    follow = [f"- {line}" + (f" ({proposed[vid]['content']})" if vid in proposed else "")
              for vid, line in zip(said.follow_up_ids, said.follow_ups)]  # fmt: skip
    if follow:
        out += ["Proposed follow-ups:"] + follow + [""]

    profs = store.profiles(ws)
    base_prof = next((p for p in profs if p["arm"] == "base"), None)
    if base_prof:  # what the profiler says bounds the baseline points the next step one way or the other
        from kinv.agent.tools.profile import bound_of, next_step

        f = base_prof["figures"]
        where = next((x.label for x in levels if x.key == base_prof["level"]), base_prof["level"])
        out += [f"Profiled baseline at {where}: {bound_of(f)}; "
                f"{next_step(f)}.", ""]

    # ---- ledger --------------------------------------------------------------------
    gpu = sum(e["gpu_s"] or 0 for e in data["experiments"])
    rounds = sum(e["rounds"] or 0 for e in data["experiments"])
    n_samples = sum(store.sample_count(e["id"]) for e in data["experiments"])
    n_lost = sum(len(x) for x in lost.values())
    out += ["## Ledger", "", f"- {be.time_word[0].upper() + be.time_word[1:]} in samples: {gpu:.2f} s "
            f"({'recorded' if be.name == 'replay' else 'measured'}); rounds: {rounds}; samples stored: {n_samples}"
            f"{f'; samples lost: {n_lost} (events sample.lost)' if n_lost else ''}; budget {plan.budget.gpu_seconds:.0f} s"
            f"{' — spent, close-out written anyway' if state.get('budget_exhausted') else ''}.",
            f"- Plan: `{ctx.plan_path}` (sha {ctx.plan_hash}); written {stamp(time.time())}.", ""]  # fmt: skip
    skipped = [e["message"] for e in store.events(ws) if e["kind"] == "profile.skipped"]
    if skipped and not profs:
        out.insert(-1, f"- Profile step: skipped — {skipped[-1]}.")
    if profs:
        live = sum(p["seconds"] or 0 for p in profs)
        how = "recorded, served by replay" if be.name == "replay" else f"{live:.1f} s of Nsight Compute on the GPU"
        out.insert(-1, f"- Profile step: {len(profs)} profiles ({how}).")
    places = store.places([e["id"] for e in data["experiments"] if e["kind"] != "screen"])
    screened_on = store.places([e["id"] for e in data["experiments"] if e["kind"] == "screen"])
    label = {lv.key: lv.label for lv in levels}
    if screened_on:
        out.insert(-1, f"- Screening spread its candidates over {', '.join(screened_on)} (each candidate paired with "
                       "an incumbent worker on its own GPU).")  # fmt: skip
    if places:  # a Ray backend: each level's pairs ran on one GPU; say which
        out.insert(-1, "- Measured on (each level's baseline and variant on one GPU; GPUs compared only through "
                       "their paired effects): " + "; ".join(f"{p}: {', '.join(label.get(k, k) for k in lvs)}"
                                                              for p, lvs in places.items())
                   + ".")  # fmt: skip
        gone_gpus = [e["message"] for e in store.events(ws) if e["kind"] == "executor-loss"]
        if gone_gpus:
            out.insert(-1, f"- Lost during the workstream: {'; '.join(gone_gpus)}.")
    return "\n".join(out)


def _also_lines(also: dict | None, verdicts: list[dict], levels) -> list[str]:
    """What a command printed besides its metric (``metric.also``), the mean of each arm's samples per level,
    beside the metric's own change: how much of a part's change reached the whole."""
    if not also or not (also.get("base") or also.get("variant")):
        return []
    base, var = also.get("base") or {}, also.get("variant") or {}
    keys = sorted({k for by in (*base.values(), *var.values()) for k in by})
    effect = {r["level"]: r["effect"] for r in verdicts}
    rows = ["Also printed by the command (mean of each arm's samples in this run; never decided on):", "",
            "| level | " + " | ".join(f"{k}: baseline → variant" for k in keys) + " | metric change |",
            "| --- | " + " | ".join("---" for _ in keys) + " | --- |"]  # fmt: skip
    for lv in levels:
        b, v = base.get(lv.key) or {}, var.get(lv.key) or {}
        if not b and not v:
            continue
        cells = []
        for k in keys:
            mb = sum(b[k]) / len(b[k]) if b.get(k) else None
            mv = sum(v[k]) / len(v[k]) if v.get(k) else None
            chg = f" ({mv / mb - 1:+.1%})" if mb and mv else ""
            cells.append(f"{_num(mb)} → {_num(mv)}{chg}")
        rows.append(f"| {lv.label} | " + " | ".join(cells) + f" | {_chg(effect.get(lv.key))} |")
    return rows + [""]


def _profile_lines(profs: list[dict], label: dict) -> list[str]:
    """A decided variant's profile, as the sentence that explains its verdict (figures of the baseline beside)."""
    from kinv.agent.tools.profile import explain

    by = {(p["arm"], p["level"]): p for p in profs}
    out = []
    for (arm, lv), p in by.items():
        base = by.get(("base", lv))
        if arm != "variant" or base is None:
            continue
        src = "recorded Nsight Compute profile" if p["source"] == "replay" else "Nsight Compute"
        out += [f"Why, by the profiler ({src}, {label.get(lv, lv)}, the level of the largest effect): "
                f"{explain(base['figures'], p['figures'])}.", ""]
    return out


def compiled_table(compiled: dict, label: dict | None = None, where: str = "as the GPU's compiler built them") -> list[str]:
    """Baseline -> variant compiled resources per level (registers, spills, shared memory, CTAs per SM and the
    limit that binds, waves), from the arms' set-ups or a compile-only run."""
    from kinv.agent.tools.resources import compiled_line

    rows = [(lv, c) for lv, c in (compiled or {}).items() if isinstance(c, dict) and (c.get("base") or c.get("variant"))]
    if not rows:
        return []
    out = ["", f"Compiled resources, baseline → variant ({where}):", "",
           "| level | registers / thread | spills | shared memory / CTA (KB) | CTAs per SM | limited by | waves |",
           "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    out += [compiled_line((label or {}).get(lv, lv), c.get("base"), c.get("variant")) for lv, c in rows]
    return out


def _resource_lines(res: dict, label: dict | None = None, replayed: bool = False) -> list[str]:
    """A variant's resources: the compiler's table where the arms reported it (the analytical model's CTAs/SM
    and waves, which cannot see registers, are then left out: only the launch shape it derives is kept), else
    the analytical model, labelled as such."""
    lines = []
    compiled = res.get("compiled") or {}
    per = res.get("levels") or res.get("per_level") or []
    pred = res.get("predicted") or {}
    if isinstance(per, dict):
        per = list(per.values())
    if per:
        first = per[0]
        r = first.get("resources", first)
        why = r.get("why", {})
        occ = r.get("occupancy", {})
        explained = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in why.items() if not (compiled and k == "waves"))
        if compiled and explained:
            lines.append(f"Launch shape at {first.get('label') or first.get('level')}: {explained}.")
        elif not compiled:
            lines.append(f"Resources (analytical model) at {first.get('label') or first.get('level')}: shared memory "
                         f"{r.get('smem_estimate', 0) / 1024:.1f} KB per CTA, {occ.get('ctas_per_sm', '?')} CTAs/SM by "
                         f"{occ.get('limited_by', '?')}" + (f"; {explained}" if explained else "") + ".")  # fmt: skip
    if compiled:
        lines += compiled_table(compiled, label, "recorded from the GPU's compiler with the samples" if replayed
                                else "as the GPU's compiler built them")  # fmt: skip
    elif pred:
        lines += _predicted_table(pred, label)
    return lines + [""] if lines else []


def write_closeout(store: Store, plan, state: dict, ctx, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir or store.dir / "reports")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = plan.ws.lstrip("#") + "-closeout"
    md = render(store, plan, state, ctx)
    be = ctx.backend
    mark = f"REPLAY of {recordings_source(be, plan.kernel)}" if be.name == "replay" else f"live, {be.name}"
    png = plot(collect(store, plan.ws, getattr(ctx, "version", None)), out_dir / f"{stem}.png", ctx.adapter, ctx.levels(),
               title=f"{plan.ws} {plan.workstream.title} [{mark}]", baseline=describe(plan.baseline))  # fmt: skip
    if png:
        md += f"\n![throughput by level]({png.name})\n"
    path = out_dir / f"{stem}.md"
    path.write_text(md)
    store.update_workstream(plan.ws, report_path=str(path), status="closed", closed=time.time())
    return path

