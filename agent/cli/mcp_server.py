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
from kinv.agent.report import (
    view_models,  # the tools' return types: FastMCP reads them from the module's globals
    views,
)
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

    from kinv.agent.store.state import state_dir as default_state_dir

    root = Path(project or os.getcwd()).resolve()
    sdir = Path(state_dir).resolve() if state_dir else default_state_dir(None).resolve()
    server = FastMCP("kinv", log_level="WARNING", instructions=(
        "kinv tests GPU-kernel optimization ideas properly: a plan (hypothesis, variants), noise measured, "
        "baseline and variant timed side by side, a decision with statistics, a close-out. Start work with run "
        "or campaign, watch it with status and pending, read results with report and the closeout resources. "
        "Kernel edits wait for a person's approval unless the server was started with --allow-approve."))  # fmt: skip
    k = Kinv(root, sdir)
    for register in (*READ_TOOLS, *ACT_TOOLS, *((_approve, _reject) if allow_approve else ()), *RESOURCES):
        register(server, k)
    return server


def _tool_error(line: str):
    from mcp.server.fastmcp.exceptions import ToolError

    return ToolError(line)


class Kinv:
    """What every tool shares: the project and the state dir, the store, and the checks on what an agent names."""

    def __init__(self, root: Path, sdir: Path):
        self.root, self.sdir = root, sdir

    def store(self, create: bool = False):
        from kinv.agent.store.db import Store

        return Store(self.sdir, create=create)

    @staticmethod
    def fail(exc: BaseException):
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _tool_error(line)

    def read(self, fn):
        """Run a read view; kinv's one-line errors become tool errors."""
        from mcp.server.fastmcp.exceptions import ToolError

        try:
            return fn()
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - NotFound, StateDamaged, StoreError...: the CLI's one line
            raise self.fail(exc) from None

    def inside(self, p: str, what: str = "path") -> Path:
        """A path the agent named, resolved; refused unless it lies in the project or the state dir."""
        if not isinstance(p, str) or not p or "\x00" in p:
            raise _tool_error(f"{what} must be a non-empty path")
        path = Path(p)
        path = (path if path.is_absolute() else self.root / path).resolve()
        if not (path.is_relative_to(self.root) or path.is_relative_to(self.sdir)):
            raise _tool_error(f"{what} {p!r} lies outside the project ({self.root}) and the state dir ({self.sdir})")
        return path

    def plan_file(self, p: str) -> Path:
        path = self.inside(p, "plan")
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            raise _tool_error(f"plan {p!r} is not a YAML file in the project (plans live in plans/, e.g. "
                              "plans/3a-attention-occupancy.yaml)")  # fmt: skip
        return path

    def plan_args(self, p: str | None) -> list[str]:
        """``--plan PATH`` for a plan the agent named; none without one (kinv picks a registered kernel's example)."""
        return [] if p is None else ["--plan", str(self.plan_file(p))]

    def checked_plan(self, plan: str, backend: str, approval: str):
        """(path, Plan, hash) of a plan the agent named, with the backend and approval policy checked."""
        from kinv.agent.errors import PlanError
        from kinv.agent.plan_file import load_plan

        path = self.plan_file(plan)
        self.choice(backend, tuple(BackendName), "backend")
        self.choice(approval, tuple(Approval), "approval")
        try:
            return (path, *load_plan(path))
        except PlanError as exc:
            raise self.fail(exc) from None

    @staticmethod
    def choice(value: str, valid: tuple[str, ...], what: str) -> str:
        if value not in valid:
            raise _tool_error(f"{what} {value!r} is not valid; use {', '.join(valid)}")
        return value

    def spawn(self, args: list[str], label: str) -> dict[str, Any]:
        """A kinv command as its own process, detached from the server; its output goes to a log file."""
        logs = self.sdir / "mcp-runs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        with open(log, "wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", *args, "--state-dir", str(self.sdir)],
                                 cwd=self.root, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # fmt: skip
        # reap it when it ends (no zombie outlives its run while the server keeps going)
        threading.Thread(target=p.wait, daemon=True, name=f"kinv-reap-{p.pid}").start()
        return {"pid": p.pid, "log": str(log)}

    async def cli_json(self, args: list[str], timeout: float) -> Any:
        """Await ``kinv ARGS --json`` in a subprocess (the server keeps answering meanwhile)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kinv.agent.cli.app", *args, "--state-dir", str(self.sdir), "--json", cwd=self.root,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            raise _tool_error(f"kinv {args[0]} took longer than {timeout:.0f} s; run it from a terminal") from None
        if proc.returncode != 0:
            line = (err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise _tool_error(line.removeprefix("kinv: "))
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            raise _tool_error(f"kinv {args[0]} printed no JSON") from None

    def waiting(self, ws: str | None) -> list[view_models.ApprovalView]:
        try:
            return [a for a in views.pending(self.store()) if ws is None or a.workstream == ws]
        except Exception:  # noqa: BLE001 - a fresh state dir has no kinv.db yet
            return []

    def closeout_path(self, ws: str) -> Path:
        s = self.store()
        wsid = views.resolve_ws(s, ws)
        row = s.workstream(wsid)
        if not row.get("report_path") or not Path(row["report_path"]).exists():
            raise NotFound(f"{wsid} has no close-out yet (status {row['status']})")
        return Path(row["report_path"])


# ---- read tools -------------------------------------------------------------------------
def _status(server, k: Kinv) -> None:
    @server.tool()
    def status() -> view_models.StatusView:
        """Every campaign and workstream: todos, approvals waiting, latest verdicts, recommendation (kinv status --json)."""
        return k.read(lambda: views.status(k.store()))


def _todos(server, k: Kinv) -> None:
    @server.tool()
    def todos(ws: str, format: Literal["kinv", "opencode", "claude"] = "kinv") -> dict[str, Any]:
        """A workstream's todo list (kinv todos WS --json, as {"result": [...]}); format opencode or claude gives
        the {"todos": [...]} their todo writers take."""
        from kinv.agent.report import todo_export

        def go():
            s = k.store()
            items = views.todos(s, views.resolve_ws(s, ws))
            if format == "kinv":  # the CLI prints the list itself; a tool's list comes as {"result": [...]}
                return {"result": [t.model_dump(mode="json") for t in items]}
            return {"todos": todo_export.export_todos(items, format)}

        return k.read(go)


def _experiments(server, k: Kinv) -> None:
    @server.tool()
    def experiments(ws: str) -> list[view_models.ExperimentView]:
        """A workstream's experiments with their sample counts (kinv experiments WS --json)."""
        return k.read(lambda: views.experiments(k.store(), views.resolve_ws(k.store(), ws)))


