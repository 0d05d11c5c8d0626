"""What a reviewer and a CI system read of a ``kinv regress`` comparison: the PR comment (Markdown), the JSON, the
JUnit XML, the full close-out, and the history of a kernel's verdicts.  It renders what the comparison hands it
(agent/tools/runners/regress.py and regress_prepare.py); it measures and decides nothing."""

from __future__ import annotations

import json
import time
from xml.sax.saxutils import escape as xml_escape

from kinv.agent import fmt
from kinv.agent.tools.runners.regress import Drift
from kinv.agent.tools.runners.regress_prepare import Comparison, KernelResult

MARK = {"improved": "🟢 improved", "regressed": "🔴 regressed", "equivalent": "⚪ equivalent",
        "undecided": "🟡 undecided", "broken": "🔴 broken", "failed": "⚠️ failed"}  # fmt: skip

SAY = {"regressed": "a kernel regressed beyond its margin", "failed": "a kernel could not be measured",
       "undecided": "nothing regressed, but some level is undecided within the budget",
       "ok": "nothing regressed beyond its margin"}  # fmt: skip


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _band(x: float | None) -> str:
    return f"±{fmt.percent(x)}" if x is not None else "—"


def _conf(k: KernelResult) -> str:
    c = next((lv.conf for lv in k.levels if lv.conf), None)
    return f"{c:.3%}" if c else "—"


def markdown(comp: Comparison, closeout_link: str) -> str:
    """The PR comment: per kernel a table of its levels (change, interval, verdict, the A/A band), the machine,
    both revisions, and the link to the full close-out."""
    lines = [f"### kinv regress: {SAY[comp.outcome]}", "",
             f"**BASE** `{comp.base.sha[:10]}` ({comp.base.name}) → **HEAD** `{comp.head.sha[:10]}` "
             f"({comp.head.label if comp.head.worktree else comp.head.name})  ",
             f"**machine**: {comp.machine} · backend `{comp.backend}` · {comp.gpu_s:.1f} GPU s, {comp.wall_s:.0f} s wall "
             f"(budget {comp.budget[0]:g} GPU s, {comp.budget[1]:g} s) · {_when(comp.started)}", ""]  # fmt: skip
    if comp.sources_only:
        lines += ["BASE contributed only its kernels' source files and configs, over HEAD's package (its adapters, "
                  "references and shared modules): `--kernel-sources-only`.", ""]  # fmt: skip
    if not comp.kernels:
        lines.append("No kernel, config or benchmark differs between the two revisions: nothing was measured.")
    for k in comp.kernels:
        lines += [f"#### `{k.kernel}`: {MARK.get(k.verdict, k.verdict)}", "",
                  f"{', '.join(k.differs) or 'nothing'} differs · `{k.base_config}` → `{k.head_config}` · margins from "
                  f"{k.setting_source} · {k.rounds} rounds", ""]  # fmt: skip
        if k.levels:
            lines += [f"| level | change (HEAD vs BASE) | interval [{_conf(k)}] | margin | verdict | A/A band |",
                      "|---|---:|---|---:|---|---:|"]  # fmt: skip
            for lv in k.levels:
                lines.append(f"| {lv.label} | {fmt.change(lv.effect)} | {fmt.change_interval(lv.ci_low, lv.ci_high)} | "
                             f"±{fmt.percent(lv.threshold, 1)} | {MARK[lv.verdict]} | {_band(lv.band)} |")  # fmt: skip
            lines.append("")
        if k.verdict in ("broken", "failed") or k.outcome == "undecided":
            lines += [f"> {k.reason}", ""]
        for level, what in k.resources.items():
            lab = next((lv.label for lv in k.levels if lv.level == level), level)
            lines.append(f"- regressed at {lab}: compiled {what}")
        if k.resources:
            lines.append("")
    if comp.unchanged:
        lines.append(f"Unchanged, not measured: {', '.join(comp.unchanged)}.  ")
    for name, why in comp.not_comparable.items():
        lines.append(f"Not comparable: {name} ({why}).  ")
    lines += ["", f"Change = HEAD's throughput over BASE's; the interval covers every level and look at the stated "
              f"confidence and is widened by the A/A's between-worker offset. Full close-out: [{closeout_link}]"
              f"({closeout_link})", ""]  # fmt: skip
    return "\n".join(lines)


