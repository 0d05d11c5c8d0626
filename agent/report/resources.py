"""A variant's resources and profiles in words: the compiler's figures and the analytical model's per level,
and what the profiler says bounds a kernel and explains a verdict."""

from __future__ import annotations


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
