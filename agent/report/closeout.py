"""The close-out: Markdown with tables, the noise band, resources, state restored, the recommendation and the
ledger, one function per section (its PNG figure: :mod:`kinv.agent.report.figure`).

It renders what it is handed (:class:`CloseoutData`, which :func:`kinv.agent.workstream.collect.collect` gathers once): it
reads no store and no file, asks no backend or planner, and measures nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from kinv.agent import fmt
from kinv.agent.ids import stamp
from kinv.agent.report import summary
from kinv.agent.report.resources import _profile_lines, _resource_lines, bound_of, next_step
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


def in_level_order(rows: list[dict], levels) -> list[tuple]:
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


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def render(cd: CloseoutData) -> str:
    """The close-out's Markdown, from what the close-out node collected (no figure: :func:`kinv.agent.report.figure.plot`
    draws it): its sections in order, each rendered by its own function."""
    plan = cd.plan
    said = summary.summarize(cd.verdicts, baseline=cd.baseline, live=cd.live, live_file=cd.live_file, expect=plan.expect,
                             expect_levels=tuple(plan.expect_levels), incumbent_of=cd.incumbent_of)  # fmt: skip
    titles = {v.id: v.title for v in plan.variants}
    out = _head_lines(plan) + _outcome_lines(cd, said, titles) + _where_lines(cd) + _noise_lines(cd)
    latest = {v["exp"]["variant"]: v["exp"]["id"] for v in cd.data["variants"]}
    for v in cd.data["variants"]:
        out += _variant_lines(cd, v, said, titles, latest)
    out += _not_run_lines(cd) + _state_lines(cd) + _recommendation_lines(cd, said) + _ledger_lines(cd)
    return "\n".join(out)


def _head_lines(plan) -> list[str]:
    """The title, the parent workstream and the hypothesis."""
    out = [f"# Close-out {plan.ws}: {plan.workstream.title}", ""]
    if plan.workstream.parent:
        out += [f"Part of {plan.workstream.parent} ({plan.workstream.parent_title or ''}).", ""]
    return out + ["## Hypothesis", "", plan.hypothesis.strip(), ""]


def _outcome_lines(cd: CloseoutData, said, titles: dict) -> list[str]:
    """The Outcome section: each variant's verdict in a sentence, its premise and its prediction."""
    out = ["## Outcome", ""]
    for vid, line in said.outcome.items():
        out.append(f"- **{vid}** ({titles[vid]}): {line}")
        if vid in cd.premises:
            out.append(f"  - {cd.premises[vid].line()}")
        if vid in said.predictions:
            out.append(f"  - {said.predictions[vid]}")
    return out + said.lines + [""]


def _where_lines(cd: CloseoutData) -> list[str]:
    """Where this was measured: the backend, the environment, and a command plan's command line per arm."""
    plan, be = cd.plan, cd.backend
    out = ["## Where this was measured", "", f"- Backend: `{be.name}` — {be.loud}"]
    env = fmt.kv(plan.environment) or "(none)"
    out += [f"- Environment expected and confirmed in every worker: {env}"]
    if plan.kernel == "command":  # the command line each arm ran (at the first level; the others differ by level)
        adapter, lv = plan.adapter, plan.levels()[0]
        arms = [("baseline", plan.environment)] + [(v.id, plan.variant_env(v)) for v in plan.variants]
        out += [f"- Command line of each arm at {lv.key}:"]
        out += [f"  - {name}: `{' '.join(adapter.argv(lv, env=e, placeholder_port=True))}`" for name, e in arms]
    return out + [""]


