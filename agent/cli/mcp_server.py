"""`kinv mcp`: kinv as a Model Context Protocol server for coding agents (Claude Code, opencode).

Built on the official Python SDK (the ``mcp`` package, major version 1), its high-level ``FastMCP`` API over
stdio: tools declared with ``@server.tool()`` get a JSON schema from their type hints and return kinv's own
pydantic view models, so a tool's structured output is what ``kinv ... --json`` prints.

* Read tools (status, todos, experiments, show, history, pending, report, kernels) answer in-process from
  kinv.db; they import neither torch nor LangGraph.
* Act tools start ``kinv run`` / ``resume`` / ``campaign`` as separate processes (each holds its workstream's
  lock, exactly as from a terminal) and return at once with the workstream id and any approval waiting;
  progress is read through ``status``.  ``bench`` and ``noise`` run the CLI in a subprocess the server awaits
  without blocking.  ``propose_plan`` validates a plan the agent wrote and stores it under plans/.
* ``approve`` / ``reject`` exist only when the server is started with ``--allow-approve``: by default a person
  approves in the CLI, so an agent cannot approve its own kernel edit.  ``pending`` always shows what waits.
* Resources: close-outs (``kinv://closeout/{ws}`` Markdown, ``kinv://closeout/{ws}/png`` the figure) and plans
  (``kinv://plan/{name}``).
* Safety: stdio only; every path a tool takes must lie inside the project or the state dir; nothing evaluates
  its input; errors are tool errors carrying the CLI's one-line message.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from kinv.agent.errors import NotFound
from kinv.agent.report import views  # the tools' return types: FastMCP reads them from the module's globals
from kinv.agent.words import Approval, BackendName
from kinv.kernels.errors import BadInput

# the tools' choices, from the enums (FastMCP reads annotations from the module's globals): a JSON-schema enum
BackendChoice = Literal[tuple(m.value for m in BackendName)]
ApprovalChoice = Literal[tuple(m.value for m in Approval)]

PLAN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}")
CLIENTS = ("claude", "opencode")


def print_config(client: str, state_dir: str | None) -> str:
    """The one-line registration of `kinv mcp` for a client's config file."""
    args = ["mcp"] + (["--state-dir", state_dir] if state_dir else [])
    if client == "claude":  # .mcp.json at the project root
        return json.dumps({"mcpServers": {"kinv": {"command": "kinv", "args": args}}}, indent=2)
    if client == "opencode":  # opencode.json: the mcp section, a local (stdio) server
        return json.dumps({"$schema": "https://opencode.ai/config.json",
                           "mcp": {"kinv": {"type": "local", "command": ["kinv", *args], "enabled": True}}},
                          indent=2)  # fmt: skip
    raise BadInput(f"--print-config {client!r} is not a client kinv knows; use {' or '.join(CLIENTS)}")


