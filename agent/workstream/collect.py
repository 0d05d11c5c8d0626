"""The close-out's facts, collected once where they come from: the store (verdicts, noise, todos, events, samples,
profiles, places), the backend (where it measured, its ceilings, the recordings it served), the planner (its
ranking of what to try next), the files (the config as it is on disk) and the roofline.  :func:`collect` hands
them to :func:`kinv.agent.report.closeout.render` as one :class:`~kinv.agent.report.closeout.CloseoutData`; :func:`write_closeout`
is the close-out node's step: collect, render, write the Markdown and the figure, record it in the store."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from kinv.agent.report import closeout as report
from kinv.agent.report import figure, summary
from kinv.agent.store.db import Store
from kinv.agent.tools.runners import premise
from kinv.agent.words import MEASURED_VERDICTS
from kinv.agent.workstream import planner
from kinv.kernels.launch_config import describe


def experiments(store: Store, ws: str, version: int | None = None) -> dict:
    """Every experiment's rows the close-out shows, from the store: the experiments of one plan version when
    ``version`` is given (a new version's close-out never shows, relabels or counts an earlier version's work)."""
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


def roofline(data: dict, adapter, levels, copy_gbps: float | None, matrix_tflops: float | None,
             l2_bytes: int | None = None) -> dict:
    """Where the measured baseline sits against the roofline that bounds this kernel at each level.

    At each level the floor is ``max(bytes / copy bandwidth, FLOPs / matrix peak)``; the larger term names
    the bound (memory or compute: the level's arithmetic intensity against the ridge point).  A fraction above
    100% of the bound, or a memory-bound level whose *timed* working set (all the input sets the workers rotated
    through, from their set-ups) fits in the L2 cache (then repeated calls need not reach device memory at all),
    is *implausible*: it is kept with the reason and never counted
    as headroom.  ``data`` is :func:`experiments`.  Returns ``{"levels": {key: {bound, intensity, fraction,
    implausible}}, "headroom": 1 - the best plausible fraction (None without one), "bound": text}``.
    """
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


def figures(adapter, config: dict, lv, compiled: dict | None, why: dict | None, profile: dict | None) -> dict:
    """What a premise reads of one arm at one level (:class:`kinv.kernels.adapter.Premise`): the compiler's
    figures, the launch parameters there, the adapter's launch figures, the profiler's and items per launch."""
    try:
        params = dict(adapter.params_for(config, lv))
    except Exception:  # noqa: BLE001 - a config the adapter no longer takes: its parameters are unknown
        params = {}
    return {"compiled": compiled or None, "params": params, "why": why or {}, "profile": profile or None,
            "items": adapter.throughput(lv, 1e6)}  # fmt: skip


def premise_checks(plan, data: dict, levels, profiles: dict[int, list[dict]]) -> dict[str, premise.PremiseCheck]:
    """Each decided variant's premise (:func:`kinv.agent.tools.runners.premise.check`): the quantity its ``targets`` names,
    baseline and variant at every level, from the compiled resources its arms reported and the profiles."""
    adapter = plan.adapter
    base_res = json.loads((data.get("baseline") or {}).get("resources") or "{}")
    base_why = {x["level"]: x.get("why") for x in base_res.get("levels") or [] if isinstance(x, dict)}
    unit = adapter.throughput_unit.split("/")[0] or "item"
    out: dict[str, premise.PremiseCheck] = {}
    latest = {v["exp"]["variant"]: v for v in data["variants"]}
    for var in plan.variants:
        v = latest.get(var.id)
        if v is None or (v["exp"].get("verdict") or "") not in MEASURED_VERDICTS:
            continue
        res = v["resources"]
        compiled = res.get("compiled") or {}
        var_why = {x["level"]: x.get("why") for x in res.get("levels") or [] if isinstance(x, dict)}
        prof = {(p["arm"], p["level"]): p["figures"] for p in profiles.get(v["exp"]["id"], [])}
        rows = []
        for lv in levels:
            c = compiled.get(lv.key) or {}
            rows.append((lv.label,
                         figures(adapter, plan.baseline, lv, c.get("base"), base_why.get(lv.key), prof.get(("base", lv.key))),
                         figures(adapter, plan.variant_config(var), lv, c.get("variant"), var_why.get(lv.key),
                                 prof.get(("variant", lv.key)))))  # fmt: skip
        got = premise.check(var.id, var.targets, rows, adapter, unit)
        if got is not None:
            out[var.id] = got
    return out


def verdict_objects(plan, data: dict, levels, premises: dict | None = None) -> list[summary.VariantVerdict]:
    """Each of the plan's variants as the close-out's tables show it: its latest A/B of this version (the same
    rows its table prints), or why it has none (a person rejected it, it was moot, it failed before timing, it
    never ran).  The summary sentences are :func:`kinv.agent.report.summary.summarize` of these."""
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
        if v and (e.get("verdict") or "") in MEASURED_VERDICTS and v["verdicts"]:
            rows = {r["level"]: r for r in v["verdicts"]}
            lvs = tuple(summary.LevelVerdict(lv.label, rows[lv.key]["verdict"], rows[lv.key]["effect"],
                                             rows[lv.key]["ci_low"], rows[lv.key]["ci_high"],
                                             rows[lv.key]["threshold"])
                        if lv.key in rows else summary.LevelVerdict(lv.label, "unmeasured") for lv in levels)  # fmt: skip
            check = (premises or {}).get(var.id)
            out.append(summary.VariantVerdict(var.id, "measured", e["verdict"], lvs, changes=changes, expect=var.expect,
                                              target=premise.words(var.targets or ""),
                                              premise=check.outcomes if check else ()))  # fmt: skip
        elif reason.startswith("rejected by a person"):
            out.append(summary.VariantVerdict(var.id, "rejected", note=reason, changes=changes))
        elif reason.startswith("moot"):
            out.append(summary.VariantVerdict(var.id, "moot", note=reason, changes=changes))
        elif e.get("verdict") == "void" and (e.get("rounds") or e.get("gpu_s")):  # timed, then voided by a rule
            out.append(summary.VariantVerdict(var.id, "void", "void", note=report.reason_text("void", e.get("reason")),
                                              changes=changes))  # fmt: skip
        elif e.get("verdict"):
            out.append(summary.VariantVerdict(var.id, "failed", e["verdict"], note=report.reason_text(
                e["verdict"], e.get("reason")), changes=changes))  # fmt: skip
        else:
            out.append(summary.VariantVerdict(var.id, "not run", note=reason if todo.get("status") == "cancelled"
                                              else "", changes=changes))  # fmt: skip
    return out


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


def _live(ctx) -> str:
    """The live config file as it is on disk, described; an unreadable one is named as such."""
    from kinv.kernels.launch_config import load_config

    try:
        return describe(load_config(ctx.config_path, ctx.adapter.name))
    except Exception:  # noqa: BLE001 - an unreadable live file is named as such, the close-out still written
        return "(unreadable)"


def collect(store: Store, plan, state: dict, ctx) -> report.CloseoutData:
    """Everything the close-out shows, read, asked and computed once: the verdicts, the noise, the planner's
    ranking, the roofline, the compiled resources and the profiles, the ledger, the state of the files."""
    from kinv.agent.tools.files import configs
    from kinv.agent.tools.measure.sequential import matrix_peak
    from kinv.kernels.devices import get_device

    ws = plan.ws
    levels = ctx.levels()
    version = getattr(ctx, "version", None)
    data = experiments(store, ws, version)
    be = ctx.backend
    replayed = be.name == "replay"
    mark = recordings_source(be, plan.kernel) if replayed else ""
    lost: dict[int, list[str]] = {}  # experiment -> its lost samples' lines (a command that failed, hung, printed none)
    all_events = store.events(ws, limit=100_000)
    for ev in all_events:
        if ev["kind"] == "sample.lost":
            lost.setdefault(json.loads(ev["data"] or "{}").get("experiment"), []).append(ev["message"])
    profiles = {v["exp"]["id"]: store.profiles(exp_id=v["exp"]["id"]) for v in data["variants"]}
    premises = premise_checks(plan, data, levels, profiles)
    verdicts = verdict_objects(plan, data, levels, premises)
    parent = plan.workstream.parent
    ceil = be.ceilings()
    roof = roofline(data, ctx.adapter, levels, ceil.get("copy_gbps"),
                    matrix_peak(ceil, get_device(plan.device).matrix_tflops)[0], l2_bytes=_l2_bytes(be, plan.kernel))  # fmt: skip
    winners = sorted({x["config"] for x in roof["levels"].values()
                      if x.get("config") not in (None, "baseline") and not x["implausible"]})  # fmt: skip
    never = [v.id for v in verdicts if v.status in ("rejected", "not run")]
    decided = {e: vid for vid, e in planner.decided(state).items()}  # experiment id -> variant: the run's ids
    results = {decided[v["exp"]["id"]]: planner.result(v["exp"], v["verdicts"]) for v in data["variants"]
               if v["exp"]["id"] in decided}  # fmt: skip
    ranked = planner.recommend(plan, results, roof["headroom"], roof["bound"],
                               measured_by=", ".join(winners), unmeasured=never,
                               implausible=roof["implausible"], premises=premises)  # fmt: skip
    backups = [b for b in store.backups() if b["workstream"] == ws]
    events = store.events(ws)
    skipped = [e["message"] for e in events if e["kind"] == "profile.skipped"]
    return report.CloseoutData(
        plan=plan, levels=list(levels), adapter=ctx.adapter, data=data, verdicts=verdicts,
        baseline=describe(plan.baseline),
        variant_configs={v.id: describe(plan.variant_config(v)) for v in plan.variants},
        live=_live(ctx), live_file=Path(ctx.config_path).name,
        incumbent_of=parent if parent and store.campaign(parent) else None,
        backend=report.BackendFacts(name=be.name, loud=(f"REPLAY backend: no GPU is measured; serving {mark}"
                                                        if replayed else be.loud),
                                    time_word=be.time_word, each_sample=be.each_sample,
                                    mark=f"REPLAY of {mark}" if replayed else f"live, {be.name}"),  # fmt: skip
        lost=lost, thresholds=state.get("thresholds", {}), budget_exhausted=bool(state.get("budget_exhausted")),
        config_sha=configs.sha(ctx.config_path), baseline_hash=(store.workstream(ws) or {}).get("baseline_hash"),
        backup_path=backups[-1]["backup_path"] if backups else None, open_patches=len(store.dangling_patches()),
        roof=roof, ranked=ranked,
        profiles=profiles, premises=premises,
        ws_profiles=store.profiles(ws), profile_skipped=skipped[-1] if skipped else None,
        samples=sum(store.sample_count(e["id"]) for e in data["experiments"]),
        places=store.places([e["id"] for e in data["experiments"] if e["kind"] != "screen"]),
        screened_on=store.places([e["id"] for e in data["experiments"] if e["kind"] == "screen"]),
        gpus_lost=[e["message"] for e in events if e["kind"] == "executor-loss"],
        plan_path=str(ctx.plan_path), plan_hash=ctx.plan_hash, written=time.time(),
    )  # fmt: skip


def write_closeout(store: Store, plan, state: dict, ctx, out_dir: Path | None = None) -> Path:
    """The close-out node's step: collect once, render the Markdown and the figure, write both, and record the
    recommendation and the close-out's path in the store."""
    out_dir = Path(out_dir or store.dir / "reports")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = plan.ws.lstrip("#") + "-closeout"
    cd = collect(store, plan, state, ctx)
    md = report.render(cd)
    if cd.ranked:
        top = cd.ranked[0]
        store.update_workstream(plan.ws, recommendation=f"{top['id']}: {top['title']}")
    png = figure.plot(cd.data, out_dir / f"{stem}.png", cd.adapter, cd.levels,
                      title=f"{plan.ws} {plan.workstream.title} [{cd.backend.mark}]", baseline=cd.baseline)  # fmt: skip
    if png:
        md += f"\n![throughput by level]({png.name})\n"
    path = out_dir / f"{stem}.md"
    path.write_text(md)
    store.update_workstream(plan.ws, report_path=str(path), status="closed", closed=time.time())
    return path
