"""Rich rendering of the read views (agent/report/views.py); plain text when not a terminal."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

MARK = {"completed": "[green]✓[/green]", "in_progress": "[yellow]▶[/yellow]", "pending": "·",
        "cancelled": "[dim]✗[/dim]"}  # fmt: skip


class PlainTable(Table):
    """A table whose string cells are text, never rich markup: a level-conditional config's label
    ("BT64/BH16/w8/s2 [b<=1: w8; b2-8: BT32]") prints whole.  A cell that means markup passes a ``Text``."""

    def add_row(self, *renderables, **kwargs) -> None:
        super().add_row(*(Text(r) if isinstance(r, str) else r for r in renderables), **kwargs)


def table(*columns: str, title: str | None = None) -> Table:
    """kinv's tables: a light frame (header rule only, no side borders).  Every column folds rather than cuts, so
    at 80 columns a narrow terminal wraps a cell and never drops a column; ids, levels and states keep room for
    their words.  Piped (not a terminal), the console is wide (:func:`console`) and nothing wraps."""
    from rich import box

    t = PlainTable(title=escape(title) if title else None, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    for c in columns:
        t.add_column(c, no_wrap=False, overflow="fold", min_width=MIN_WIDTH.get(c))
    return t


# columns a reader looks a row up by: never squeezed below their usual words
MIN_WIDTH = {"id": 3, "level": 5, "status": 9, "verdict": 9, "check": 8, "step": 4, "kernel": 10, "workstream": 5,
             "arm": 3, "n": 2, "ok": 3}  # fmt: skip


def console(file=None, is_terminal: bool | None = None):
    """kinv's console.  On a terminal: its width, and long lines wrap.  Piped or redirected: a wide console
    whose lines are never wrapped or cut (a log or ``| grep`` gets every word)."""
    import sys

    from rich.console import Console

    tty = (file or sys.stdout).isatty() if is_terminal is None else is_terminal
    if tty:
        return Console(file=file, highlight=False)
    return Console(file=file, highlight=False, width=WIDE, soft_wrap=True, force_terminal=False)


WIDE = 4096  # piped output: wide enough for any table kinv prints, on one line per row


def diff(console, text: str) -> None:
    """A unified diff: coloured on a terminal, the plain text itself when piped."""
    if console.is_terminal:
        from rich.syntax import Syntax  # pygments: only when a diff is shown on a terminal

        console.print(Syntax(text, "diff", theme="ansi_dark"))
    else:
        console.print(text, markup=False, highlight=False)


def _t(ts) -> str:
    from kinv.agent.ids import stamp

    return stamp(ts)


def status(console, view) -> None:
    if not view.workstreams and not view.adhoc and not view.campaigns:
        console.print(f"no workstreams in {escape(str(view.state_dir))}; start one: kinv run "
                      "plans/3a-attention-occupancy.yaml")  # fmt: skip
        return
    if view.adhoc:
        adhoc = table("id", "kind", "config", "backend", "status", "verdict", "rounds", "samples",
                      title="ad-hoc experiments (kinv bench, kinv noise): kinv show ID")  # fmt: skip
        for e in view.adhoc:
            adhoc.add_row(str(e.id), e.kind or "", e.variant or "", e.backend or "", e.status or "", e.verdict or "",
                      str(e.rounds or ""), str(e.samples))  # fmt: skip
    by_id = {ws.id: ws for ws in view.workstreams}
    nested = set()
    # every line whole: a narrow terminal wraps it (the state word and a config's label are never cut off)
    for c in view.campaigns:
        tree = Tree(Text.from_markup(f"[bold]campaign {escape(c.id)}[/bold] — {escape(c.status)}: "
                                     f"{escape(c.incumbent or '')}"))  # fmt: skip
        for st in c.steps:
            ws = by_id.get(st.ws) if st.ws else None
            verdicts = ", ".join(f"{k} {v}" for k, v in st.verdicts.items())
            what = f"{st.ws or '—'} {st.item}: {ws.status if ws else st.phase}"
            what += f" ({st.screened} screened, {st.pruned} pruned)" if st.screened or st.pruned else ""
            what += f"; {verdicts}" if verdicts else (f"; {st.note}" if st.note else "")
            node = tree.add(Text(what))
            if ws:
                nested.add(ws.id)
                for t in ws.todos:
                    node.add(_todo_line(t))
        console.print(tree)
        if c.stop_reason:
            console.print(f"  stopped: {c.stop_reason}", markup=False)
    for ws in view.workstreams:
        if ws.id in nested and not ws.pending_approvals:
            continue
        head = f"[bold]{escape(ws.id)}[/bold] {escape(ws.title or '')} — {escape(ws.status or '')}"
        if ws.parent:
            head += f"  (part of {escape(ws.parent)}: {escape(ws.parent_title or '')})"
        tree = Tree(Text.from_markup(head))
        for t in ws.todos:  # one entry per todo, wrapped on a narrow terminal (kinv todos WS: a table)
            tree.add(_todo_line(t))
        console.print(tree)
        for lp in ws.live_patches:
            console.print(f"  [bold red]live patch[/bold red]: {escape(lp)}; not running, so nothing will revert it: "
                          f"{ws.way_back}")
        for a in ws.pending_approvals:
            console.print(f"  [bold yellow]waiting for you[/bold yellow]: {escape(a.id)} ({escape(a.variant or '')}) "
                          f"→ kinv approve {escape(a.id)}")  # fmt: skip
        for v in ws.latest_verdicts:
            console.print(f"  verdict {v.variant}: {v.verdict} (kinv show {v.experiment}) — {v.reason or ''}",
                          markup=False)  # fmt: skip
        if ws.recommendation:
            console.print(f"  next: {ws.recommendation}", markup=False)
        if ws.report_path:
            console.print(f"  close-out: {ws.report_path}", markup=False)
    if view.adhoc:
        console.print(adhoc)


def _todo_line(t) -> Text:
    line = Text.from_markup(f"{MARK.get(t.status, '?')} ")
    line.append(f"{t.id} {t.content} ")
    line.append(f"{t.status}{' — ' + t.reason if t.reason else ''}", style="dim")
    return line


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
    console.print(f"[bold]experiment {e.id}[/bold] " + escape(f"{e.workstream or ''} {e.variant or ''} ({e.kind}, "
                  f"{e.backend}): {e.verdict or e.status} — {e.reason or ''}"))  # fmt: skip
    if v.diff:
        diff(console, v.diff)
    for c in v.env_checks:
        console.print(f"env check ({c.get('source')}): {'ok' if c.get('ok') else 'MISMATCH ' + str(c.get('mismatch'))}"
                      f" expected {c.get('expected')} seen {c.get('seen')}", markup=False)  # fmt: skip
    compiled = (v.resources or {}).get("compiled")
    if compiled:
        from kinv.agent.report.resources import compiled_table

        for line in compiled_table(compiled)[1:]:
            console.print(line, markup=False)
    if v.correctness:
        console.print(f"correctness: {'passed' if v.correctness.get('ok') else 'FAILED'} "
                      f"({v.correctness.get('device')}, {v.correctness.get('dtype')}) {v.correctness.get('reason') or ''}",
                      markup=False)  # fmt: skip
    from kinv.agent.tools.measure.stats import level_names

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
        from kinv.agent import fmt

        t = table("level", "throughput change", f"{conf:.3%} CI" if conf else "CI", "threshold", "verdict",
                  title=title)  # fmt: skip
        for r in v.effects:
            t.add_row(short[r.level], fmt.change(r.effect), fmt.change_interval(r.ci_low, r.ci_high),
                      f"{r.threshold:.1%}", r.verdict)  # fmt: skip
        console.print(t)
    led = v.ledger
    console.print(f"ledger: {led.gpu_s:.2f} GPU s, {led.rounds} rounds, {led.wall_s:.1f} s wall, {led.samples} samples")
    if v.logs:
        console.print(f"output of every run ({v.logs['files']} files): {v.logs['dir']}/{v.logs['pattern'].split()[0]}",
                      markup=False, highlight=False)  # fmt: skip


def pending(console, items) -> None:
    if not items:
        console.print("nothing is waiting for approval")
        return
    for a in items:
        console.print(f"[bold]{escape(a.id)}[/bold] " + escape(f"{a.workstream} {a.variant} ({a.kind}) since "
                                                             f"{_t(a.created)}"))  # fmt: skip
        if a.title:
            console.print(f"  {a.variant}: {a.title}" + (f" — {a.rationale}" if a.rationale else ""), markup=False)
        if a.diff:
            diff(console, a.diff)
        predicted_resources(console, a.resources)
        console.print(f"  approve: kinv approve {a.id}   reject: kinv reject {a.id} --reason '...'", markup=False)


def predicted_resources(console, resources: dict) -> None:
    """Baseline -> variant resources per level: the compiler's where a GPU compiled them, else the analytical
    model's, labelled as such."""
    if not resources:  # nothing to show (a command measured as a whole)
        return
    compiled = resources.get("compiled") or {}
    if compiled:
        on = resources.get("compiled_on") or "GPU"
        how = "recorded from the GPU's compiler, served by replay" if on == "replay" else f"{on}, compile only"
        console.print(f"  compiled resources ({how}), baseline -> variant:", markup=False)
        for level, c in compiled.items():
            b, v = c.get("base") or {}, c.get("variant") or {}
            console.print(f"    {level}: registers/thread {b.get('registers')} -> {v.get('registers')}, spills "
                          f"{b.get('spills')} -> {v.get('spills')}, shared memory {(b.get('smem') or 0) / 1024:.1f} -> "
                          f"{(v.get('smem') or 0) / 1024:.1f} KB, CTAs/SM {b.get('ctas_per_sm')} -> "
                          f"{v.get('ctas_per_sm')} (limited by {b.get('limited_by')} -> {v.get('limited_by')}), waves "
                          f"{b.get('waves')} -> {v.get('waves')}", markup=False)  # fmt: skip
        return
    console.print(f"  predicted resources (analytical model{': ' + resources['compiled_note'] if (resources or {}).get('compiled_note') else ''}), baseline -> variant:",
                  markup=False)  # fmt: skip
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


