"""The close-out: Markdown with tables, the noise band, resources, state restored, the recommendation and the
ledger, plus a PNG plot of throughput by level.

It renders what it is handed (:class:`CloseoutData`, which :func:`kinv.agent.workstream.collect.collect` gathers once): it
reads no store and no file, asks no backend or planner, and measures nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kinv.agent import fmt
from kinv.agent.ids import stamp
from kinv.agent.report import summary
from kinv.agent.words import MEASURED_VERDICTS


@dataclass(frozen=True)
class BackendFacts:
    """Where the close-out's samples came from, in the words it prints."""

    name: str
    loud: str  # the backend's one-line banner (a replay names the recordings it served)
    time_word: str  # "GPU time" or what the backend's samples measure instead
    each_sample: str  # what one sample is, in words
    mark: str  # the figure's title tag: "REPLAY of ..." or "live, <backend>"


@dataclass
class CloseoutData:
    """Everything a close-out shows, as plain data: collected once by the close-out node."""

    plan: object  # the plan (kinv.agent.plan.Plan): hypothesis, variants, stats, budget
    levels: list  # the plan's levels in order (kinv.kernels.adapter.Level)
    adapter: object  # the kernel's adapter: its throughput unit and the time -> throughput conversion
    data: dict  # experiments, noise, variants (with their verdict rows, resources, correctness), todos, events
    verdicts: list[summary.VariantVerdict]  # each plan variant as its latest A/B decided it (or why it has none)
    baseline: str  # the baseline config, described
    variant_configs: dict[str, str]  # variant id -> its config, described
    live: str  # the live config file as it is on disk, described
    live_file: str
    incumbent_of: str | None  # the campaign whose incumbent the baseline is, if any
    backend: BackendFacts
    lost: dict  # experiment id -> its lost samples' lines
    thresholds: dict[str, float]
    budget_exhausted: bool
    config_sha: str  # the config file's sha now
    baseline_hash: str | None  # the config file's sha when the workstream started
    backup_path: str | None
    open_patches: int
    roof: dict  # the roofline at each level (kinv.agent.workstream.collect.roofline)
    ranked: list[dict]  # the planner's ranking of what to try next, best first
    profiles: dict[int, list[dict]]  # experiment id -> its stored profiles
    ws_profiles: list[dict]  # every profile of the workstream
    profile_skipped: str | None  # why the profile step was skipped, if it was
    samples: int  # samples stored
    places: dict  # GPU -> the levels measured on it (a Ray backend)
    screened_on: dict  # GPUs the screening spread its candidates over
    gpus_lost: list[str] = field(default_factory=list)
    premises: dict = field(default_factory=dict)  # variant id -> its premise (kinv.agent.tools.runners.premise.PremiseCheck)
    plan_path: str = ""
    plan_hash: str = ""
    written: float = 0.0  # when the close-out was written (epoch seconds)


def _ordered(rows: list[dict], levels) -> list[tuple]:
    """(level, row) in the plan's level order, for rows keyed by level key."""
    by = {r["level"]: r for r in rows}
    return [(lv, by[lv.key]) for lv in levels if lv.key in by]


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


_MEASURED = MEASURED_VERDICTS
"""Verdicts that come from timing; a void, failed or unmeasured variant's rows are not data."""


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


def _reach_lines(events: list[dict], var) -> list[str]:
    """What the plan allowed ``var``'s source patch that reaches for the harness: each construct its gate found
    and let through (events ``reach.allowed``), once each; or the plan's opt-in where no gate ran."""
    import json

    found = list(dict.fromkeys(e["message"] for e in events if e["kind"] == "reach.allowed"
                               and json.loads(e.get("data") or "{}").get("variant") == var.id))  # fmt: skip
    if not var.allow_harness_reach:
        return []
    said = ", ".join(f"`{c}`" for c in var.allow_harness_reach)
    head = f"Allowed to reach for the harness by the plan (allow_harness_reach: {said}); the static screen let through:"
    return ([head] + [f"- {line}" for line in found] + [""]) if found else \
        [f"Allowed to reach for the harness by the plan (allow_harness_reach: {said}); no gate of this run found one.", ""]


