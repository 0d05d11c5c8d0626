"""Rich rendering of the read views (agent/views.py); plain text when not a terminal."""

from __future__ import annotations

from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

MARK = {"completed": "[green]✓[/green]", "in_progress": "[yellow]▶[/yellow]", "pending": "·",
        "cancelled": "[dim]✗[/dim]"}  # fmt: skip


def table(*columns: str, title: str | None = None) -> Table:
    """kinv's tables: a light frame (header rule only, no side borders) so that every table of a plan's
    levels and variants reads at 80 columns."""
    from rich import box

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for c in columns:  # numbers and intervals never wrap; prose columns do
        t.add_column(c, no_wrap=c not in PROSE, overflow="fold" if c in PROSE else "ellipsis")
    return t


PROSE = {"content", "reason", "decision", "file", "variant", "outcome", "finding", "fix"}


def _t(ts) -> str:
    from kinv.agent.ids import stamp

    return stamp(ts)


def status(console, view) -> None:
    if not view.workstreams and not view.adhoc and not view.campaigns:
        console.print(f"no workstreams in {view.state_dir}; start one: kinv run plans/3a-attention-occupancy.yaml")
        return
    if view.adhoc:
        adhoc = table("id", "kind", "config", "backend", "status", "verdict", "rounds", "samples",
                      title="ad-hoc experiments (kinv bench, kinv noise): kinv show ID")  # fmt: skip
        for e in view.adhoc:
            adhoc.add_row(str(e.id), e.kind or "", e.variant or "", e.backend or "", e.status or "", e.verdict or "",
                      str(e.rounds or ""), str(e.samples))  # fmt: skip
    by_id = {ws.id: ws for ws in view.workstreams}
    nested = set()
    for c in view.campaigns:
        label = Text.from_markup(f"[bold]campaign {c.id}[/bold] — {c.status}: {c.incumbent}", overflow="ellipsis")
        label.no_wrap = True
        tree = Tree(label)
        for st in c.steps:
            ws = by_id.get(st.ws) if st.ws else None
            verdicts = ", ".join(f"{k} {v}" for k, v in st.verdicts.items())
            what = f"{st.ws or '—'} {st.item}: {ws.status if ws else st.phase}"
            what += f" ({st.screened} screened, {st.pruned} pruned)" if st.screened or st.pruned else ""
            what += f"; {verdicts}" if verdicts else (f"; {st.note}" if st.note else "")
            line = Text(what, overflow="ellipsis")
            line.no_wrap = True
            node = tree.add(line)
            if ws:
                nested.add(ws.id)
                for t in ws.todos:
                    tl = Text.from_markup(f"{MARK.get(t.status, '?')} ", overflow="ellipsis")
                    tl.no_wrap = True
                    tl.append(f"{t.id} {t.content} ")
                    tl.append(t.status, style="dim")
                    node.add(tl)
        console.print(tree)
        if c.stop_reason:
            console.print(f"  stopped: {c.stop_reason}", overflow="ellipsis", no_wrap=True, markup=False)
    for ws in view.workstreams:
        if ws.id in nested and not ws.pending_approvals:
            continue
        head = f"[bold]{ws.id}[/bold] {ws.title} — {ws.status}"
        if ws.parent:
            head += f"  (part of {ws.parent}: {ws.parent_title or ''})"
        label = Text.from_markup(head, overflow="ellipsis")
        label.no_wrap = True
        tree = Tree(label)
        for t in ws.todos:  # one line per todo, cut with an ellipsis (kinv todos WS shows them whole)
            line = Text.from_markup(f"{MARK.get(t.status, '?')} ", overflow="ellipsis")
            line.no_wrap = True
            line.append(f"{t.id} {t.content} ")
            line.append(f"{t.status}{' — ' + t.reason if t.reason else ''}", style="dim")
            tree.add(line)
        console.print(tree)
        for lp in ws.live_patches:
            console.print(f"  [bold red]live patch[/bold red]: {escape(lp)}; not running, so nothing will revert it: "
                          f"{ws.way_back}")
        for a in ws.pending_approvals:
            console.print(f"  [bold yellow]waiting for you[/bold yellow]: {a.id} ({a.variant}) → kinv approve {a.id}")
        for v in ws.latest_verdicts:
            console.print(f"  verdict {v.variant}: {v.verdict} (kinv show {v.experiment}) — {v.reason or ''}",
                          overflow="ellipsis", no_wrap=True, markup=False)  # fmt: skip
        if ws.recommendation:
            console.print(f"  next: {ws.recommendation}")
        if ws.report_path:
            console.print(f"  close-out: {ws.report_path}")
    if view.adhoc:
        console.print(adhoc)


def todos(console, items) -> None:
    t = table("id", "status", "content", "reason")
    for i in items:
        t.add_row(i.id, i.status, i.content, i.reason or "")
    console.print(t)


