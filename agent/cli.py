"""kinv's command line: thin commands over the library.

Every domain error becomes one line and an exit code in one place
(:func:`main`): 2 for bad input, 1 for a failed investigation step,
3 when a run pauses for an approval.  Read commands never import torch,
triton or langgraph.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="kinv: kernel-optimization investigations with todo tracking, approvals and close-outs.\n\n"
                       "Example: kinv run plans/3a-attention-occupancy.yaml --approval auto")  # fmt: skip

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_PAUSED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP: state restored, resumable
def _state_dir_ok(value):
    """--state-dir naming a file is bad input for every command, refused before anything runs."""
    if value:
        from kinv.agent.store import state_dir

        state_dir(value)  # StateDirError (a ValueError): exit 2, one line
    return value


StateOpt = typer.Option(None, "--state-dir", callback=_state_dir_ok,
                        help="state directory (default ./state or $KINV_STATE_DIR)")
JsonOpt = typer.Option(False, "--json", help="print the documented JSON instead of tables")


class Exit(Exception):
    def __init__(self, code: int, message: str = ""):
        self.code, self.message = code, message


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("kinv")
        except PackageNotFoundError:
            v = "(not installed)"
        print(f"kinv {v}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print kinv's version and exit")):  # fmt: skip
    """kinv: kernel-optimization investigations with todo tracking, approvals and close-outs."""


def _console():
    from kinv.agent.render import console

    return console()  # a terminal's width; piped, wide: no line is wrapped or cut


def _state_dir(state_dir) -> Path:
    """The state dir a command names (--state-dir, else $KINV_STATE_DIR, else ./state), refused as bad input
    (exit 2, nothing created) when $KINV_STATE_DIR is set but empty or the path is something other than a
    directory.  Every command that takes --state-dir checks it here, before anything is opened."""
    from kinv.agent.ids import shown
    from kinv.agent.store import state_dir as resolve

    if state_dir is None and "KINV_STATE_DIR" in os.environ and not os.environ["KINV_STATE_DIR"].strip():
        raise Exit(EXIT_BAD_INPUT, "KINV_STATE_DIR is set but empty: unset it (the default is ./state) or name "
                                   "a directory")  # fmt: skip
    if state_dir is not None and not str(state_dir).strip():
        raise Exit(EXIT_BAD_INPUT, "--state-dir is empty: name a directory (the default is ./state)")
    path = resolve(state_dir)
    if path.exists() and not path.is_dir():
        raise Exit(EXIT_BAD_INPUT, f"state dir {shown(str(path), 200)} is a file, not a directory: name a directory "
                                   "(kinv creates it) with --state-dir or KINV_STATE_DIR")  # fmt: skip
    return path


def _store(state_dir, create=False):
    from kinv.agent.store import Store

    return Store(_state_dir(state_dir), create=create)


def _id(value: str, what: str) -> str:
    """An id from the command line: no whitespace or control characters, no 100 KB echoed back."""
    from kinv.agent.ids import check_id

    try:
        return check_id(value, what)
    except ValueError as exc:
        raise Exit(EXIT_BAD_INPUT, str(exc)) from None


def _exp_id(value: int) -> int:
    if not 0 < value < 1 << 63:
        raise Exit(EXIT_BAD_INPUT, f"experiment id {value if len(str(value)) <= 30 else str(value)[:30] + '...'} is "
                                   f"out of range: experiment ids are positive integers (kinv experiments WS lists them)")
    return value


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise Exit(EXIT_BAD_INPUT, f"--{what} {text!r} must be comma-separated integers, e.g. 1,8,32,64,96") from None
    if not vals or any(v < 1 or v > 1 << 20 for v in vals):
        raise Exit(EXIT_BAD_INPUT, f"--{what} {text!r} must list integers from 1 to {1 << 20}")
    return vals


# --------------------------------------------------------------------------- #
# run / resume / approvals
# --------------------------------------------------------------------------- #
@app.command()
def run(
    plan: Path = typer.Argument(..., help="workstream plan (YAML), e.g. plans/3a-attention-occupancy.yaml"),
    backend: str = typer.Option("auto", help="auto | cuda | replay"),
    approval: str = typer.Option("ask", help="ask | auto-config | auto"),
    new_version: bool = typer.Option(False, "--new-version", help="start the workstream again under this (changed) "
                                     "plan; the earlier version stays in history"),
    state_dir: str = StateOpt,
):
    """Run a workstream from its plan to its close-out (resumes where it stopped).

    Example: kinv run plans/3a-attention-occupancy.yaml --backend replay --approval auto
    Exit codes: 0 closed out, 3 paused for an approval, 2 bad input, 1 failed.
    """
    from kinv.agent.investigation import run_plan

    _state_dir(state_dir)
    raise Exit(*run_plan(str(plan), backend, approval, state_dir, _console(), new_version=new_version))


@app.command()
def campaign(
    plan: Path = typer.Argument(..., help="campaign plan (YAML with a campaign: section), e.g. plans/7-decode-ceiling.yaml"),
    backend: str = typer.Option("auto", help="auto | cuda | replay"),
    approval: str = typer.Option("ask", help="ask | auto-config | auto (auto also writes the final config)"),
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

    from kinv.agent import campaign as camp
    from kinv.agent.investigation import EXIT_OK as DONE

    _state_dir(state_dir)
    con = _console()
    quiet = io.StringIO()
    if as_json:
        from rich.console import Console

        con = Console(file=quiet, width=100)
    with contextlib.redirect_stdout(quiet) if as_json else contextlib.nullcontext():
        code, line, summary = camp.run(camp.Settings(str(plan), backend, approval, state_dir, con, executor=executor,
                                                     ray_address=ray_address, ray_actors=ray_actors))  # fmt: skip
    if as_json and summary:
        print(json.dumps({**summary, "exit": code, "message": line}, indent=2, default=str))
        raise Exit(code, "" if code == DONE else line)
    raise Exit(code, line)


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
    from kinv.agent import mcp_server
    from kinv.agent.store import state_dir as resolve

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
    backend: str = typer.Option("auto", help="auto | cuda | replay (a run continues on the backend it started "
                                             "with; another one is refused)"),
    approval: str = typer.Option(None, help="ask | auto-config | auto (default: the policy the run started with)"),
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
    from kinv.agent.investigation import run_plan

    raise Exit(*run_plan(row["plan_path"], backend, approval or row.get("approval") or "ask", state_dir, _console()))


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


# --------------------------------------------------------------------------- #
# measuring
# --------------------------------------------------------------------------- #
PlanOpt = typer.Option(Path("plans/3a-attention-occupancy.yaml"), "--plan",
                       help="plan whose kernel, levels, environment and thresholds to use")


@app.command()
def bench(
    plan: Path = PlanOpt,
    config: Path = typer.Option(None, help="config JSON to time (default: the kernel's live config)"),
    variant: str = typer.Option(None, help="A/B against the live config: tunable changes such as num_warps=8"),
    backend: str = typer.Option("auto", help="auto | cuda | replay"),
    samples: int = typer.Option(5, min=1, max=1000, help="samples per level for a single config"),
    rounds: int = typer.Option(32, min=2, max=1000, help="max ABBA rounds for --variant"),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Time one config at the plan's levels (µs, GB/s, % of copy bandwidth, throughput), or A/B a variant.

    Example: kinv bench --plan plans/4a-expert-gemm-tiles.yaml --backend cuda
    Example: kinv bench --variant num_warps=8 --backend replay
    """
    from kinv.agent.investigation import bench_command

    _state_dir(state_dir)
    raise Exit(*bench_command(plan, config, variant, backend, samples, rounds, state_dir, as_json, _console()))