def _noise_lines(cd: CloseoutData) -> list[str]:
    """The Noise section: the A/A's band, offset and outliers per level, its lost samples, and the decision rule."""
    plan, levels, data, be, lost = cd.plan, cd.levels, cd.data, cd.backend, cd.lost
    bands = {n["level"]: n for n in data["noise"]}
    s = plan.stats
    out = ["## Noise (A/A of the baseline)", "",
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
    return out


def _variant_lines(cd: CloseoutData, v: dict, said, titles: dict, latest: dict) -> list[str]:
    """One experiment's section: its verdict, config, rules, table of levels, lost samples, resources, profile and
    correctness check."""
    plan, levels, be = cd.plan, cd.levels, cd.backend
    e = v["exp"]
    verdict_line = (said.outcome[e["variant"]] if latest.get(e["variant"]) == e["id"] and e["variant"] in said.outcome
                    else f"**{e['verdict'] or e['status']}** — {reason_text(e['verdict'] or e['status'], e['reason'])}")
    out = [f"## {e['variant']}: {titles.get(e['variant'], '')}", "", f"Verdict: {verdict_line}", ""]  # fmt: skip
    if e["variant"] in [x.id for x in plan.variants]:
        var = plan.variant(e["variant"])
        src = f" + source patch `{var.source_patch}`" if var.source_patch else ""
        envs = "".join(f", {k}={val} in its processes (the baseline's: {plan.environment.get(k, 'unset')})"
                       for k, val in var.env.items())  # fmt: skip
        out += [f"Config: `{cd.variant_configs[var.id]}`{src}{envs} against the baseline `{cd.baseline}`.", ""]
        out += _reach_lines(cd.data.get("events") or [], var)
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
        for lv, r in in_level_order(v["verdicts"], levels):
            out.append(f"| {lv.label} | {_num(cd.adapter.throughput(lv, r['base_us']))}{us(r['base_us'])} | "
                       f"{_num(cd.adapter.throughput(lv, r['variant_us']))}{us(r['variant_us'])} | "
                       f"{fmt.change(r['effect'])} {fmt.change_interval(r['ci_low'], r['ci_high'])} | {r['threshold']:.1%} | "
                       f"{r['verdict']} |")  # fmt: skip
        out += ["", f"Rounds: {e['rounds']} (ABBA-paired), {be.time_word} {e['gpu_s'] or 0:.2f} s.", ""]
    out += _also_lines(v["resources"].get("also"), v["verdicts"], levels)
    gone = cd.lost.get(e["id"], [])
    if gone:
        out += [f"Lost samples: {len(gone)}, each dropped with its round at that level; the last: "
                f"{gone[-1]}.", ""]  # fmt: skip
    res = v["resources"]
    if res and (cd.adapter.resource_model or res.get("compiled")):
        out += _resource_lines(res, {x.key: x.label for x in levels}, replayed=be.name == "replay")
    out += _profile_lines(cd.profiles.get(e["id"], []), {x.key: x.label for x in levels})
    return out + _correctness_lines(v["correctness"])


def _correctness_lines(corr: dict | None) -> list[str]:
    """The check before timing: a backend's own (a command ran and printed its metric), or the correctness check on
    fresh random inputs."""
    if not corr:
        return []
    lv_rows = corr.get("levels") or []
    ran = sum(1 for e in lv_rows if not e.get("same_as"))
    shared = (f"; {len(lv_rows)} levels in {ran} launches, levels with one stand-in and one set of parameters "
              "sharing one") if ran < len(lv_rows) else ""  # fmt: skip
    if corr.get("what"):  # a backend's own check (a command: it ran and printed its metric)
        return [f"Check before timing: {'passed' if corr.get('ok') else 'FAILED'} — {corr['what']}.", ""]
    return [f"Correctness before timing: {'passed' if corr.get('ok') else 'FAILED'} on fresh random inputs "
            f"({corr.get('device')}, {corr.get('dtype')}{shared}){': ' + corr.get('reason', '') if not corr.get('ok') else ''}.", ""]  # fmt: skip


def _not_run_lines(cd: CloseoutData) -> list[str]:
    """The Not run section: the todos cancelled as moot, with why."""
    cancelled = [t for t in cd.data["todos"] if t["status"] == "cancelled"]
    if not cancelled:
        return []
    return ["## Not run", ""] + [f"- {t['id']}: {t['reason']}" for t in cancelled] + [""]


def _state_lines(cd: CloseoutData) -> list[str]:
    """The State section: whether the config file is restored to the baseline's sha, and the journal's open patches."""
    now_sha = cd.config_sha
    ok = now_sha == cd.baseline_hash
    return ["## State", "",
            f"- State restored: the config file's sha {'matches' if ok else 'DOES NOT MATCH'} the baseline's ({now_sha}), "
            + (f"backup kept at {cd.backup_path}." if cd.backup_path else "no backup was needed (no file was patched)."),
            f"- Open patches in the journal: {cd.open_patches}.", ""]  # fmt: skip


def _recommendation_lines(cd: CloseoutData, said) -> list[str]:
    """The Roofline and Recommendation sections, the proposed follow-ups and what the baseline's profile points to."""
    out = []
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
    proposed = {t["id"].rsplit(".", 1)[-1].removesuffix("-cond"): t for t in cd.data["todos"]
                if (t["reason"] or "").startswith("proposed:")}  # fmt: skip
    follow = [f"- {line}" + (f" ({proposed[vid]['content']})" if vid in proposed else "")
              for vid, line in zip(said.follow_up_ids, said.follow_ups)]  # fmt: skip
    if follow:
        out += ["Proposed follow-ups:"] + follow + [""]
    base_prof = next((p for p in cd.ws_profiles if p["arm"] == "base"), None)
    if base_prof:  # what the profiler says bounds the baseline points the next step one way or the other
        f = base_prof["figures"]
        where = next((x.label for x in cd.levels if x.key == base_prof["level"]), base_prof["level"])
        out += [f"Profiled baseline at {where}: {bound_of(f)}; "
                f"{next_step(f)}.", ""]
    return out


def _ledger_lines(cd: CloseoutData) -> list[str]:
    """The Ledger section: time in samples, rounds, samples stored and lost, the budget, the plan, the profile step
    and where each level was measured."""
    plan, data, be, profs = cd.plan, cd.data, cd.backend, cd.ws_profiles
    gpu = sum(e["gpu_s"] or 0 for e in data["experiments"])
    rounds = sum(e["rounds"] or 0 for e in data["experiments"])
    n_samples = cd.samples
    n_lost = sum(len(x) for x in cd.lost.values())
    out = ["## Ledger", "", f"- {be.time_word[0].upper() + be.time_word[1:]} in samples: {gpu:.2f} s "
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
    label = {lv.key: lv.label for lv in cd.levels}
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
    return out


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