def _show(server, k: Kinv) -> None:
    @server.tool()
    def show(experiment: int) -> view_models.ShowView:
        """One experiment: diff, checks, per-level samples, effects and ledger (kinv show ID --json)."""
        return k.read(lambda: views.show(k.store(), experiment))


def _history(server, k: Kinv) -> None:
    @server.tool()
    def history(ws: str) -> list[view_models.HistoryItem]:
        """Every graph node that ran for a workstream: step, outcome, decision (kinv history WS --json)."""
        return k.read(lambda: views.history(k.store(), views.resolve_ws(k.store(), ws)))


def _pending(server, k: Kinv) -> None:
    @server.tool()
    def pending() -> list[view_models.ApprovalView]:
        """Kernel edits (and campaign adoptions) waiting for a person's approval (kinv pending --json)."""
        return k.read(lambda: views.pending(k.store()))


def _report(server, k: Kinv) -> None:
    @server.tool()
    def report(ws: str) -> view_models.ReportView:
        """A workstream's close-out: every experiment with its per-level effects, and the Markdown (kinv report WS
        --json)."""

        def go():
            s = k.store()
            wsid = views.resolve_ws(s, ws)
            row = s.workstream(wsid)
            if not row.get("report_path") or not Path(row["report_path"]).exists():
                raise _tool_error(f"{wsid} has no close-out yet (status {row['status']}); resume it")
            return views.report(s, wsid, Path(row["report_path"]).read_text())

        return k.read(go)


def _kernels(server, k: Kinv) -> None:
    @server.tool()
    def kernels() -> list[dict[str, Any]]:
        """The kernels kinv can investigate: tunables, level dimensions, throughput unit (kinv kernels --json)."""
        from kinv.agent.workstream.commands import kernels_rows

        return k.read(kernels_rows)


# ---- act tools --------------------------------------------------------------------------
def _run(server, k: Kinv) -> None:
    @server.tool()
    def run(plan: str, backend: BackendChoice = BackendName.AUTO.value,
            approval: ApprovalChoice = Approval.ASK.value) -> dict[str, Any]:  # fmt: skip
        """Start a workstream from its plan in the background (kinv run); returns at once with the workstream id.
        Watch it with status; kernel edits wait in pending for a person unless approval is auto."""
        path, p, h = k.checked_plan(plan, backend, approval)
        if p.campaign is not None and not p.variants:
            raise _tool_error(f"{plan} is a campaign plan: start it with the campaign tool")
        started = k.spawn(["run", str(path), "--backend", backend, "--approval", approval], p.ws.lstrip("#"))
        return {"workstream": p.ws, "plan_hash": h, **started, "pending_approvals": [a.id for a in k.waiting(p.ws)]}