def reason_text(verdict: str | None, reason: str | None) -> str:
    """The reason without the verdict word doubled in front of it ("void — void: ...")."""
    text = reason or ""
    if verdict and text.lower().startswith(verdict.lower() + ":"):
        text = text[len(verdict) + 1 :].strip()
    return text


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


def render(cd: CloseoutData) -> str:
    """The close-out's Markdown, from what the close-out node collected (no figure: :func:`plot` draws it)."""
    plan, levels, data, be = cd.plan, cd.levels, cd.data, cd.backend
    ws = plan.ws
    bands = {n["level"]: n for n in data["noise"]}
    said = summary.summarize(cd.verdicts, baseline=cd.baseline, live=cd.live, live_file=cd.live_file, expect=plan.expect,
                             expect_levels=tuple(plan.expect_levels), incumbent_of=cd.incumbent_of)  # fmt: skip
    titles = {v.id: v.title for v in plan.variants}
    out = [f"# Close-out {ws}: {plan.workstream.title}", ""]
    if plan.workstream.parent:
        out += [f"Part of {plan.workstream.parent} ({plan.workstream.parent_title or ''}).", ""]
    out += ["## Hypothesis", "", plan.hypothesis.strip(), ""]

    # ---- summary ------------------------------------------------------------------
    out += ["## Outcome", ""]
    for vid, line in said.outcome.items():
        out.append(f"- **{vid}** ({titles[vid]}): {line}")
        if vid in cd.premises:
            out.append(f"  - {cd.premises[vid].line()}")
        if vid in said.predictions:
            out.append(f"  - {said.predictions[vid]}")
    out += said.lines + [""]

    # ---- backend -------------------------------------------------------------------
    out += ["## Where this was measured", "", f"- Backend: `{be.name}` — {be.loud}"]
    env = fmt.kv(plan.environment) or "(none)"
    out += [f"- Environment expected and confirmed in every worker: {env}"]
    if plan.kernel == "command":  # the command line each arm ran (at the first level; the others differ by level)
        adapter, lv = plan.adapter, plan.levels()[0]
        arms = [("baseline", plan.environment)] + [(v.id, plan.variant_env(v)) for v in plan.variants]
        out += [f"- Command line of each arm at {lv.key}:"]
        out += [f"  - {name}: `{' '.join(adapter.argv(lv, env=e, placeholder_port=True))}`" for name, e in arms]
    out += [""]

    # ---- noise -------------------------------------------------------------------
    lost = cd.lost
    s = plan.stats
    out += ["## Noise (A/A of the baseline)", "",
            f"{s.aa_arms} baseline workers timed in every one of {s.aa_rounds} rounds; {be.each_sample}.", "",
            "| level | round band (95% of single rounds) | between-arm offset SD | widest A/A pair [95% CI] | "
            "outliers | threshold (plan) |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    label = {x.key: x.label for x in levels}
    for key, n in bands.items():
        th = n.get("threshold") or cd.thresholds.get(key)
        lv = label.get(key, key)
        out.append(f"| {lv} | ±{n['band']:.2%} | {(n.get('offset_sd') or 0):.2%} | {fmt.signed(n['effect'])} "
                   f"{fmt.interval(n['ci_low'], n['ci_high'])} | {n.get('outliers') or 0} | "
                   f"{th:.1%} |" if th else f"| {lv} | ±{n['band']:.2%} | | | | |")  # fmt: skip
    warnings = [n["warning"] for n in bands.values() if n.get("warning")]
    out += ["", "The threshold at each level is the plan's, fixed before any data were seen; the A/A never "
            "widens it. The between-arm offset enters every A/B interval as a variance component."]  # fmt: skip
    out += [f"- Warning: {w}" for w in warnings] + [""]
    aa_lost = [m for e in data["experiments"] if e["kind"] == "noise" for m in lost.get(e["id"], [])]
    if aa_lost:
        out += [f"Lost A/A samples: {len(aa_lost)}, each dropped with its round at that level for every worker; the "
                f"last: {aa_lost[-1]}.", ""]  # fmt: skip
    look = next((r["conf"] for v in data["variants"] for r in v["verdicts"] if r.get("conf")), None)
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
                        else f"**{e['verdict'] or e['status']}** — {reason_text(e['verdict'] or e['status'], e['reason'])}")
        out += [f"## {e['variant']}: {titles.get(e['variant'], '')}", "", f"Verdict: {verdict_line}", ""]  # fmt: skip
        if e["variant"] in [x.id for x in plan.variants]:
            var = plan.variant(e["variant"])
            src = f" + source patch `{var.source_patch}`" if var.source_patch else ""
            envs = "".join(f", {k}={val} in its processes (the baseline's: {plan.environment.get(k, 'unset')})"
                           for k, val in var.env.items())  # fmt: skip
            out += [f"Config: `{cd.variant_configs[var.id]}`{src}{envs} against the baseline `{cd.baseline}`.", ""]
            out += _reach_lines(data.get("events") or [], var)
        if e["void_reason"]:
            out += [f"**Void:** {e['void_reason']}", ""]
        out += _rules_lines(v["resources"])
        if v["verdicts"] and (e["verdict"] or "") in _MEASURED:
            conf = v["verdicts"][0].get("conf")
            label = f"{conf:.3%} CI" if conf else "CI"
            unit = cd.adapter.throughput_unit
            out += [f"| level | baseline {unit} | variant {unit} | throughput change [{label}] | threshold | verdict |",
                    "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
            us = (lambda x: f" ({x:.1f} µs)") if cd.adapter.shows_time else (lambda x: "")
            for lv, r in _ordered(v["verdicts"], levels):
                out.append(f"| {lv.label} | {_num(cd.adapter.throughput(lv, r['base_us']))}{us(r['base_us'])} | "
                           f"{_num(cd.adapter.throughput(lv, r['variant_us']))}{us(r['variant_us'])} | "
                           f"{fmt.change(r['effect'])} {fmt.change_interval(r['ci_low'], r['ci_high'])} | {r['threshold']:.1%} | "
                           f"{r['verdict']} |")  # fmt: skip
            out += ["", f"Rounds: {e['rounds']} (ABBA-paired), {be.time_word} {e['gpu_s'] or 0:.2f} s.", ""]
        out += _also_lines(v["resources"].get("also"), v["verdicts"], levels)
        gone = lost.get(e["id"], [])
        if gone:
            out += [f"Lost samples: {len(gone)}, each dropped with its round at that level; the last: "
                    f"{gone[-1]}.", ""]  # fmt: skip
        res = v["resources"]
        if res and (cd.adapter.resource_model or res.get("compiled")):
            out += _resource_lines(res, {x.key: x.label for x in levels}, replayed=be.name == "replay")
        out += _profile_lines(cd.profiles.get(e["id"], []), {x.key: x.label for x in levels})
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
    now_sha = cd.config_sha
    ok = now_sha == cd.baseline_hash
    out += ["## State", "",
            f"- State restored: the config file's sha {'matches' if ok else 'DOES NOT MATCH'} the baseline's ({now_sha}), "
            + (f"backup kept at {cd.backup_path}." if cd.backup_path else "no backup was needed (no file was patched)."),
            f"- Open patches in the journal: {cd.open_patches}.", ""]  # fmt: skip

    # ---- recommendation -----------------------------------------------------------
    roof = cd.roof
    if roof["levels"]:
        out += ["## Roofline", "", roofline_text(roof), ""]
    ranked = cd.ranked
    if ranked:
        top = ranked[0]
        out += ["## Recommendation", "", f"Next: **{top['id']} — {top['title']}**. {top['rationale']}", "",
                "| rank | candidate | score | evidence |", "| --- | --- | --- | --- |"]  # fmt: skip
        out += [f"| {i + 1} | {r['id']}: {r['title']} | {r['score']:.2f} | {r['evidence']} |" for i, r in enumerate(ranked)]
        out.append("")
        out += [f"To test {r['id']}'s premise, which no variant here moved: {r['proposal']}." for r in ranked
                if r.get("proposal")]
        if any(r.get("proposal") for r in ranked):
            out.append("")
    proposed = {t["id"].rsplit(".", 1)[-1].removesuffix("-cond"): t for t in data["todos"]
                if (t["reason"] or "").startswith("proposed:")}  # fmt: skip
    follow = [f"- {line}" + (f" ({proposed[vid]['content']})" if vid in proposed else "")
              for vid, line in zip(said.follow_up_ids, said.follow_ups)]  # fmt: skip
    if follow:
        out += ["Proposed follow-ups:"] + follow + [""]

    profs = cd.ws_profiles
    base_prof = next((p for p in profs if p["arm"] == "base"), None)
    if base_prof:  # what the profiler says bounds the baseline points the next step one way or the other
        f = base_prof["figures"]
        where = next((x.label for x in levels if x.key == base_prof["level"]), base_prof["level"])
        out += [f"Profiled baseline at {where}: {bound_of(f)}; "
                f"{next_step(f)}.", ""]

    # ---- ledger --------------------------------------------------------------------
    gpu = sum(e["gpu_s"] or 0 for e in data["experiments"])
    rounds = sum(e["rounds"] or 0 for e in data["experiments"])
    n_samples = cd.samples
    n_lost = sum(len(x) for x in lost.values())
    out += ["## Ledger", "", f"- {be.time_word[0].upper() + be.time_word[1:]} in samples: {gpu:.2f} s "
            f"({'recorded' if be.name == 'replay' else 'measured'}); rounds: {rounds}; samples stored: {n_samples}"
            f"{f'; samples lost: {n_lost} (events sample.lost)' if n_lost else ''}; budget {plan.budget.gpu_seconds:.0f} s"
            f"{' — spent, close-out written anyway' if cd.budget_exhausted else ''}.",
            f"- Plan: `{cd.plan_path}` (sha {cd.plan_hash}); written {stamp(cd.written)}.", ""]  # fmt: skip
    if cd.profile_skipped and not profs:
        out.insert(-1, f"- Profile step: skipped — {cd.profile_skipped}.")
    if profs:
        live = sum(p["seconds"] or 0 for p in profs)
        how = "recorded, served by replay" if be.name == "replay" else f"{live:.1f} s of Nsight Compute on the GPU"
        out.insert(-1, f"- Profile step: {len(profs)} profiles ({how}).")
    places, screened_on = cd.places, cd.screened_on
    label = {lv.key: lv.label for lv in levels}
    if screened_on:
        out.insert(-1, f"- Screening spread its candidates over {', '.join(screened_on)} (each candidate paired with "
                       "an incumbent worker on its own GPU).")  # fmt: skip
    if places:  # a Ray backend: each level's pairs ran on one GPU; say which
        out.insert(-1, "- Measured on (each level's baseline and variant on one GPU; GPUs compared only through "
                       "their paired effects): " + "; ".join(f"{p}: {', '.join(label.get(k, k) for k in lvs)}"
                                                              for p, lvs in places.items())
                   + ".")  # fmt: skip
        if cd.gpus_lost:
            out.insert(-1, f"- Lost during the workstream: {'; '.join(cd.gpus_lost)}.")
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
            chg = f" ({fmt.signed(mv / mb - 1, 1)})" if mb and mv else ""
            cells.append(f"{_num(mb)} → {_num(mv)}{chg}")
        rows.append(f"| {lv.label} | " + " | ".join(cells) + f" | {fmt.change(effect.get(lv.key))} |")
    return rows + [""]


# ---- the profiler's figures and the compiler's, in words ------------------------------------------------
def explain(base: dict, var: dict) -> str:
    """One sentence of why a variant's time moved, from its profile and the baseline's at one level."""
    def f(x, key, fmt="{:g}"):
        return fmt.format(x[key]) if x.get(key) is not None else "?"

    parts = [f"{f(var, 'registers', '{:.0f}')} registers/thread (baseline {f(base, 'registers', '{:.0f}')}) → "
             f"{f(var, 'ctas_per_sm', '{}')} CTAs/SM, limited by {var.get('limited_by', '?')} (baseline "
             f"{f(base, 'ctas_per_sm', '{}')}, {base.get('limited_by', '?')})",
             f"{f(var, 'waves', '{:.2f}')} waves per SM (baseline {f(base, 'waves', '{:.2f}')})",
             f"DRAM throughput {f(var, 'dram_pct', '{:.0f}')}% of peak (baseline {f(base, 'dram_pct', '{:.0f}')}%)",
             f"achieved occupancy {f(var, 'achieved_occupancy_pct', '{:.0f}')}% (baseline "
             f"{f(base, 'achieved_occupancy_pct', '{:.0f}')}%)"]  # fmt: skip
    if var.get("top_stalls"):
        parts.append("top stall " + ", ".join(f"{k} ({v:g} warps/issue)" for k, v in var["top_stalls"][:2]))
    return "; ".join(parts)


def bound_of(p: dict) -> str:
    """What a profile says limits the kernel: bandwidth-bound near the DRAM peak, a tail of a partial wave, or
    latency-bound (neither memory nor issue slots busy)."""
    dram, waves = p.get("dram_pct") or 0.0, p.get("waves")
    tail = ""
    if waves is not None and waves <= 1.05:
        tail = f" and limited by one wave ({waves:.2f} waves per SM: the GPU is not filled twice)"
    elif waves is not None and waves % 1 and waves % 1 < 0.5:
        tail = f", with a partial last wave ({waves:.2f} waves per SM)"
    if dram >= 60:
        return f"bandwidth-bound at {dram:.0f}% of DRAM peak{tail}"
    return f"latency-bound at {dram:.0f}% of DRAM peak (issue {p.get('issued_per_cycle', 0):.2f}/cycle){tail}"


def next_step(p: dict) -> str:
    """What a baseline's profile points to: fewer bytes where it is bandwidth-bound; more work in flight (more CTAs
    per SM, fewer registers, a fuller wave) where it is latency-bound."""
    if (p.get("dram_pct") or 0) >= 60:
        return "what it moves limits it: fewer bytes (a compressed KV, fused reads) pays, more parallelism does not"
    if p.get("waves") is not None and p["waves"] <= 1.05:
        return (f"it runs one wave at {p.get('ctas_per_sm', '?')} CTAs/SM (limited by {p.get('limited_by', '?')}): "
                "more memory in flight per SM (fewer registers per thread, deeper pipelining) is where time is, not "
                "more CTAs that would need a second wave")  # fmt: skip
    return "neither memory nor issue slots are busy: more independent work per SM (occupancy, pipelining)"


def compiled_line(level_label: str, base: dict | None, var: dict | None) -> str:
    """One level of the compiled table: ``base -> variant`` for each figure."""
    def pair(key, fmt=str):
        b = fmt(base[key]) if base and base.get(key) is not None else "?"
        v = fmt(var[key]) if var and var.get(key) is not None else "?"
        return b if b == v else f"{b} → {v}"

    return (f"| {level_label} | {pair('registers')} | {pair('spills')} | {pair('smem', lambda x: f'{x / 1024:.1f}')} | "
            f"{pair('ctas_per_sm')} | {pair('limited_by')} | {pair('waves')} |")


def _profile_lines(profs: list[dict], label: dict) -> list[str]:
    """A decided variant's profile, as the sentence that explains its verdict (figures of the baseline beside)."""
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