def build(state_dir: str | None = None, project: str | None = None, allow_approve: bool = False):
    """The FastMCP server (not started): tools, resources, and the paths it may touch."""
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError

    from kinv.agent.store.db import Store
    from kinv.agent.store.state import state_dir as default_state_dir

    root = Path(project or os.getcwd()).resolve()
    sdir = Path(state_dir).resolve() if state_dir else default_state_dir(None).resolve()
    server = FastMCP("kinv", log_level="WARNING", instructions=(
        "kinv tests GPU-kernel optimization ideas properly: a plan (hypothesis, variants), noise measured, "
        "baseline and variant timed side by side, a decision with statistics, a close-out. Start work with run "
        "or campaign, watch it with status and pending, read results with report and the closeout resources. "
        "Kernel edits wait for a person's approval unless the server was started with --allow-approve."))  # fmt: skip

    def store(create: bool = False) -> Store:
        return Store(sdir, create=create)

    def fail(exc: BaseException) -> ToolError:
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return ToolError(line)

    def read(fn):
        """Run a read view; kinv's one-line errors become tool errors."""
        try:
            return fn()
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - NotFound, StateDamaged, StoreError...: the CLI's one line
            raise fail(exc) from None

    def inside(p: str, what: str = "path") -> Path:
        """A path the agent named, resolved; refused unless it lies in the project or the state dir."""
        if not isinstance(p, str) or not p or "\x00" in p:
            raise ToolError(f"{what} must be a non-empty path")
        path = Path(p)
        path = (path if path.is_absolute() else root / path).resolve()
        if not (path.is_relative_to(root) or path.is_relative_to(sdir)):
            raise ToolError(f"{what} {p!r} lies outside the project ({root}) and the state dir ({sdir})")
        return path

    def plan_file(p: str) -> Path:
        path = inside(p, "plan")
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            raise ToolError(f"plan {p!r} is not a YAML file in the project (plans live in plans/, e.g. "
                            "plans/3a-attention-occupancy.yaml)")  # fmt: skip
        return path

    def plan_args(p: str | None) -> list[str]:
        """``--plan PATH`` for a plan the agent named; none without one (kinv picks a registered kernel's example)."""
        return [] if p is None else ["--plan", str(plan_file(p))]

    def checked_plan(plan: str, backend: str, approval: str):
        """(path, Plan, hash) of a plan the agent named, with the backend and approval policy checked."""
        from kinv.agent.errors import PlanError
        from kinv.agent.plan import load_plan

        path = plan_file(plan)
        choice(backend, tuple(BackendName), "backend")
        choice(approval, tuple(Approval), "approval")
        try:
            return (path, *load_plan(path))
        except PlanError as exc:
            raise fail(exc) from None

    def choice(value: str, valid: tuple[str, ...], what: str) -> str:
        if value not in valid:
            raise ToolError(f"{what} {value!r} is not valid; use {', '.join(valid)}")
        return value

    def spawn(args: list[str], label: str) -> dict[str, Any]:
        """A kinv command as its own process, detached from the server; its output goes to a log file."""
        logs = sdir / "mcp-runs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        with open(log, "wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", *args, "--state-dir", str(sdir)],
                                 cwd=root, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # fmt: skip
        # reap it when it ends (no zombie outlives its run while the server keeps going)
        threading.Thread(target=p.wait, daemon=True, name=f"kinv-reap-{p.pid}").start()
        return {"pid": p.pid, "log": str(log)}

    async def cli_json(args: list[str], timeout: float) -> Any:
        """Await ``kinv ARGS --json`` in a subprocess (the server keeps answering meanwhile)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kinv.agent.cli.app", *args, "--state-dir", str(sdir), "--json", cwd=root,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            raise ToolError(f"kinv {args[0]} took longer than {timeout:.0f} s; run it from a terminal") from None
        if proc.returncode != 0:
            line = (err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise ToolError(line.removeprefix("kinv: "))
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            raise ToolError(f"kinv {args[0]} printed no JSON") from None

    def waiting(ws: str | None) -> list[views.ApprovalView]:
        try:
            return [a for a in views.pending(store()) if ws is None or a.workstream == ws]
        except Exception:  # noqa: BLE001 - a fresh state dir has no kinv.db yet
            return []

    # ---- read tools -------------------------------------------------------------------------
    @server.tool()
    def status() -> views.StatusView:
        """Every campaign and workstream: todos, approvals waiting, latest verdicts, recommendation (kinv status --json)."""
        return read(lambda: views.status(store()))

    @server.tool()
    def todos(ws: str, format: Literal["kinv", "opencode", "claude"] = "kinv") -> dict[str, Any]:
        """A workstream's todo list (kinv todos WS --json, as {"result": [...]}); format opencode or claude gives
        the {"todos": [...]} their todo writers take."""
        from kinv.agent.report import todo_export

        def go():
            s = store()
            items = views.todos(s, views.resolve_ws(s, ws))
            if format == "kinv":  # the CLI prints the list itself; a tool's list comes as {"result": [...]}
                return {"result": [t.model_dump(mode="json") for t in items]}
            return {"todos": todo_export.export_todos(items, format)}

        return read(go)

    @server.tool()
    def experiments(ws: str) -> list[views.ExperimentView]:
        """A workstream's experiments with their sample counts (kinv experiments WS --json)."""
        return read(lambda: views.experiments(store(), views.resolve_ws(store(), ws)))

    @server.tool()
    def show(experiment: int) -> views.ShowView:
        """One experiment: diff, checks, per-level samples, effects and ledger (kinv show ID --json)."""
        return read(lambda: views.show(store(), experiment))

    @server.tool()
    def history(ws: str) -> list[views.HistoryItem]:
        """Every graph node that ran for a workstream: step, outcome, decision (kinv history WS --json)."""
        return read(lambda: views.history(store(), views.resolve_ws(store(), ws)))

    @server.tool()
    def pending() -> list[views.ApprovalView]:
        """Kernel edits (and campaign adoptions) waiting for a person's approval (kinv pending --json)."""
        return read(lambda: views.pending(store()))

    @server.tool()
    def report(ws: str) -> views.ReportView:
        """A workstream's close-out: every experiment with its per-level effects, and the Markdown (kinv report WS
        --json)."""

        def go():
            s = store()
            wsid = views.resolve_ws(s, ws)
            row = s.workstream(wsid)
            if not row.get("report_path") or not Path(row["report_path"]).exists():
                raise ToolError(f"{wsid} has no close-out yet (status {row['status']}); resume it")
            return views.report(s, wsid, Path(row["report_path"]).read_text())

        return read(go)

    @server.tool()
    def kernels() -> list[dict[str, Any]]:
        """The kernels kinv can investigate: tunables, level dimensions, throughput unit (kinv kernels --json)."""
        from kinv.agent.workstream.investigation import kernels_rows

        return read(kernels_rows)

    # ---- act tools --------------------------------------------------------------------------
    @server.tool()
    def run(plan: str, backend: BackendChoice = BackendName.AUTO.value,
            approval: ApprovalChoice = Approval.ASK.value) -> dict[str, Any]:  # fmt: skip
        """Start a workstream from its plan in the background (kinv run); returns at once with the workstream id.
        Watch it with status; kernel edits wait in pending for a person unless approval is auto."""
        path, p, h = checked_plan(plan, backend, approval)
        if p.campaign is not None and not p.variants:
            raise ToolError(f"{plan} is a campaign plan: start it with the campaign tool")
        started = spawn(["run", str(path), "--backend", backend, "--approval", approval], p.ws.lstrip("#"))
        return {"workstream": p.ws, "plan_hash": h, **started, "pending_approvals": [a.id for a in waiting(p.ws)]}

    @server.tool()
    def resume(ws: str, backend: BackendChoice = BackendName.AUTO.value) -> dict[str, Any]:
        """Continue a paused, interrupted or killed workstream in the background (kinv resume), under the
        approval policy it started with; returns at once."""
        choice(backend, tuple(BackendName), "backend")
        wsid = read(lambda: views.resolve_ws(store(), ws))
        left = waiting(wsid)
        if left:
            raise ToolError(f"{wsid} waits for approval {left[0].id}: a person decides it first (kinv approve "
                            f"{left[0].id} or kinv reject {left[0].id})")  # fmt: skip
        started = spawn(["resume", wsid.lstrip("#"), "--backend", backend], wsid.lstrip("#"))
        return {"workstream": wsid, **started, "pending_approvals": []}

    @server.tool()
    def campaign(plan: str, backend: BackendChoice = BackendName.AUTO.value,
                 approval: ApprovalChoice = Approval.AUTO_CONFIG.value) -> dict[str, Any]:  # fmt: skip
        """Start (or resume) a campaign in the background (kinv campaign): kinv chains workstreams on its own and
        proposes one config at the end; returns at once with the campaign id."""
        from kinv.agent.campaign.driver import campaign_id

        path, p, h = checked_plan(plan, backend, approval)
        if p.campaign is None:
            raise ToolError(f"{plan} has no campaign: section; start a workstream plan with the run tool")
        cid = campaign_id(p)
        started = spawn(["campaign", str(path), "--backend", backend, "--approval", approval], f"campaign-{cid.lstrip('#')}")
        return {"campaign": cid, "first_workstream": p.ws, "plan_hash": h, **started,
                "pending_approvals": [a.id for a in waiting(None)]}  # fmt: skip

    @server.tool()
    async def bench(plan: str | None = None, variant: str | None = None,
                    backend: BackendChoice = BackendName.AUTO.value, samples: int = 5) -> dict[str, Any]:  # fmt: skip
        """Time the live config at the plan's levels (µs, GB/s, % of copy bandwidth), or A/B a variant (tunable=value
        changes of the plan kernel's tunables, as the kernels tool lists them) against it with a verdict (kinv bench
        --json).  Without a plan: the example plan of the first registered kernel that names one."""
        on = plan_args(plan)
        choice(backend, tuple(BackendName), "backend")
        if not isinstance(samples, int) or not 1 <= samples <= 1000:
            raise ToolError(f"samples {samples!r} must be an integer from 1 to 1000")
        args = ["bench", *on, "--backend", backend, "--samples", str(samples)]
        if variant is not None:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=[0-9]{1,7}(,[A-Za-z_][A-Za-z0-9_]*=[0-9]{1,7})*", variant):
                raise ToolError(f"variant {variant!r} must be tunable=value[,tunable=value] in the plan kernel's "
                                "tunables (the kernels tool lists them)")
            args += ["--variant", variant]
        return {"result": await cli_json(args, timeout=1800)}

    @server.tool()
    async def noise(plan: str | None = None, backend: Literal["auto", "cuda", "replay"] = "auto",
                    rounds: int = 16, workers: int = 4) -> dict[str, Any]:  # fmt: skip
        """A/A of the live config at the plan's levels: round noise, between-worker offset, outliers, and whether
        the plan's thresholds are decidable (kinv noise --json).  Without a plan: as the bench tool."""
        on = plan_args(plan)
        choice(backend, tuple(BackendName), "backend")
        if not isinstance(rounds, int) or not 3 <= rounds <= 1000:
            raise ToolError(f"rounds {rounds!r} must be an integer from 3 to 1000")
        if not isinstance(workers, int) or not 2 <= workers <= 8:
            raise ToolError(f"workers {workers!r} must be an integer from 2 to 8")
        return {"result": await cli_json(["noise", *on, "--backend", backend, "--rounds", str(rounds),
                               "--workers", str(workers)], timeout=1800)}  # fmt: skip

    @server.tool()
    def propose_plan(name: str, text: str) -> dict[str, Any]:
        """Validate a plan the agent wrote (YAML text) and store it as plans/NAME.yaml with its hash: how an agent
        turns a hypothesis into a workstream it can then run. An existing plan is never overwritten."""
        from kinv.agent.errors import PlanError
        from kinv.agent.plan import load_plan

        if not isinstance(name, str) or not PLAN_NAME.fullmatch(name) or name.endswith((".yaml", ".yml")):
            raise ToolError(f"name {name!r} must be letters, digits, '.', '_' or '-' (no extension, no '/'), e.g. "
                            "5a-split-count")  # fmt: skip
        if not isinstance(text, str) or len(text.encode()) > 256 * 1024:
            raise ToolError("text must be the plan's YAML, at most 256 KiB")
        target = root / "plans" / f"{name}.yaml"
        target.parent.mkdir(exist_ok=True)
        tmp = target.with_name(f".{name}.{os.getpid()}.proposed.yaml")
        try:
            tmp.write_text(text)
            try:
                p, h = load_plan(tmp)
            except PlanError as exc:
                raise ToolError(str(exc).replace(str(tmp), f"plans/{name}.yaml")) from None
            if target.exists() and target.read_text() != text:
                raise ToolError(f"plans/{name}.yaml exists with other content; propose it under another name")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return {"path": str(target.relative_to(root)), "plan_hash": h, "workstream": p.ws, "kernel": p.kernel,
                "variants": [v.id for v in p.variants], "campaign": p.campaign is not None}  # fmt: skip

    if allow_approve:
        @server.tool()
        def approve(approval_id: str) -> views.ApprovalView:
            """Approve a pending kernel edit (the server was started with --allow-approve by a person)."""
            return decide(approval_id, "approved", "")

        @server.tool()
        def reject(approval_id: str, reason: str = "") -> views.ApprovalView:
            """Reject a pending kernel edit (the server was started with --allow-approve by a person)."""
            return decide(approval_id, "rejected", reason)

        def decide(approval_id: str, status: str, reason: str):
            def go():
                s = store()
                a = views.resolve_approval(s, approval_id)
                if not s.decide_approval(a["id"], status, reason, via="through MCP"):
                    raise ToolError(f"approval {a['id']} was already {s.approval(a['id'])['status']}")
                return views.approval(s, a["id"])

            return read(go)

    # ---- resources --------------------------------------------------------------------------
    def closeout_path(ws: str) -> Path:
        s = store()
        wsid = views.resolve_ws(s, ws)
        row = s.workstream(wsid)
        if not row.get("report_path") or not Path(row["report_path"]).exists():
            raise NotFound(f"{wsid} has no close-out yet (status {row['status']})")
        return Path(row["report_path"])

    @server.resource("kinv://closeout/{ws}", mime_type="text/markdown")
    def closeout(ws: str) -> str:
        """A workstream's close-out (Markdown)."""
        return closeout_path(ws).read_text()

    @server.resource("kinv://closeout/{ws}/png", mime_type="image/png")
    def closeout_png(ws: str) -> bytes:
        """A workstream's close-out figure: each variant's change per level with its interval."""
        png = closeout_path(ws).with_suffix(".png")
        if not png.exists():
            raise NotFound(f"{ws} has no close-out figure")
        return png.read_bytes()

    @server.resource("kinv://plan/{name}", mime_type="application/yaml")
    def plan_text(name: str) -> str:
        """A plan under plans/ by name (e.g. 3a-attention-occupancy)."""
        if not PLAN_NAME.fullmatch(name):
            raise BadInput(f"plan name {name!r} must be letters, digits, '.', '_' or '-'")
        path = root / "plans" / f"{name.removesuffix('.yaml')}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in (root / "plans").glob("*.yaml"))) or "none"
            raise NotFound(f"no plan {name!r}; plans: {known}")
        return path.read_text()

    return server


def serve(state_dir: str | None, allow_approve: bool) -> None:
    build(state_dir, allow_approve=allow_approve).run("stdio")