def _resume(server, k: Kinv) -> None:
    @server.tool()
    def resume(ws: str, backend: BackendChoice = BackendName.AUTO.value) -> dict[str, Any]:
        """Continue a paused, interrupted or killed workstream in the background (kinv resume), under the
        approval policy it started with; returns at once."""
        k.choice(backend, tuple(BackendName), "backend")
        wsid = k.read(lambda: views.resolve_ws(k.store(), ws))
        left = k.waiting(wsid)
        if left:
            raise _tool_error(f"{wsid} waits for approval {left[0].id}: a person decides it first (kinv approve "
                              f"{left[0].id} or kinv reject {left[0].id})")  # fmt: skip
        started = k.spawn(["resume", wsid.lstrip("#"), "--backend", backend], wsid.lstrip("#"))
        return {"workstream": wsid, **started, "pending_approvals": []}


def _campaign(server, k: Kinv) -> None:
    @server.tool()
    def campaign(plan: str, backend: BackendChoice = BackendName.AUTO.value,
                 approval: ApprovalChoice = Approval.AUTO_CONFIG.value) -> dict[str, Any]:  # fmt: skip
        """Start (or resume) a campaign in the background (kinv campaign): kinv chains workstreams on its own and
        proposes one config at the end; returns at once with the campaign id."""
        from kinv.agent.campaign.driver import campaign_id

        path, p, h = k.checked_plan(plan, backend, approval)
        if p.campaign is None:
            raise _tool_error(f"{plan} has no campaign: section; start a workstream plan with the run tool")
        cid = campaign_id(p)
        started = k.spawn(["campaign", str(path), "--backend", backend, "--approval", approval],
                          f"campaign-{cid.lstrip('#')}")  # fmt: skip
        return {"campaign": cid, "first_workstream": p.ws, "plan_hash": h, **started,
                "pending_approvals": [a.id for a in k.waiting(None)]}  # fmt: skip


def _bench(server, k: Kinv) -> None:
    @server.tool()
    async def bench(plan: str | None = None, variant: str | None = None,
                    backend: BackendChoice = BackendName.AUTO.value, samples: int = 5) -> dict[str, Any]:  # fmt: skip
        """Time the live config at the plan's levels (µs, GB/s, % of copy bandwidth), or A/B a variant (tunable=value
        changes of the plan kernel's tunables, as the kernels tool lists them) against it with a verdict (kinv bench
        --json).  Without a plan: the example plan of the first registered kernel that names one."""
        on = k.plan_args(plan)
        k.choice(backend, tuple(BackendName), "backend")
        if not isinstance(samples, int) or not 1 <= samples <= 1000:
            raise _tool_error(f"samples {samples!r} must be an integer from 1 to 1000")
        args = ["bench", *on, "--backend", backend, "--samples", str(samples)]
        if variant is not None:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=[0-9]{1,7}(,[A-Za-z_][A-Za-z0-9_]*=[0-9]{1,7})*", variant):
                raise _tool_error(f"variant {variant!r} must be tunable=value[,tunable=value] in the plan kernel's "
                                  "tunables (the kernels tool lists them)")
            args += ["--variant", variant]
        return {"result": await k.cli_json(args, timeout=1800)}


def _noise(server, k: Kinv) -> None:
    @server.tool()
    async def noise(plan: str | None = None, backend: Literal["auto", "cuda", "replay"] = "auto",
                    rounds: int = 16, workers: int = 4) -> dict[str, Any]:  # fmt: skip
        """A/A of the live config at the plan's levels: round noise, between-worker offset, outliers, and whether
        the plan's thresholds are decidable (kinv noise --json).  Without a plan: as the bench tool."""
        on = k.plan_args(plan)
        k.choice(backend, tuple(BackendName), "backend")
        if not isinstance(rounds, int) or not 3 <= rounds <= 1000:
            raise _tool_error(f"rounds {rounds!r} must be an integer from 3 to 1000")
        if not isinstance(workers, int) or not 2 <= workers <= 8:
            raise _tool_error(f"workers {workers!r} must be an integer from 2 to 8")
        return {"result": await k.cli_json(["noise", *on, "--backend", backend, "--rounds", str(rounds),
                                 "--workers", str(workers)], timeout=1800)}  # fmt: skip