def placed_table(rows) -> Table:
    """A multi-plan run's workstreams: where each ran, how it ended, its wall time and last line."""
    t = table("workstream", "kernel", "place", "exit", "wall s", "ended with", title="workstreams")
    for r in rows:
        t.add_row(r.ws, r.kernel, r.place or "-", str(r.exit_code), f"{r.wall_s:.1f}", r.last_line)
    return t


def check(console, outcome) -> None:
    """``kinv check``: each arm's gate and what runs at each level, each variant's edit as its approval shows it."""
    from kinv.agent.report.check import _gate_line, predicted_lines

    console.print(f"NOTHING WAS TIMED: {outcome.ws} checked ({outcome.kernel}; gate on {outcome.device}"
                  + (", the Triton interpreter" if outcome.device == "cpu" else "") + ")", markup=False)  # fmt: skip
    t = table("arm", "level", "runs", title="every arm at every level")
    for arm in outcome.arms:
        for lv in arm.levels:
            t.add_row(arm.name, lv["label"], lv["runs"])
    console.print(t)
    for line in outcome.plugin_imports:  # the plugin's imports of kinv outside kinv.plugin
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for arm in outcome.arms:
        console.print(f"{arm.name}: {_gate_line(arm)}", markup=False, highlight=False)
        if arm.diff:
            console.print(f"  {arm.name}'s edit, as its approval would show it:", markup=False)
            diff(console, arm.diff.rstrip("\n"))
        for line in predicted_lines(arm.resources):
            console.print(f"  {line}", markup=False, highlight=False)
        if arm.premise:
            console.print(f"  {arm.premise}", markup=False, highlight=False)
