"""Commands that measure, check and mend: bench, noise, regress, kernels, env, adopt, doctor, revert."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from kinv.agent.cli.common import BACKEND_HELP, Exit, JsonOpt, StateOpt, _console, _id, _state_dir, _store, app
from kinv.agent.errors import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_OK, EXIT_REGRESSED, EXIT_UNDECIDED
from kinv.agent.words import BackendName

# --------------------------------------------------------------------------- #
# measuring
# --------------------------------------------------------------------------- #
PlanOpt = typer.Option(None, "--plan", show_default=False,
                       help="plan whose kernel, levels, environment and thresholds to use (default: the example plan "
                       "of the first registered kernel that names one: kinv kernels)")


@app.command()
def bench(
    plan: Path = PlanOpt,
    config: Path = typer.Option(None, help="config JSON to time (default: the kernel's live config)"),
    variant: str = typer.Option(None, help="A/B against the live config: tunable changes NAME=VALUE[,NAME=VALUE] "
                                         "(the plan kernel's tunables: kinv kernels)"),
    backend: BackendName = typer.Option(BackendName.AUTO, help=BACKEND_HELP),
    samples: int = typer.Option(5, min=1, max=1000, help="samples per level for a single config"),
    rounds: int = typer.Option(32, min=2, max=1000, help="max ABBA rounds for --variant"),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Time one config at the plan's levels (µs, GB/s, % of copy bandwidth, throughput), or A/B a variant.

    Example: kinv bench --plan plans/4a-expert-gemm-tiles.yaml --backend cuda
    Example: kinv bench --variant NAME=VALUE --backend replay   (NAME: a tunable of the plan's kernel)
    """
    from kinv.agent.workstream.commands import bench_command

    _state_dir(state_dir)
    raise Exit(EXIT_OK, bench_command(plan, config, variant, backend.value, samples, rounds, state_dir, as_json, _console()))