def experiments(console, items) -> None:
    backends = {e.backend for e in items if e.backend}
    t = table("id", "variant", "kind", "status", "verdict", "rounds", "GPU s", "samples",
              title=f"backend: {', '.join(sorted(backends))}" if backends else None)  # fmt: skip
    for e in items:
        t.add_row(str(e.id), e.variant or "", e.kind or "", e.status or "", e.verdict or "",
                  str(e.rounds or ""), f"{e.gpu_s or 0:.2f}", str(e.samples))  # fmt: skip
    console.print(t)


def show(console, v) -> None:
    e = v.experiment
    console.print(f"[bold]experiment {e.id}[/bold] {e.workstream or ''} {e.variant or ''} ({e.kind}, {e.backend}): "
                  f"{e.verdict or e.status} — {e.reason or ''}")  # fmt: skip
    if v.diff:
        console.print(Syntax(v.diff, "diff", theme="ansi_dark"))
    for c in v.env_checks:
        console.print(f"env check ({c.get('source')}): {'ok' if c.get('ok') else 'MISMATCH ' + str(c.get('mismatch'))}"
                      f" expected {c.get('expected')} seen {c.get('seen')}")  # fmt: skip
    if v.correctness:
        console.print(f"correctness: {'passed' if v.correctness.get('ok') else 'FAILED'} "
                      f"({v.correctness.get('device')}, {v.correctness.get('dtype')}) {v.correctness.get('reason') or ''}")
    from kinv.agent.stats import level_names

    common, short = level_names([s.level for s in v.sample_summary] + [r.level for r in v.effects])
    title = f"levels {common}" if common else None
    if v.sample_summary:
        placed = any(s.place for s in v.sample_summary)  # a Ray run: which GPU timed each row
        t = table("level", "arm", *(["GPU"] if placed else []), "n", "median µs", "min", "max", "CV", title=title)
        for s in v.sample_summary:
            t.add_row(short[s.level], s.arm, *([s.place or ""] if placed else []), str(s.n), f"{s.median_us:.2f}",
                      f"{s.min_us:.2f}", f"{s.max_us:.2f}", f"{s.cv:.2%}")  # fmt: skip
        console.print(t)
    if v.effects:
        conf = v.effects[0].conf
        import math

        t = table("level", "throughput change", f"{conf:.3%} CI" if conf else "CI", "threshold", "verdict",
                  title=title)  # fmt: skip
        for r in v.effects:
            t.add_row(short[r.level], f"{math.expm1(r.effect):+.2%}", f"[{math.expm1(r.ci_low):+.2%}, "
                      f"{math.expm1(r.ci_high):+.2%}]", f"{r.threshold:.1%}", r.verdict)  # fmt: skip
        console.print(t)
    led = v.ledger
    console.print(f"ledger: {led.gpu_s:.2f} GPU s, {led.rounds} rounds, {led.wall_s:.1f} s wall, {led.samples} samples")


def pending(console, items) -> None:
    if not items:
        console.print("nothing is waiting for approval")
        return
    for a in items:
        console.print(f"[bold]{a.id}[/bold] {a.workstream} {a.variant} ({a.kind}) since {_t(a.created)}")
        if a.title:
            console.print(f"  {a.variant}: {a.title}" + (f" — {a.rationale}" if a.rationale else ""))
        if a.diff:
            console.print(Syntax(a.diff, "diff", theme="ansi_dark"))
        predicted_resources(console, a.resources)
        console.print(f"  approve: kinv approve {a.id}   reject: kinv reject {a.id} --reason '...'")


def predicted_resources(console, resources: dict) -> None:
    """Baseline -> variant shared memory and occupancy per level (analytical)."""
    console.print("  predicted resources (analytical), baseline -> variant:")
    for level, p in (resources.get("predicted") or {}).items():
        console.print(f"    {level}: shared memory {p.get('smem_base', 0) / 1024:.1f} -> "
                      f"{p.get('smem_variant', 0) / 1024:.1f} KB, CTAs/SM {p.get('ctas_per_sm_base')} -> "
                      f"{p.get('ctas_per_sm_variant')}, warps/SM {p.get('warps_per_sm_base')} -> "
                      f"{p.get('warps_per_sm_variant')}")  # fmt: skip


def history(console, items) -> None:
    if not items:
        console.print("no graph node has run for this workstream yet")
        return
    t = table("step", "node", "time (UTC)", "outcome", "decision")
    for i in items:
        t.add_row(str(i.step), i.node, i.time.removesuffix("Z"), i.outcome, i.decision or "")
    console.print(t)


def backups(console, items) -> None:
    t = table("id", "workstream", "file", "backup", "sha")
    for b in items:
        t.add_row(str(b.id), b.workstream or "", b.path, b.backup_path, b.sha)
    console.print(t)