@app.command()
def noise(
    plan: Path = PlanOpt,
    rounds: int = typer.Option(16, min=3, max=1000, help="A/A rounds (every worker in every round)"),
    workers: int = typer.Option(4, min=2, max=8, help="baseline workers: they measure the between-arm offset"),
    backend: str = typer.Option("auto", help="auto | cuda | replay"),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Characterize benchmark noise at the plan's levels: the live config timed by several workers against
    itself: round-to-round spread, between-worker offset, outliers, and whether the plan's thresholds are
    decidable.

    Example: kinv noise --backend replay --rounds 16 --workers 4
    """
    from kinv.agent.investigation import noise_command

    _state_dir(state_dir)
    raise Exit(*noise_command(plan, rounds, backend, state_dir, as_json, _console(), arms_n=workers))


@app.command()
def kernels(as_json: bool = JsonOpt):
    """List the kernels kinv can investigate: their tunables, level dimensions and throughput unit.

    Example: kinv kernels --json
    """
    from kinv.agent.investigation import kernels_command

    raise Exit(*kernels_command(as_json, _console()))


@app.command()
def env(pid: int = typer.Option(None, help="check a live process's /proc/PID/environ"),
        plan: Path = typer.Option(Path("plans/3a-attention-occupancy.yaml"), help="plan whose environment is expected"),
        state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Check the plan's expected environment (e.g. TARGET_CTAS=512) against a live process.

    Example: kinv env --pid 12345 --plan plans/3a-attention-occupancy.yaml
    """
    from kinv.agent.ids import shown
    from kinv.agent.models import load_plan
    from kinv.agent.tools import envcheck

    p, _ = load_plan(plan)
    if pid is None:
        seen = {k: os.environ.get(k) for k in p.environment}
        bad = envcheck.invalid_values(seen)  # a value no run could use (TARGET_CTAS=abc): bad input
        if bad:
            raise Exit(EXIT_BAD_INPUT, f"this shell has {bad[0]}")
        mism = envcheck.compare(p.environment, seen)
        if as_json:
            print(json.dumps({"source": "shell", "expected": p.environment, "seen": seen, "ok": not mism,
                              "mismatch": [m.var for m in mism]}, indent=2))  # fmt: skip
            raise Exit(EXIT_FAIL if mism else EXIT_OK, "")
        said = "; ".join(f"{m.var}: expected {m.expected!r}, this shell has {shown(m.seen) if m.seen else 'it unset'}"
                         for m in mism)  # fmt: skip
        raise Exit(EXIT_FAIL if mism else EXIT_OK, said or f"this shell matches {p.environment}")
    seen = envcheck.proc_environ(pid)  # a bad pid is refused before the store is opened
    store = _store(state_dir, create=True)
    envcheck.check_pid(store, p.ws, pid, p.environment, seen=seen)
    if as_json:
        print(json.dumps({"source": f"pid {pid}", "expected": p.environment, "seen": p.environment, "ok": True,
                          "mismatch": []}, indent=2))  # fmt: skip
        return
    _console().print(f"pid {pid} sees {p.environment}: ok")


@app.command()
def adopt(ws: str = typer.Argument(..., help="workstream id, e.g. 3b"),
          variant: str = typer.Argument(..., help="the variant to adopt, e.g. V1"),
          yes: bool = typer.Option(False, "--yes", help="write it (without: show the diff and message only)"),
          backend: str = typer.Option("auto", help="auto | cuda | replay: where the confirming A/B against the "
                                                   "live file runs, when the variant was measured against another"),
          state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Adopt a measured winner: its config (a mixed one's per-level overrides, or its source patch) written to
    the live kernel file as a journaled change, with a commit message that cites the comparison it rests on.

    When the variant was measured against another baseline than the live file, a confirming A/B against the
    live file runs first (the plan's levels and statistics), and the variant is written only where it won.

    Example: kinv adopt 3b V1 ; kinv adopt 3b V1 --yes
    """
    from kinv.agent import views
    from kinv.agent.tools import adopt as adopt_tool
    from kinv.agent.tools import bench, configs

    ws = _id(ws, "workstream id")
    if backend not in bench.BACKENDS:
        raise Exit(EXIT_BAD_INPUT, f"--backend {backend!r} is not valid; use {', '.join(bench.BACKENDS)}")
    store = _store(state_dir)
    wsid = views.resolve_ws(store, ws)
    say = None if as_json else (lambda m: _console().print(m, markup=False))  # --json: stderr is for the refusal
    a = adopt_tool.prepare(store, wsid, variant.strip(), backend=backend, progress=say)
    if not yes:
        if as_json:
            print(adopt_tool.as_json(a))
            return
        con = _console()
        from rich.markup import escape

        con.print(f"[bold]adopt {escape(wsid)} {escape(a.variant)}[/bold] into {escape(str(a.path))} ({a.kind}); "
                  "nothing is written yet")  # fmt: skip
        con.print(a.diff, markup=False, highlight=False)
        con.print("commit message:", style="bold")
        con.print(a.message, markup=False, highlight=False)
        raise Exit(EXIT_OK, f"review it, then write it: kinv adopt {wsid.lstrip('#')} {a.variant} --yes")
    kernel_lock = f"kernel:{store.workstream(wsid)['kernel']}"
    store.acquire_lock(kernel_lock, os.getpid())  # not while a run of this kernel is live
    try:
        with configs.ConfigFileLock(a.path, store.dir):
            done = adopt_tool.apply(store, a)
    finally:
        store.release_lock(kernel_lock, os.getpid())
    if as_json:
        print(json.dumps({**done, "written": True}, indent=2))
        return
    _console().print(a.diff, markup=False, highlight=False)
    rec = f"; its samples are the replay recording {done['recording']}" if done.get("recording") else ""
    raise Exit(EXIT_OK, f"adopted {wsid} {a.variant} into {done['path']} (journaled as patch #{done['patch']}; "
                        f"backup kept{rec}). Commit it: git commit -F {done['message_file']} {done['path']}"
                        + (f" {done['recording']}" if done.get("recording") else ""))  # fmt: skip


@app.command()
def doctor(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """What is wrong with a state dir and the kernels' live configs, and the command that mends each; reads only.

    Example: kinv doctor
    """
    from kinv.agent.store import state_dir as resolve
    from kinv.agent.tools import doctor as doc

    _state_dir(state_dir)  # a file named as the state dir is bad input, not a healthy state
    found = doc.diagnose(resolve(state_dir))
    bad = any(f.status == "bad" for f in found)
    if as_json:
        print(json.dumps(doc.as_dicts(found), indent=2))
        raise Exit(EXIT_FAIL if bad else EXIT_OK, "")
    from kinv.agent.render import table

    t = table("check", "", "finding", "fix", title=f"kinv doctor: {resolve(state_dir)}")
    from rich.text import Text

    mark = {"ok": Text("ok", "green"), "warn": Text("warn", "yellow"), "bad": Text("BAD", "red")}
    for f in found:
        t.add_row(f.check, mark[f.status], f.detail, f.fix)
    _console().print(t)
    raise Exit(EXIT_FAIL if bad else EXIT_OK, "")


@app.command()
def revert(state_dir: str = StateOpt,
           to_plan: Path = typer.Option(None, "--to-plan", help="restore the live config file of PLAN's kernel to "
                                        "its file of record (the shipped bytes of git HEAD, or kinv's kept copy "
                                        "of the bytes before its first write), verified by hash; needs no state "
                                        "dir (kinv.db lost or damaged)"),
           to_plan_baseline: Path = typer.Option(None, "--to-plan-baseline", help="write PLAN's measurement "
                                                 "baseline config into the live config file instead (only when "
                                                 "you want that config live, not the shipped one)")):  # fmt: skip
    """Revert every patched kernel file to its backup (what every start does anyway); with --to-plan,
    restore the kernel's shipped config file without any state; with --to-plan-baseline, write a plan's
    measurement baseline into it.

    Example: kinv revert
    Example: kinv revert --to-plan plans/3a-attention-occupancy.yaml
    Example: kinv revert --to-plan-baseline plans/3a-attention-occupancy.yaml
    """
    from kinv.agent.store import state_dir as resolve
    from kinv.agent.tools import configs

    resolve(state_dir)  # a state dir that is a file is bad input, --to-plan or not
    if to_plan is not None and to_plan_baseline is not None:
        raise Exit(EXIT_BAD_INPUT, "--to-plan and --to-plan-baseline are two different ways back: give one")
    if to_plan is not None or to_plan_baseline is not None:
        from kinv.agent import investigation
        from kinv.agent.store import state_dir as resolve

        code, msg = investigation.revert_to_plan(to_plan or to_plan_baseline, resolve(state_dir),
                                                 baseline=to_plan_baseline is not None)  # fmt: skip
        raise Exit(code, msg)
    store = _store(state_dir, create=True)
    live = [lk for lk in store.live_locks() if lk["pid"] != os.getpid()]
    if live:
        raise Exit(EXIT_FAIL, f"{live[0]['workstream']} is being run by pid {live[0]['pid']}: its patch is live; "
                              "stop that run first (its own exit reverts)")  # fmt: skip
    from rich.markup import escape

    done = configs.recover(store)
    for d in done:
        if d["action"].startswith("restored over a hand edit"):
            _console().print("[yellow]warning[/yellow]: " + escape(f"{Path(d['path']).name} {d['action']}"))
    if done:
        _console().print(f"reverted {len(done)} patch(es)")
        return
    # the journal has nothing: still, a live config that is no known baseline (kinv.db lost during a variant,
    # a hand edit) must not pass as "nothing to revert"
    from kinv.agent.tools import doctor

    odd = [f for f in doctor.configs_against_baselines(store.workstreams(), None, store.patches()) if f.status != "ok"]
    if odd:
        for f in odd:
            _console().print(f"[yellow]warning[/yellow]: {escape(f.detail)}")
        raise Exit(EXIT_FAIL, "nothing in this state dir's journal to revert, but a live config is no known "
                              "baseline: restore its shipped bytes with kinv revert --to-plan PLAN (PLAN: any "
                              "plan of that kernel)")  # fmt: skip
    _console().print("nothing to revert: no kernel file is patched, and every live config is a known baseline")


# --------------------------------------------------------------------------- #
# read commands (no torch, triton or langgraph)
# --------------------------------------------------------------------------- #
def _emit(model, as_json: bool, render) -> None:
    if as_json:
        from pydantic import BaseModel

        if isinstance(model, list):
            print(json.dumps([m.model_dump(mode="json") if isinstance(m, BaseModel) else m for m in model], indent=2))
        else:
            print(model.model_dump_json(indent=2))
        return
    render(_console(), model)


@app.command()
def status(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """Every workstream: its todos as a tree, approvals waiting, latest verdicts, recommendation.

    Example: kinv status --json
    """
    from kinv.agent import render, views

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
    from kinv.agent import render, views

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    items = views.todos(store, views.resolve_ws(store, ws))
    if fmt == "kinv":
        _emit(items, as_json, render.todos)
    else:  # wrapped as both tools' todo writers take it: {"todos": [...]}
        from kinv.agent import todo_export

        print(json.dumps({"todos": todo_export.export_todos(items, fmt)}, indent=2))


@app.command()
def experiments(ws: str = typer.Argument(..., help="workstream id"), state_dir: str = StateOpt,
                as_json: bool = JsonOpt):  # fmt: skip
    """A workstream's experiments: variant, verdict, rounds, GPU time.

    Example: kinv experiments 3a
    """
    from kinv.agent import render, views

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    _emit(views.experiments(store, views.resolve_ws(store, ws)), as_json, render.experiments)


@app.command()
def show(exp_id: int = typer.Argument(..., help="experiment id (kinv experiments WS)"), state_dir: str = StateOpt,
         as_json: bool = JsonOpt):  # fmt: skip
    """One experiment: config diff, env check, correctness, samples, effects with intervals, ledger.

    Example: kinv show 3
    """
    from kinv.agent import render, views

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

    from kinv.agent import views

    if csv and as_json:
        raise Exit(EXIT_BAD_INPUT, "--csv and --json exclude each other: pick one (JSON is the default)")
    ws = _id(ws, "workstream id")
    rows = [r.model_dump() for r in views.export(_store(state_dir), ws)]
    if not csv:
        print(json.dumps(rows, indent=2))
        return
    import csv as csvmod

    w = csvmod.DictWriter(sys.stdout, fieldnames=list(views.EffectRow.model_fields), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)


@app.command()
def compare(exp_a: int = typer.Argument(..., help="experiment id"), exp_b: int = typer.Argument(..., help="experiment id"),
            state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Two A/B experiments' per-level effects side by side (replay vs live, last week vs today).

    Example: kinv compare 3 17
    """
    import json

    from kinv.agent import views

    exp_a, exp_b = _exp_id(exp_a), _exp_id(exp_b)
    rows = views.compare(_store(state_dir), exp_a, exp_b)
    if as_json:
        print(json.dumps([r.model_dump() for r in rows], indent=2))
        return

    def cell(r):
        if r is None or r.change is None:
            return "—"
        return f"{r.change:+.2%} [{r.change_low:+.2%}, {r.change_high:+.2%}] {r.verdict}"

    from kinv.agent.stats import level_names

    common, short = level_names(r.level for r in rows)
    from kinv.agent.render import table

    t = table("level", f"#{exp_a}", f"#{exp_b}", "difference", "overlap",
              title=f"throughput change at {common}" if common else "throughput change")  # fmt: skip
    for r in rows:
        t.add_row(short[r.level], cell(r.a), cell(r.b), "—" if r.difference is None else f"{r.difference:+.2%}",
                  "—" if r.overlap is None else ("yes" if r.overlap else "NO"))
    _console().print(t)


@app.command()
def pending(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """Kernel edits waiting for a person, with their diffs.

    Example: kinv pending
    """
    from kinv.agent import render, views

    _emit(views.pending(_store(state_dir)), as_json, render.pending)


@app.command()
def history(ws: str = typer.Argument(..., help="workstream id"), state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """The graph nodes that ran for a workstream: step, node, time, outcome, decision.

    Example: kinv history 3a
    """
    from kinv.agent import render, views

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    _emit(views.history(store, views.resolve_ws(store, ws)), as_json, render.history)


@app.command()
def backups(state_dir: str = StateOpt, as_json: bool = JsonOpt):
    """Backups of kernel files taken before every patch.

    Example: kinv backups
    """
    from kinv.agent import render, views

    _emit(views.backups(_store(state_dir)), as_json, render.backups)


@app.command()
def report(ws: str = typer.Argument(..., help="workstream id"), out: Path = typer.Option(None, help="copy to PATH"),
           state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Print (or copy to --out) a workstream's close-out.

    Example: kinv report 3a --out closeout-3a.md
    """
    from kinv.agent import views

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

        out.write_text(text)
        png = Path(row["report_path"]).with_suffix(".png")
        if png.exists():
            shutil.copy(png, out.with_suffix(".png"))
        _console().print(f"close-out of {wsid} written to {out}")
    else:
        print(text)


# --------------------------------------------------------------------------- #
_ARGV: list[str] | None = None


def main(argv=None) -> int:
    """Entry point: one line and an exit code for every domain error, never a traceback."""
    global _ARGV
    _ARGV = None if argv is None else list(argv)
    try:
        app(args=argv, standalone_mode=False)
        return EXIT_OK
    except Exit as e:
        if e.message:
            (print if e.code == EXIT_OK else _err)(e.message)
        return e.code
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # click usage errors, domain errors of the tools
        import click

        # typer >= 0.2x raises its own vendored click's exceptions (typer.TyperException, typer.Exit,
        # typer.Abort), which are not click's: check both, or every usage error would exit 1
        if isinstance(e, click.exceptions.Exit | typer.Exit):
            return e.exit_code
        if type(e).__name__ == "NoArgsIsHelpError" and getattr(e, "ctx", None) is not None:
            print(e.ctx.get_help())  # `kinv` alone lists the commands
            return EXIT_OK
        if isinstance(e, click.ClickException) or (isinstance(e, typer.TyperException)
                                                   and hasattr(e, "format_message")):  # fmt: skip
            _err((e.format_message().splitlines() or [type(e).__name__])[0])
            return EXIT_BAD_INPUT
        if isinstance(e, click.exceptions.Abort | typer.Abort):
            _err("aborted")
            return EXIT_FAIL
        from kinv.kernels.errors import BadInput

        # bad input is one type (unknown ids, kernels, devices, formats, patches, a missing recording, no
        # GPU for --backend cuda); a failed step is named by its class; any other exception, a ValueError
        # included, is a bug: an internal error with its traceback in the log.
        bad_input = isinstance(e, BadInput)
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
        if os.environ.get("KINV_DEBUG"):
            raise
        if bad_input or _expected_failure(e):
            _err(line)
        elif _db_failure(e):
            _err(_db_failure(e))
        else:  # a bug: one line here, the whole traceback in a log a person can attach to an issue
            _err(f"internal error: {type(e).__name__}: {line}; traceback in {_log_traceback(e)}")
        return EXIT_BAD_INPUT if bad_input else EXIT_FAIL


_STEP_FAILURES = {"InvestigationError", "HarnessBroken", "StoreError", "BackendError", "LockedElsewhere",
                  "RevertError", "EnvMismatch", "LockHeld", "Unreadable", "NotFound", "OSError"}


def _expected_failure(e: BaseException) -> bool:
    """A step that failed for a reason kinv names (a broken harness, an env mismatch, a lock held, ...).
    Matched by class name along the MRO, so a read command's error path imports nothing heavy."""
    return any(c.__name__ in _STEP_FAILURES for c in type(e).__mro__)


def _log_traceback(e: BaseException) -> str:
    import tempfile
    import time
    import traceback

    path = _state_dir_arg() or Path(os.environ.get("KINV_STATE_DIR") or "state")
    path = path / "kinv-errors.log" if path.is_dir() else Path(tempfile.gettempdir()) / "kinv-errors.log"
    try:
        with open(path, "a") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())} kinv {' '.join(sys.argv[1:])}\n")
            fh.write("".join(traceback.format_exception(e)))
    except OSError:
        return "(the log could not be written; set KINV_DEBUG=1 to see the traceback)"
    return str(path)


def _state_dir_arg() -> Path | None:
    """The --state-dir the command line gave (the error log goes there, as everything else of the run)."""
    args = sys.argv[1:] if _ARGV is None else _ARGV
    for i, a in enumerate(args):
        if a == "--state-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--state-dir="):
            return Path(a.split("=", 1)[1])
    return None


def _db_failure(e: BaseException) -> str | None:
    """One line for SQLite's own failures that escaped the store's open checks: a full or failing disk, a
    database damaged mid-run.  Names the state dir and what to do."""
    import sqlite3

    if not isinstance(e, sqlite3.DatabaseError):
        return None
    from kinv.agent.store import state_dir

    where = state_dir(_state_dir_arg())
    msg = str(e)
    if "full" in msg or "disk I/O" in msg:
        return (f"cannot write the kinv state in {where}: the disk is full or failing ({msg}); free space there and "
                "run again (what was recorded before is kept)")  # fmt: skip
    if "malformed" in msg or "not a database" in msg:
        return f"a database in {where} is damaged ({msg}): kinv doctor names it and the way back"
    return None


def _err(msg: str) -> None:
    print(f"kinv: {msg}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
