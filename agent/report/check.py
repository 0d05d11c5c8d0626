"""The close-out skeleton of ``kinv check`` (agent/workstream/check.py): the shape a run's close-out will have, with
every figure a run measures left empty and a first line that says nothing was timed."""

from __future__ import annotations


def _gate_line(arm) -> str:
    if arm.skipped:
        return f"not checked: {arm.skipped}"
    g = arm.gate
    if g.get("ok"):
        levels = g.get("levels") or []
        ran = sorted({e.get("ran") for e in levels if e.get("ran")})
        stand = f"; ran as {', '.join(ran)}" if ran and ran != sorted(e.get("level") for e in levels) else ""
        return f"correct at {len(levels)} level(s) ({g.get('device')}, {g.get('dtype')}{stand})"
    lv = arm.failed_level()
    return "FAILED" + (f" at {lv}" if lv else "") + f": {g.get('reason') or 'no reason given'}"


def predicted_lines(resources: dict) -> list[str]:
    """The predicted resources of a variant against the baseline, one line per level (or the note why none)."""
    if not resources:
        return []
    if resources.get("note"):
        return [resources["note"]]
    out = []
    basis = f"; {resources['basis']}" if resources.get("basis") else ""  # registers unknown: shared memory alone
    for level, p in (resources.get("predicted") or {}).items():
        out.append(f"{level}: shared memory {p['smem_base'] / 1024:.1f} -> {p['smem_variant'] / 1024:.1f} KB, CTAs/SM "
                   f"{p['ctas_per_sm_base']} -> {p['ctas_per_sm_variant']}, warps/SM {p['warps_per_sm_base']} -> "
                   f"{p['warps_per_sm_variant']} (limited by {p['limited_by_base']} -> {p['limited_by_variant']}{basis})")  # fmt: skip
    if resources.get("feasible") is False:
        out.append(f"infeasible on {resources.get('device')}: {resources.get('reason')}")
    return out


def skeleton(outcome) -> str:
    """Markdown: what was checked, and the close-out's sections with their measured figures to come."""
    ok = outcome.ok
    lines = [
        f"# {outcome.ws} check: {outcome.plan_path}",
        "",
        "**NOTHING WAS TIMED.** This is `kinv check`'s skeleton of the close-out: the plan validated, every arm's "
        "config resolved at every level, the correctness gate run, each edit shown as its approval would show it. "
        "No A/A, no A/B, no verdict: run the plan (`kinv run`) on a GPU to measure it.",
        "",
        f"- kernel: `{outcome.kernel}`; gate ran on: {outcome.device}"
        + (" (the Triton interpreter)" if outcome.device == "cpu" else ""),
        f"- result: {'every arm would run' if ok else 'a gate failed: ' + '; '.join(outcome.failures())}",
        f"- checked in {outcome.seconds:.1f} s",
        "",
    ]
    if outcome.plugin_imports:
        lines += ["## The plugin's imports of kinv", "",
                  "Public: `kinv.plugin` only (docs/plugin-api.md). Deprecated paths work until the release named.", ""]
        lines += [f"- {line}" for line in outcome.plugin_imports] + [""]
    lines += [
        "## Arms",
        "",
    ]
    for arm in outcome.arms:
        lines += [f"### {arm.name}: {arm.title}", "", f"- config: `{arm.config}`"]
        if arm.env:
            lines.append("- environment: " + ", ".join(f"`{k}={v}`" for k, v in sorted(arm.env.items())))
        lines.append(f"- gate: {_gate_line(arm)}")
        lines.append("- runs, by level:")
        lines += [f"  - {lv['label']} (`{lv['level']}`): `{lv['runs']}`" for lv in arm.levels]
        pred = predicted_lines(arm.resources)
        if pred:
            lines.append("- predicted resources, baseline -> variant:")
            lines += [f"  - {p}" for p in pred]
        if arm.premise:
            lines.append(f"- {arm.premise}")
        if arm.diff:
            lines += ["- the edit its approval would show:", "", "```diff", arm.diff.rstrip("\n"), "```"]
        lines.append("")
    lines += [
        "## Noise (A/A)",
        "",
        "_not measured: kinv check times nothing._",
        "",
        "## Verdicts",
        "",
        "| variant | level | change | interval | verdict |",
        "|---|---|---|---|---|",
    ]
    for arm in outcome.arms[1:]:
        for lv in arm.levels:
            verdict = "would not run (gate failed)" if not arm.ok else "not timed"
            lines.append(f"| {arm.name} | {lv['label']} | — | — | {verdict} |")
    lines += ["", "## What to try next", "", "_decided by a run's measurements._", ""]
    return "\n".join(lines)