def as_json(comp: Comparison, closeout_link: str, exit_code: int) -> str:
    d = comp.as_dict()
    d["closeout"] = closeout_link
    d["exit_code"] = int(exit_code)
    return json.dumps(d, indent=2, default=str)


def junit(comp: Comparison, closeout_link: str) -> str:
    """JUnit XML: one test suite per kernel, one test case per level (a regression is a failure, an undecided
    level skipped, a kernel that could not be measured an error)."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>']
    cases_total = sum(max(1, len(k.levels)) for k in comp.kernels)
    fails = sum(1 for k in comp.kernels for lv in k.levels if lv.verdict == "regressed") + \
        sum(1 for k in comp.kernels if k.verdict == "broken")  # fmt: skip
    errors = sum(1 for k in comp.kernels if k.verdict == "failed")
    out.append(f'<testsuites name="kinv regress" tests="{cases_total}" failures="{fails}" errors="{errors}" '
               f'time="{comp.wall_s:.1f}">')  # fmt: skip
    for k in comp.kernels:
        q = xml_escape
        props = {"base": f"{comp.base.name} {comp.base.sha}", "head": f"{comp.head.label} {comp.head.sha}",
                 "machine": comp.machine, "backend": comp.backend, "margins": k.setting_source,
                 "closeout": closeout_link}  # fmt: skip
        n = max(1, len(k.levels))
        kf = sum(1 for lv in k.levels if lv.verdict == "regressed") + (k.verdict == "broken")
        out.append(f'  <testsuite name="kinv.regress.{q(k.kernel)}" tests="{n}" failures="{kf}" '
                   f'errors="{int(k.verdict == "failed")}" time="{k.wall_s:.1f}">')  # fmt: skip
        out.append("    <properties>")
        for name, value in props.items():
            out.append(f'      <property name="{name}" value="{q(str(value), {chr(34): "&quot;"})}"/>')
        out.append("    </properties>")
        if not k.levels:
            tag = "failure" if k.verdict == "broken" else "error"
            out.append(f'    <testcase classname="kinv.regress.{q(k.kernel)}" name="{q(k.kernel)}">'
                       f'<{tag} message="{q(k.reason[:500], {chr(34): "&quot;"})}"/></testcase>')  # fmt: skip
            continue
        for lv in k.levels:
            text = (f"{fmt.change(lv.effect)} {fmt.change_interval(lv.ci_low, lv.ci_high)} (margin "
                    f"±{fmt.percent(lv.threshold, 1)}, A/A band {_band(lv.band)}): {lv.verdict}")  # fmt: skip
            out.append(f'    <testcase classname="kinv.regress.{q(k.kernel)}" name="{q(lv.label)}">')
            if lv.verdict == "regressed":
                extra = f"; compiled {k.resources[lv.level]}" if lv.level in k.resources else ""
                out.append(f'      <failure message="{q(text + extra, {chr(34): "&quot;"})}"/>')
            elif lv.verdict == "undecided":
                out.append(f'      <skipped message="{q(text, {chr(34): "&quot;"})}"/>')
            out.append(f"      <system-out>{q(text)}</system-out>")
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


def closeout(comp: Comparison, exit_code: int) -> str:
    """The full close-out: everything the comparison did, per kernel (what differs, where the margins came from,
    both configs and snapshots, the A/A, every level with both medians, the rules skipped, the ledger)."""
    lines = [f"# kinv regress {comp.id}: {comp.base.name} → {comp.head.name}", "",
             f"- BASE: {comp.base.label}, committed {comp.base.date}",
             f"- HEAD: {comp.head.label}, committed {comp.head.date}",
             f"- repository: {comp.repo}", f"- machine: {comp.machine} (backend {comp.backend})",
             f"- started {_when(comp.started)}; {comp.wall_s:.1f} s wall, {comp.gpu_s:.2f} GPU s "
             f"(budget {comp.budget[0]:g} GPU s, {comp.budget[1]:g} s wall)",
             f"- outcome: {SAY[comp.outcome]} (exit {int(exit_code)})"]  # fmt: skip
    if comp.sources_only:
        lines.append("- BASE: only its kernels' source files and configs, over HEAD's package (--kernel-sources-only)")
    lines.append("")
    for k in comp.kernels:
        lines += [f"## {k.kernel}: {k.verdict}", "", k.reason, "",
                  f"- differs: {', '.join(k.differs) or 'nothing (named by --kernel)'}",
                  f"- margins: {k.setting_source}; plan {k.plan}",
                  f"- BASE config {k.base_config}; snapshot {k.snapshots.get('base')}",
                  f"- HEAD config {k.head_config}; snapshot {k.snapshots.get('head')}",
                  f"- experiments: A/A {k.aa_experiment}, A/B {k.ab_experiment} (kinv show / kinv experiments read "
                  f"them); {k.rounds} rounds, {k.gpu_s:.2f} GPU s, {k.wall_s:.1f} s wall", ""]  # fmt: skip
        if k.levels:
            lines += ["| level | BASE µs | HEAD µs | change | interval | conf | margin | A/A band | offset SD | n | verdict |",
                      "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
            for lv in k.levels:
                us = [f"{x:.2f}" if x is not None else "—" for x in (lv.base_us, lv.head_us)]
                lines.append(f"| {lv.label} | {us[0]} | {us[1]} | {fmt.change(lv.effect)} | "
                             f"{fmt.change_interval(lv.ci_low, lv.ci_high)} | {f'{lv.conf:.3%}' if lv.conf else '—'} | "
                             f"±{fmt.percent(lv.threshold, 1)} | {_band(lv.band)} | "
                             f"{fmt.percent(lv.offset_sd) if lv.offset_sd is not None else '—'} | {lv.n} | {lv.verdict} |")  # fmt: skip
            lines.append("")
        for level, what in k.resources.items():
            lines.append(f"- compiled at {level}: {what}")
        for rule in k.skipped:
            lines.append(f"- rule skipped: {rule}")
        lines.append("")
    if comp.unchanged:
        lines.append(f"Unchanged between the revisions (not measured): {', '.join(comp.unchanged)}.")
    for name, why in comp.not_comparable.items():
        lines.append(f"Not comparable: {name}: {why}.")
    return "\n".join(lines) + "\n"


def history_text(kernel: str, rows: list[dict], drifts: list[Drift]) -> list[str]:
    """``kinv regress --history KERNEL``: every stored verdict (date, machine, revisions, level, change, interval,
    verdict), then each level's sum of point estimates beside the combined interval."""
    out = [f"kinv regress history of {kernel}: {len({r['regression'] for r in rows})} comparison(s)"]
    last = None
    for r in rows:
        if r["regression"] != last:
            last = r["regression"]
            head = (
                f"{r['head']} on {r['head_sha'][:10]}"
                if r["head"] == "the working tree"
                else f"{r['head_sha'][:10]} ({r['head']})"
            )
            out.append(f"#{r['regression']} {_when(r['started'])}  {r['base_sha'][:10]} ({r['base']}) -> {head}  "
                       f"on {r['machine'] or r['backend']}")  # fmt: skip
        if not r["level"]:
            out.append(f"    {r['verdict']}: {r['reason']}")
            continue
        out.append(f"    {r['label']:>8s} {fmt.change(r['effect']):>8s} {fmt.change_interval(r['ci_low'], r['ci_high'])} "
                   f"margin ±{fmt.percent(r['threshold'] or 0, 1)}  {r['verdict']}")  # fmt: skip
    if drifts:
        out.append("drift (sum of the point estimates, combined interval: half-widths in quadrature):")
        for d in drifts:
            out.append(f"    {d.label:>8s} {fmt.signed(d.change):>8s} {fmt.interval(d.ci_low, d.ci_high)} over {d.n} "
                       "comparison(s)")  # fmt: skip
    return out


__all__ = ["MARK", "SAY", "as_json", "closeout", "history_text", "junit", "markdown"]
