"""Commands that run things: run, check, campaign, mcp, resume, approve, reject."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from kinv.agent.cli.common import (
    APPROVAL_HELP,
    BACKEND_HELP,
    Exit,
    JsonOpt,
    StateOpt,
    _console,
    _ended,
    _id,
    _state_dir,
    _store,
    app,
)
from kinv.agent.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_OK
from kinv.agent.words import Approval, BackendName


# --------------------------------------------------------------------------- #
# run / resume / approvals
# --------------------------------------------------------------------------- #
@app.command()
def run(
    plans: list[Path] = typer.Argument(..., help="workstream plan(s) (YAML), e.g. plans/3a-attention-occupancy.yaml; "
                                       "several run at once, each on its own GPU"),
    backend: BackendName = typer.Option(BackendName.AUTO, help=BACKEND_HELP),
    approval: Approval = typer.Option(Approval.ASK, help=APPROVAL_HELP),
    new_version: bool = typer.Option(False, "--new-version", help="start the workstream again under this (changed) "
                                     "plan; the earlier version stays in history"),
    state_dir: str = StateOpt,
):
    """Run a workstream from its plan to its close-out (resumes where it stopped).  Several plans run at once:
    each workstream in its own process on its own GPU (plans of one kernel one after another, since they
    patch one live file); on replay, in CPU processes.

    Example: kinv run plans/3a-attention-occupancy.yaml --backend replay --approval auto
    Exit codes: 0 closed out, 3 paused for an approval, 2 bad input, 1 failed.
    """
    from kinv.agent.plan_file import load_plan

    sd = _state_dir(state_dir)
    loaded = [(str(p), load_plan(str(p))[0]) for p in plans]  # a bad plan is refused in one line, nothing runs
    if len(loaded) > 1:
        _run_many(loaded, backend.value, approval.value, sd, new_version)
    from kinv.agent.workstream.investigation import run_plan

    out = run_plan(str(plans[0]), backend.value, approval.value, state_dir, _console(), new_version=new_version)
    raise _ended(out)  # a refusal or a failed step is raised, and main maps it


def _run_many(loaded: list, backend: str, approval: str, sd: Path, new_version: bool) -> None:
    """Several plans at once (agent/tools/runners/placement.py); raises the command's Exit."""
    from kinv.agent.report import render
    from kinv.agent.tools.runners import placement

    rows = placement.group(loaded)
    if backend == "cuda":
        live = True
    elif backend == "auto":
        live = bool(placement.visible_gpus())
    else:
        live = False
    groups = len({r.group for r in rows})
    slots = placement.places(groups, live)
    argv = ["--backend", backend if backend != "auto" else ("cuda" if live else "replay"), "--approval", approval,
            "--state-dir", str(sd)] + (["--new-version"] if new_version else [])  # fmt: skip
    con = _console()
    where = f"GPU {', '.join(slots)}" if live else f"{len(slots)} CPU process(es) (replay)"
    con.print(f"{len(rows)} workstreams in {groups} group(s) (one per kernel) on {where}")
    t0 = time.time()
    placement.run_all(rows, slots, argv, sd, say=con.print)
    wall = time.time() - t0
    con.print(render.placed_table(rows))
    code = placement.exit_code(rows)
    serial = sum(r.wall_s for r in rows)
    ended = ", ".join(f"{r.ws} exit {r.exit_code}" for r in rows)
    raise Exit(code, f"{len(rows)} workstreams in {wall:.1f} s wall (their own times add up to {serial:.1f} s): {ended}; "
                     f"logs in {sd / 'runs'}")  # fmt: skip