@app.command()
def profile(
    exp_id: int = typer.Argument(..., help="a decided A/B experiment of a config variant (kinv experiments WS)"),
    backend: BackendName = typer.Option(BackendName.AUTO, help=BACKEND_HELP),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Profile a decided variant and its baseline with Nsight Compute at the level of its largest effect, store the
    figures (registers, block limits, waves, DRAM throughput, occupancy, stalls) and say why the verdict went as
    it did.  Without ncu (or on replay without a recorded profile) it says so in one line.

    Example: kinv profile 7 --backend cuda
    """
    from kinv.agent.workstream.commands import profile_command

    _state_dir(state_dir)
    raise Exit(EXIT_OK, profile_command(exp_id, backend.value, state_dir, as_json, _console()))


@app.command()
def noise(
    plan: Path = PlanOpt,
    rounds: int = typer.Option(16, min=3, max=1000, help="A/A rounds (every worker in every round)"),
    workers: int = typer.Option(4, min=2, max=8, help="baseline workers: they measure the between-arm offset"),
    backend: BackendName = typer.Option(BackendName.AUTO, help=BACKEND_HELP),
    state_dir: str = StateOpt,
    as_json: bool = JsonOpt,
):
    """Characterize benchmark noise at the plan's levels: the live config timed by several workers against
    itself: round-to-round spread, between-worker offset, outliers, and whether the plan's thresholds are
    decidable.

    Example: kinv noise --backend replay --rounds 16 --workers 4
    """
    from kinv.agent.workstream.commands import noise_command

    _state_dir(state_dir)
    raise Exit(EXIT_OK, noise_command(plan, rounds, backend.value, state_dir, as_json, _console(), arms_n=workers))


#: how a comparison ended (agent/tools/runners/regress_prepare.py's OUTCOMES) -> the exit code kinv regress ends with
EXIT_OF_REGRESS = {"ok": EXIT_OK, "regressed": EXIT_REGRESSED, "undecided": EXIT_UNDECIDED, "failed": EXIT_FAIL}


def _out_file(path: Path | None, option: str) -> Path | None:
    """An output file a user named: its folder must exist, and it must not be a folder (refused before anything)."""
    if path is None or str(path) == "-":
        return path
    if path.is_dir():
        raise Exit(EXIT_BAD_INPUT, f"{option} {path} is a directory: name a file to write")
    if not path.parent.is_dir():
        raise Exit(EXIT_BAD_INPUT, f"{option} {path}: its folder {path.parent} does not exist")
    return path


def _budget(text: str | None) -> tuple[float | None, float | None]:
    if text is None:
        return None, None
    import re

    m = re.fullmatch(r"\s*([0-9]{1,6}(?:\.[0-9]+)?)\s*(?::\s*([0-9]{1,7}(?:\.[0-9]+)?)\s*)?", text)
    if not m or float(m.group(1)) <= 0 or (m.group(2) is not None and float(m.group(2)) <= 0):
        from kinv.agent.ids import shown

        raise Exit(EXIT_BAD_INPUT, f"--budget {shown(text, 40)} is not valid: give GPU_SECONDS or "
                                   "GPU_SECONDS:WALL_SECONDS, both positive (e.g. 600:3600)")  # fmt: skip
    return float(m.group(1)), float(m.group(2)) if m.group(2) else None


@app.command()
def regress(
    base: str = typer.Argument(None, help="the revision a change is judged against: a commit, branch or tag (main)",
                               show_default=False),
    head: str = typer.Argument(None, help="the revision judged (default: the working tree, uncommitted changes "
                               "included)", show_default=False),
    plan: Path = typer.Option(None, "--plan", show_default=False, help="judge the plan's kernel at its levels, "
                              "environment and margins (default: plans/regress/margins.yaml as BASE has it)"),
    kernel: list[str] = typer.Option(None, "--kernel", show_default=False, help="measure this kernel even when "
                                     "its files do not differ (a revision against itself); repeatable"),
    backend: BackendName = typer.Option(BackendName.AUTO, help=BACKEND_HELP),
    budget: str = typer.Option(None, "--budget", show_default=False, help="GPU_SECONDS[:WALL_SECONDS] the whole "
                               "comparison may spend (default: the plans' budgets); levels left undecided when it "
                               "runs out"),
    repo: Path = typer.Option(None, "--repo", show_default=False, help="the git checkout (default: the one the "
                              "working directory is in); it is read, never switched or written"),
    markdown: Path = typer.Option(None, "--markdown", show_default=False, help="write the PR comment (Markdown) "
                                  "to FILE"),
    json_file: Path = typer.Option(None, "--json", show_default=False, help="write the comparison as JSON to FILE "
                                   "(- for stdout)"),
    junit: Path = typer.Option(None, "--junit", show_default=False, help="write JUnit XML (a test case per kernel "
                               "and level) to FILE"),
    closeout_url: str = typer.Option(None, "--closeout-url", show_default=False, help="where the PR comment links "
                                     "the full close-out (a CI artifact's URL; default: its path in the state dir)"),
    sources_only: bool = typer.Option(False, "--kernel-sources-only", help="take only each kernel's source files "
                                      "and config from BASE, over HEAD's package (its adapter, reference and shared "
                                      "modules): for a BASE whose adapter predates today's harness"),
    history: str = typer.Option(None, "--history", show_default=False, help="list the stored verdicts of KERNEL "
                                "across revisions (dates, machines, the drift of the point estimates) instead"),
    state_dir: str = StateOpt,
):
    """Judge a kernel change between two git revisions with kinv's whole protocol: the correctness gate on both,
    the environment check, an A/A, paired ABBA rounds with sequential looks, margins fixed in advance.  Each
    revision runs from a snapshot of its own files; the checkout is never switched.  One verdict per kernel and
    level (improved, regressed, equivalent, undecided) with its interval; every comparison is stored.

    Exit: 0 nothing regressed beyond its margin, 4 a regression, 5 undecided within the budget, 2 bad input,
    1 a failed step.

    Example: kinv regress main HEAD --markdown comment.md --junit regress.xml
    Example: kinv regress --history mla_decode
    """
    from kinv.agent.report import regress as report
    from kinv.agent.tools.files import revisions
    from kinv.agent.tools.runners import regress as tool
    from kinv.agent.tools.runners.regress_prepare import prepare

    if history is not None:
        if base is not None or head is not None:
            raise Exit(EXIT_BAD_INPUT, "--history KERNEL lists stored verdicts: give no revisions with it")
        name = _id(history, "kernel name")
        rows, drifts = tool.history(_store(state_dir), name)
        _console().print("\n".join(report.history_text(name, rows, drifts)), markup=False, highlight=False)
        return
    if base is None:
        raise Exit(EXIT_BAD_INPUT, "name BASE, the revision to judge against (e.g. kinv regress main), or "
                                   "--history KERNEL")  # fmt: skip
    outs = {opt: _out_file(p, opt) for opt, p in (("--markdown", markdown), ("--json", json_file), ("--junit", junit))}
    limits = _budget(budget)
    kernels = [_id(k, "kernel name") for k in kernel] if kernel else None
    import sys
    import tempfile

    from kinv.agent.tools.runners import bench

    _state_dir(state_dir)
    root = revisions.repo_root(repo)
    be = bench.get_backend(backend.value)
    tmp = tempfile.TemporaryDirectory(prefix="kinv-regress-")  # the snapshots until the inputs are found valid
    try:
        prep = prepare(root, base, head, be, plan, kernels, Path(tmp.name), sources_only)
    except BaseException:
        tmp.cleanup()
        raise
    store = _store(state_dir, create=True)
    if hasattr(be, "log_dir"):  # a command's runs keep their whole output in this state dir
        be.log_dir = store.dir / "commands"
    to_stdout = outs["--json"] is not None and str(outs["--json"]) == "-"
    con = _console()
    said: list[str] = []

    def say(message: str) -> None:  # the first line is the backend's banner, once every input was found valid
        for m in ([be.loud] if not said else []) + [message]:
            said.append(m)
            if to_stdout:
                print(m, file=sys.stderr, flush=True)
            else:
                con.print(m, markup=False, highlight=False)

    try:
        comp = tool.run(store, prep, be, budget=limits, say=say)
    finally:
        tmp.cleanup()
    code = EXIT_OF_REGRESS[comp.outcome]
    where = store.dir / "regress" / str(comp.id)
    where.mkdir(parents=True, exist_ok=True)
    close_path = where / "closeout.md"
    close_path.write_text(report.closeout(comp, code))
    tool.finish(store, comp, code, str(close_path))
    link = closeout_url or str(close_path)
    if outs["--markdown"] is not None:
        outs["--markdown"].write_text(report.markdown(comp, link))
    if outs["--junit"] is not None:
        outs["--junit"].write_text(report.junit(comp, link))
    if outs["--json"] is not None:
        text = report.as_json(comp, link, code)
        if to_stdout:
            print(text)
        else:
            outs["--json"].write_text(text)
    if not to_stdout:
        con.print(report.markdown(comp, link), markup=False, highlight=False)
    raise Exit(code, f"kinv regress {comp.id}: {report.SAY[comp.outcome]} (exit {int(code)}); close-out {close_path}")


@app.command()
def kernels(as_json: bool = JsonOpt):
    """List the kernels kinv can investigate: their tunables, level dimensions and throughput unit.

    Example: kinv kernels --json
    """
    from kinv.agent.workstream.commands import kernels_command

    raise Exit(EXIT_OK, kernels_command(as_json, _console()))


@app.command()
def env(pid: int = typer.Option(None, help="check a live process's /proc/PID/environ"),
        plan: Path = typer.Option(None, show_default=False, help="plan whose environment is expected (default: "
                                  "the example plan of the first registered kernel that names one: kinv kernels)"),
        state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Check the plan's expected environment (its environment: section) against this shell or a live process.

    Example: kinv env --pid 12345 --plan plans/3a-attention-occupancy.yaml
    """
    from kinv.agent.ids import shown
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.backends.environ import proc_environ
    from kinv.agent.tools.measure import envcheck

    said = ""
    if plan is None:
        from kinv.kernels.adapter import default_plan

        plan, said = default_plan()
        said = f"; {said}"
    p, _ = load_plan(plan)
    if pid is None:
        seen = {k: os.environ.get(k) for k in p.environment}
        bad = envcheck.invalid_values(seen, p.adapter)  # a value no run of the kernel could use: bad input
        if bad:
            raise Exit(EXIT_BAD_INPUT, f"this shell has {bad[0]}")
        mism = envcheck.compare(p.environment, seen)
        if as_json:
            print(json.dumps({"source": "shell", "expected": p.environment, "seen": seen, "ok": not mism,
                              "mismatch": [m.var for m in mism]}, indent=2))  # fmt: skip
            raise Exit(EXIT_FAIL if mism else EXIT_OK, "")
        diff = "; ".join(f"{m.var}: expected {m.expected!r}, this shell has {shown(m.seen) if m.seen else 'it unset'}"
                         for m in mism)  # fmt: skip
        raise Exit(EXIT_FAIL if mism else EXIT_OK, (diff or f"this shell matches {p.environment}") + said)
    seen = proc_environ(pid)  # a bad pid is refused before the store is opened
    store = _store(state_dir, create=True)
    envcheck.check_pid(store, p.ws, pid, p.environment, seen=seen)
    if as_json:
        print(json.dumps({"source": f"pid {pid}", "expected": p.environment, "seen": p.environment, "ok": True,
                          "mismatch": []}, indent=2))  # fmt: skip
        return
    _console().print(f"pid {pid} sees {p.environment}: ok{said}")


@app.command()
def adopt(ws: str = typer.Argument(..., help="workstream id, e.g. 3b"),
          variant: str = typer.Argument(..., help="the variant to adopt, e.g. V1"),
          yes: bool = typer.Option(False, "--yes", help="write it (without: show the diff and message only)"),
          backend: BackendName = typer.Option(BackendName.AUTO, help="where the confirming A/B against the "
                                                   "live file runs, when the variant was measured against another"),
          state_dir: str = StateOpt, as_json: bool = JsonOpt):  # fmt: skip
    """Adopt a measured winner: its config (a mixed one's per-level overrides, or its source patch) written to
    the live kernel file as a journaled change, with a commit message that cites the comparison it rests on.

    When the variant was measured against another baseline than the live file, a confirming A/B against the
    live file runs first (the plan's levels and statistics), and the variant is written only where it won.

    Example: kinv adopt 3b V1 ; kinv adopt 3b V1 --yes
    """
    from kinv.agent.report import views
    from kinv.agent.tools.files import configs
    from kinv.agent.workstream import adopt as adopt_tool

    ws = _id(ws, "workstream id")
    store = _store(state_dir)
    wsid = views.resolve_ws(store, ws)
    say = None if as_json else (lambda m: _console().print(m, markup=False))  # --json: stderr is for the refusal
    a = adopt_tool.prepare(store, wsid, variant.strip(), backend=backend.value, progress=say)
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
    from kinv.agent.store.state import state_dir as resolve
    from kinv.agent.tools.files import doctor as doc

    _state_dir(state_dir)  # a file named as the state dir is bad input, not a healthy state
    found = doc.diagnose(resolve(state_dir))
    bad = any(f.status == "bad" for f in found)
    if as_json:
        print(json.dumps(doc.as_dicts(found), indent=2))
        raise Exit(EXIT_FAIL if bad else EXIT_OK, "")
    from kinv.agent.report.render import table

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
    from kinv.agent.store.state import state_dir as resolve
    from kinv.agent.tools.files import configs

    resolve(state_dir)  # a state dir that is a file is bad input, --to-plan or not
    if to_plan is not None and to_plan_baseline is not None:
        raise Exit(EXIT_BAD_INPUT, "--to-plan and --to-plan-baseline are two different ways back: give one")
    if to_plan is not None or to_plan_baseline is not None:
        from kinv.agent.store.state import state_dir as resolve
        from kinv.agent.workstream import commands

        raise Exit(EXIT_OK, commands.revert_to_plan(to_plan or to_plan_baseline, resolve(state_dir),
                                                     baseline=to_plan_baseline is not None))  # fmt: skip
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
    from kinv.agent.tools.files import doctor

    odd = [f for f in doctor.configs_against_baselines(store.workstreams(), None, store.patches()) if f.status != "ok"]
    if odd:
        for f in odd:
            _console().print(f"[yellow]warning[/yellow]: {escape(f.detail)}")
        raise Exit(EXIT_FAIL, "nothing in this state dir's journal to revert, but a live config is no known "
                              "baseline: restore its shipped bytes with kinv revert --to-plan PLAN (PLAN: any "
                              "plan of that kernel)")  # fmt: skip
    _console().print("nothing to revert: no kernel file is patched, and every live config is a known baseline")
