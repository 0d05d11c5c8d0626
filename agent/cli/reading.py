"""Read commands (no torch, triton or langgraph): status, todos, experiments, show, export, compare, pending,
history, backups, report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from kinv.agent import fmt
from kinv.agent.cli.common import Exit, JsonOpt, StateOpt, _console, _emit, _exp_id, _id, _store, app
from kinv.agent.errors import EXIT_BAD_INPUT, EXIT_FAIL


# --------------------------------------------------------------------------- #
# read commands (no torch, triton or langgraph)
# --------------------------------------------------------------------------- #
@app.command()
def status(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """Every workstream: its todos as a tree, approvals waiting, latest verdicts, recommendation.

    Example: kinv status --json
    """
    from kinv.agent.report import render, views

    view = views.status(_store(state_dir))  # damaged or lost state: one line naming the file and the way back
    _emit(view, as_json, render.status)
    left = [w for w in view.workstreams if w.live_patches]
    if left:  # a kernel file holds a patch no live run will revert: an alarm, not a report
        raise Exit(EXIT_FAIL, f"{left[0].live_patches[0]} and no run of {left[0].id} is alive: restore it with "
                              f"{left[0].way_back}")  # fmt: skip


@app.command()
def todos(
    ws: str = typer.Argument(..., help="workstream id, e.g. 3a or #3a"),
    fmt: str = typer.Option("kinv", "--format", help="kinv (a table) | opencode | claude"),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """A workstream's todo list; --format opencode|claude exports it for a coding agent.

    Example: kinv todos 3a --format claude
    """
    from kinv.agent.report import render, todo_export, views

    ws = _id(ws, "workstream id")
    todo_export.check_format(fmt)  # before the store opens: a bad value creates nothing
    store = _store(state_dir)
    items = views.todos(store, views.resolve_ws(store, ws))
    if fmt == "kinv":
        _emit(items, as_json, render.todos)
    else:  # wrapped as both tools' todo writers take it: {"todos": [...]}
        print(json.dumps({"todos": todo_export.export_todos(items, fmt)}, indent=2))


@app.command()
def experiments(ws: str = typer.Argument(..., help="workstream id"), state_dir: str = StateOpt,
                as_json: bool = JsonOpt):  # fmt: skip
    """A workstream's experiments: variant, verdict, rounds, GPU time.

    Example: kinv experiments 3a
    """
    from kinv.agent.report import render, views

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    _emit(views.experiments(store, views.resolve_ws(store, ws)), as_json, render.experiments)


@app.command()
def show(exp_id: int = typer.Argument(..., help="experiment id (kinv experiments WS)"), state_dir: str = StateOpt,
         as_json: bool = JsonOpt):  # fmt: skip
    """One experiment: config diff, env check, correctness, samples, effects with intervals, ledger.

    Example: kinv show 3
    """
    from kinv.agent.report import render, views

    exp_id = _exp_id(exp_id)
    _emit(views.show(_store(state_dir), exp_id), as_json, render.show)


@app.command()
def export(ws: str = typer.Argument(..., help="workstream id"), csv: bool = typer.Option(False, "--csv",
           help="CSV instead of JSON"), state_dir: str = StateOpt,
           as_json: bool = typer.Option(False, "--json", help="JSON (the default), as every read command takes")):  # fmt: skip
    """Every per-level effect of a workstream's A/B experiments: change, interval, its coverage, verdict.

    Example: kinv export 3a --csv > 3a.csv
    Example: kinv export 3a --json
    """
    import json

    from kinv.agent.report import view_models, views

    if csv and as_json:
        raise Exit(EXIT_BAD_INPUT, "--csv and --json exclude each other: pick one (JSON is the default)")
    ws = _id(ws, "workstream id")
    rows = [r.model_dump() for r in views.export(_store(state_dir), ws)]
    if not csv:
        print(json.dumps(rows, indent=2))
        return
    import csv as csvmod

    w = csvmod.DictWriter(sys.stdout, fieldnames=list(view_models.EffectRow.model_fields), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)


@app.command()
def compare(exp_a: int = typer.Argument(..., help="experiment id"), exp_b: int = typer.Argument(..., help="experiment id"),
            state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Two A/B experiments' per-level effects side by side (replay vs live, last week vs today).

    Example: kinv compare 3 17
    """
    import json

    from kinv.agent.report import views

    exp_a, exp_b = _exp_id(exp_a), _exp_id(exp_b)
    rows = views.compare(_store(state_dir), exp_a, exp_b)
    if as_json:
        print(json.dumps([r.model_dump() for r in rows], indent=2))
        return

    def cell(r):
        if r is None or r.change is None:
            return "—"
        return f"{fmt.signed(r.change)} {fmt.interval(r.change_low, r.change_high)} {r.verdict}"

    from kinv.agent.tools.measure.stats import level_names

    common, short = level_names(r.level for r in rows)
    from kinv.agent.report.render import table

    t = table("level", f"#{exp_a}", f"#{exp_b}", "difference", "overlap",
              title=f"throughput change at {common}" if common else "throughput change")  # fmt: skip
    for r in rows:
        t.add_row(short[r.level], cell(r.a), cell(r.b), "—" if r.difference is None else fmt.signed(r.difference),
                  "—" if r.overlap is None else ("yes" if r.overlap else "NO"))
    _console().print(t)


@app.command()
def pending(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """Kernel edits waiting for a person, with their diffs.

    Example: kinv pending
    """
    from kinv.agent.report import render, views

    _emit(views.pending(_store(state_dir)), as_json, render.pending)


@app.command()
def history(ws: str = typer.Argument(..., help="workstream id"), state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """The graph nodes that ran for a workstream: step, node, time, outcome, decision.

    Example: kinv history 3a
    """
    from kinv.agent.report import render, views

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    _emit(views.history(store, views.resolve_ws(store, ws)), as_json, render.history)


@app.command()
def backups(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """Backups of kernel files taken before every patch.

    Example: kinv backups
    """
    from kinv.agent.report import render, views

    _emit(views.backups(_store(state_dir)), as_json, render.backups)


@app.command()
def report(ws: str = typer.Argument(..., help="workstream id"), out: Path = typer.Option(None, help="copy to PATH"),
           state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Print (or copy to --out) a workstream's close-out.

    Example: kinv report 3a --out closeout-3a.md
    """
    from kinv.agent.report import views

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    wsid = views.resolve_ws(store, ws)
    row = store.workstream(wsid)
    if not row.get("report_path") or not Path(row["report_path"]).exists():
        from kinv.agent.ids import continue_command

        raise Exit(EXIT_FAIL, f"{wsid} has no close-out yet (status {row['status']}); run: "
                              f"{continue_command(store, wsid, state_dir)}")  # fmt: skip
    text = Path(row["report_path"]).read_text()
    if as_json:  # the same content: the workstream, every experiment with its per-level effects, the Markdown
        _emit(views.report(store, wsid, text), True, None)
        return
    if out:
        import shutil

        try:
            out.write_text(text)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            raise Exit(EXIT_BAD_INPUT, f"--out {out}: cannot write it ({exc.strerror or exc}); name a file in a "
                                       "writable directory") from None  # fmt: skip
        png = Path(row["report_path"]).with_suffix(".png")
        if png.exists():
            shutil.copy(png, out.with_suffix(".png"))
        _console().print(f"close-out of {wsid} written to {out}")
    else:
        print(text)