@app.command()
def check(
    plan: Path = typer.Argument(..., help="workstream plan (YAML), e.g. examples/quick_matmul/plan.yaml"),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Check a plan without timing anything, on any machine: validate it, resolve every arm's config at every
    level, run the correctness gate of the baseline and every variant (on CPU in the Triton interpreter), show each
    edit as its approval would, predict resources, and write a close-out skeleton that says nothing was timed.
    Needs no GPU and no recording: the first step for a new plugin.

    Example: kinv check examples/quick_matmul/plan.yaml
    Exit codes: 0 every arm would run, 1 a gate failed (the line names the variant and the level), 2 bad input.
    """
    from kinv.agent.report import render
    from kinv.agent.workstream.check import check_plan, write_report

    sd = _state_dir(state_dir)
    con = _console()
    say = (lambda _m: None) if as_json else (lambda m: con.print(m, markup=False, highlight=False))
    out = check_plan(str(plan), say=say)
    report = write_report(out, sd)
    if as_json:
        import dataclasses

        print(json.dumps({**dataclasses.asdict(out), "ok": out.ok, "report": str(report),
                          "timed": False}, indent=2, default=str))  # fmt: skip
    else:
        render.check(con, out)
    if not out.ok:
        raise Exit(EXIT_FAIL, f"{plan}: a gate failed: {'; '.join(out.failures())} (nothing was timed; "
                              f"skeleton in {report})")  # fmt: skip
    raise Exit(EXIT_OK, f"{plan}: every arm would run ({len(out.arms)} arm(s), gate on {out.device}); nothing was "
                        f"timed; close-out skeleton in {report}")  # fmt: skip


@app.command()
def campaign(
    plan: Path = typer.Argument(..., help="campaign plan (YAML with a campaign: section), e.g. plans/7-decode-ceiling.yaml"),
    backend: BackendName = typer.Option(BackendName.AUTO, help=BACKEND_HELP),
    approval: Approval = typer.Option(Approval.ASK, help=APPROVAL_HELP + " (auto also writes the final config)"),
    executor: str = typer.Option("local", help="local | ray: where screening shards run (ray: one actor per GPU)"),
    ray_address: str = typer.Option(None, "--ray-address", help="an existing Ray cluster (default: start one here)"),
    ray_actors: int = typer.Option(None, "--ray-actors", help="actors (default: one per GPU; replay: 2 CPU actors)"),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Run a campaign: kinv chains workstreams on its own (screen candidates with Optuna, confirm finalists
    with the full A/B, adopt confirmed wins) until the goal, the budget or the backlog is spent, then proposes
    one config through the approval gate.  Run it again to resume.

    Example: kinv campaign plans/7-decode-ceiling.yaml --backend replay --approval auto
    Exit codes: 0 done, 3 paused for an approval, 2 bad input, 1 failed.
    """
    import contextlib
    import io

    from kinv.agent.campaign import driver as camp

    _state_dir(state_dir)
    con = _console()
    quiet = io.StringIO()
    if as_json:
        from rich.console import Console

        con = Console(file=quiet, width=100)
    with contextlib.redirect_stdout(quiet) if as_json else contextlib.nullcontext():
        out = camp.run(camp.Settings(str(plan), backend.value, approval.value, state_dir, con, executor=executor,
                                     ray_address=ray_address, ray_actors=ray_actors))  # fmt: skip
    end = _ended(out)
    if as_json and out.summary:
        print(json.dumps({**out.summary, "exit": end.exit_code, "message": out.message}, indent=2, default=str))
        raise Exit(end.exit_code, "" if end.exit_code == EXIT_OK else out.message)
    raise end


@app.command()
def mcp(
    allow_approve: bool = typer.Option(False, "--allow-approve", help="expose approve/reject to the agent (by default "
                                       "only a person approves, in the CLI)"),
    print_config: str = typer.Option(None, "--print-config", help="print the registration for a client: claude "
                                     "(.mcp.json) or opencode (opencode.json) and exit"),
    state_dir: str = StateOpt,
):
    """Serve kinv to a coding agent over MCP (stdio): read tools, background runs and campaigns, plans proposed by the
    agent, close-outs as resources.  Kernel edits still wait for a person unless --allow-approve.

    Example: kinv mcp --print-config claude > .mcp.json
    """
    from kinv.agent.cli import mcp_server
    from kinv.agent.store.state import state_dir as resolve

    resolve(state_dir)  # a state dir that is a file is bad input here too
    if print_config is not None:
        print(mcp_server.print_config(print_config, state_dir))
        return
    try:
        import mcp as _sdk  # noqa: F401
    except ImportError:
        raise Exit(EXIT_FAIL, "the mcp SDK is not installed: pip install -e '.[mcp]'") from None
    mcp_server.serve(state_dir, allow_approve)


@app.command()
def resume(
    ws: str = typer.Argument(..., help="workstream id, e.g. 3a or #3a"),
    backend: BackendName = typer.Option(BackendName.AUTO, help="a run continues on the backend it started with; another "
                                                              "one is refused"),
    approval: Approval = typer.Option(None, help=APPROVAL_HELP + " (default: the policy the run started with)"),
    state_dir: str = StateOpt,
):
    """Continue a paused, interrupted or killed workstream from its last checkpoint, under the approval policy
    it was started with unless --approval says otherwise.

    Example: kinv resume 3a
    """
    from kinv.agent.ids import norm_ws, shown

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    row = store.workstream(norm_ws(ws))
    if row is None:
        known = ", ".join(w["id"] for w in store.workstreams()) or "none"
        raise Exit(EXIT_BAD_INPUT, f"unknown workstream {shown(norm_ws(ws))}; known: {known}")
    from kinv.agent.workstream.investigation import run_plan

    policy = approval.value if approval else row.get("approval") or Approval.ASK.value
    out = run_plan(row["plan_path"], backend.value, policy, state_dir, _console())
    raise _ended(out)


def _decide(approval_id: str, status: str, reason: str, state_dir) -> None:
    approval_id = _id(approval_id, "approval id")
    store = _store(state_dir)
    row = store.approval(approval_id)
    if row is None:
        pend = ", ".join(a["id"] for a in store.approvals(status="pending")) or "none"
        raise Exit(EXIT_BAD_INPUT, f"unknown approval {approval_id!r}; pending: {pend}")
    if row["status"] != "pending":
        raise Exit(EXIT_BAD_INPUT, f"approval {approval_id} is already {row['status']}; a decision is final")
    if not store.decide_approval(approval_id, status, reason):
        now = store.approval(approval_id) or {}
        raise Exit(EXIT_BAD_INPUT, f"approval {approval_id} was already {now.get('status')} (decided first elsewhere); "
                                   "a decision is final")  # fmt: skip
    from kinv.agent.ids import continue_command

    _console().print(f"{approval_id} {status}. Continue with: {continue_command(store, row['workstream'], state_dir)}",
                     markup=False, highlight=False)


@app.command()
def approve(approval_id: str = typer.Argument(..., help="pending approval id (kinv pending)"), state_dir: str = StateOpt):
    """Approve a pending kernel edit; then `kinv resume WS` continues.

    Example: kinv approve 3a-V1-2
    """
    _decide(approval_id, "approved", "", state_dir)


@app.command()
def reject(
    approval_id: str = typer.Argument(..., help="pending approval id (kinv pending)"),
    reason: str = typer.Option(..., "--reason", help="why the edit is rejected (recorded)"),
    state_dir: str = StateOpt,
):
    """Reject a pending kernel edit with a reason; the variant is cancelled.

    Example: kinv reject 3a-V2-3 --reason "V2 needs 81 KB smem on our sm_120 fleet"
    """
    if not reason.strip():
        raise Exit(EXIT_BAD_INPUT, "--reason is empty: say why the edit is rejected (it is recorded in the close-out)")
    _decide(approval_id, "rejected", reason.strip(), state_dir)