def _propose_plan(server, k: Kinv) -> None:
    @server.tool()
    def propose_plan(name: str, text: str) -> dict[str, Any]:
        """Validate a plan the agent wrote (YAML text) and store it as plans/NAME.yaml with its hash: how an agent
        turns a hypothesis into a workstream it can then run. An existing plan is never overwritten."""
        from kinv.agent.errors import PlanError
        from kinv.agent.plan_file import load_plan

        if not isinstance(name, str) or not PLAN_NAME.fullmatch(name) or name.endswith((".yaml", ".yml")):
            raise _tool_error(f"name {name!r} must be letters, digits, '.', '_' or '-' (no extension, no '/'), e.g. "
                              "5a-split-count")  # fmt: skip
        if not isinstance(text, str) or len(text.encode()) > 256 * 1024:
            raise _tool_error("text must be the plan's YAML, at most 256 KiB")
        target = k.root / "plans" / f"{name}.yaml"
        target.parent.mkdir(exist_ok=True)
        tmp = target.with_name(f".{name}.{os.getpid()}.proposed.yaml")
        try:
            tmp.write_text(text)
            try:
                p, h = load_plan(tmp)
            except PlanError as exc:
                raise _tool_error(str(exc).replace(str(tmp), f"plans/{name}.yaml")) from None
            if target.exists() and target.read_text() != text:
                raise _tool_error(f"plans/{name}.yaml exists with other content; propose it under another name")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return {"path": str(target.relative_to(k.root)), "plan_hash": h, "workstream": p.ws, "kernel": p.kernel,
                "variants": [v.id for v in p.variants], "campaign": p.campaign is not None}  # fmt: skip


# ---- approve / reject: only with --allow-approve ------------------------------------------
def _decide(k: Kinv, approval_id: str, status: str, reason: str):
    def go():
        s = k.store()
        a = views.resolve_approval(s, approval_id)
        if not s.decide_approval(a["id"], status, reason, via="through MCP"):
            raise _tool_error(f"approval {a['id']} was already {s.approval(a['id'])['status']}")
        return views.approval(s, a["id"])

    return k.read(go)


def _approve(server, k: Kinv) -> None:
    @server.tool()
    def approve(approval_id: str) -> view_models.ApprovalView:
        """Approve a pending kernel edit (the server was started with --allow-approve by a person)."""
        return _decide(k, approval_id, "approved", "")


def _reject(server, k: Kinv) -> None:
    @server.tool()
    def reject(approval_id: str, reason: str = "") -> view_models.ApprovalView:
        """Reject a pending kernel edit (the server was started with --allow-approve by a person)."""
        return _decide(k, approval_id, "rejected", reason)


# ---- resources --------------------------------------------------------------------------
def _closeout(server, k: Kinv) -> None:
    @server.resource("kinv://closeout/{ws}", mime_type="text/markdown")
    def closeout(ws: str) -> str:
        """A workstream's close-out (Markdown)."""
        return k.closeout_path(ws).read_text()


def _closeout_png(server, k: Kinv) -> None:
    @server.resource("kinv://closeout/{ws}/png", mime_type="image/png")
    def closeout_png(ws: str) -> bytes:
        """A workstream's close-out figure: each variant's change per level with its interval."""
        png = k.closeout_path(ws).with_suffix(".png")
        if not png.exists():
            raise NotFound(f"{ws} has no close-out figure")
        return png.read_bytes()


def _plan_text(server, k: Kinv) -> None:
    @server.resource("kinv://plan/{name}", mime_type="application/yaml")
    def plan_text(name: str) -> str:
        """A plan under plans/ by name (e.g. 3a-attention-occupancy)."""
        if not PLAN_NAME.fullmatch(name):
            raise BadInput(f"plan name {name!r} must be letters, digits, '.', '_' or '-'")
        path = k.root / "plans" / f"{name.removesuffix('.yaml')}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in (k.root / "plans").glob("*.yaml"))) or "none"
            raise NotFound(f"no plan {name!r}; plans: {known}")
        return path.read_text()


# the registrations, in the order the server lists them
READ_TOOLS = (_status, _todos, _experiments, _show, _history, _pending, _report, _kernels)
ACT_TOOLS = (_run, _resume, _campaign, _bench, _noise, _propose_plan)
RESOURCES = (_closeout, _closeout_png, _plan_text)


def serve(state_dir: str | None, allow_approve: bool) -> None:
    build(state_dir, allow_approve=allow_approve).run("stdio")
