"""Several workstreams at once: `kinv run PLAN PLAN ...` places each on its own GPU.

Each workstream runs as its own `kinv run PLAN` process, with its own locks, workers and journal, exactly as
one run alone; this module only decides where and when:

* plans of one kernel form one group and run one after another in that group's process slot (they would
  patch the same live config file, which the kernel lock already refuses to share);
* each group gets a GPU of its own (``CUDA_VISIBLE_DEVICES`` of the child is that one index); with more
  groups than GPUs, a group waits for a GPU to come free;
* on replay (no GPU is measured), each group gets a CPU process slot, up to the machine's cores.

The children share the state dir (kinv.db is SQLite in WAL mode; each child holds its own workstream and
kernel locks) and this checkout's live config files, so they run on one node.  Ray places work across a
cluster, but a workstream patches files of this checkout and reads them back in its workers, so a second
node would not see them: processes on this node are the right unit here.  The driver keeps each child's
output in ``<state dir>/runs/<workstream>.log``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kinv.kernels.errors import BadInput


@dataclass
class Placed:
    """One plan of a multi-plan run: where it ran and how it ended."""

    plan: str
    ws: str
    kernel: str
    group: int
    place: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    started: float = 0.0
    last_line: str = ""
    log: str = ""
    extra: dict = field(default_factory=dict)


def visible_gpus() -> list[str]:
    """The GPU indices a child may be given: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``'s;
    none under KINV_FORCE_NO_GPU or without a driver."""
    if os.environ.get("KINV_FORCE_NO_GPU"):
        return []
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, ln in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def group(plans: list[tuple[str, object]]) -> list[Placed]:
    """(path, Plan) pairs -> Placed rows, one group per kernel in first-seen order; refuses a workstream named
    twice."""
    seen: dict[str, str] = {}
    kernels: dict[str, int] = {}
    rows = []
    for path, plan in plans:
        if plan.ws in seen:
            raise BadInput(f"{path} and {seen[plan.ws]} are both workstream {plan.ws}; a workstream runs once "
                                 "per `kinv run`")  # fmt: skip
        seen[plan.ws] = path
        g = kernels.setdefault(plan.kernel, len(kernels))
        rows.append(Placed(plan=path, ws=plan.ws, kernel=plan.kernel, group=g))
    return rows


def places(n_groups: int, live: bool) -> list[str]:
    """The slots the groups share: GPU indices when measuring live, CPU process slots on replay."""
    if live:
        gpus = visible_gpus()
        if not gpus:
            raise BadInput("--backend cuda needs a GPU and none is visible (nvidia-smi -L lists none); use "
                                 "--backend replay or auto")  # fmt: skip
        return gpus
    return [f"cpu{i}" for i in range(max(1, min(n_groups, os.cpu_count() or 1)))]


def run_all(rows: list[Placed], slots: list[str], argv: list[str], state_dir: Path, env: dict | None = None,
            say=None) -> list[Placed]:  # fmt: skip
    """Run every group, each in the next free slot, its plans one after another as `kinv run PLAN ARGV`;
    returns the rows with their exit codes, places and wall times."""
    logs = state_dir / "runs"
    logs.mkdir(parents=True, exist_ok=True)
    free = list(slots)
    cond = threading.Condition()
    by_group: dict[int, list[Placed]] = {}
    for r in rows:
        by_group.setdefault(r.group, []).append(r)

    def run_group(members: list[Placed]) -> None:
        with cond:
            while not free:
                cond.wait()
            slot = free.pop(0)
        try:
            for r in members:
                child = dict(env if env is not None else os.environ)
                if not slot.startswith("cpu"):
                    child["CUDA_VISIBLE_DEVICES"] = slot
                r.place, r.log = slot, str(logs / f"{r.ws.lstrip('#')}.log")
                if say:
                    say(f"{r.ws}: {r.plan} starts on {slot}")
                r.started = time.time()
                with open(r.log, "w") as fh:
                    proc = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "run", r.plan, *argv], env=child,
                                          stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
                r.wall_s, r.exit_code = time.time() - r.started, proc.returncode
                lines = [ln for ln in Path(r.log).read_text(errors="replace").splitlines() if ln.strip()]
                r.last_line = lines[-1].strip() if lines else ""
                if say:
                    say(f"{r.ws}: exit {r.exit_code} after {r.wall_s:.1f} s on {slot}: {r.last_line}")
        finally:
            with cond:
                free.append(slot)
                cond.notify_all()

    threads = [threading.Thread(target=run_group, args=(m,), daemon=True) for m in by_group.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def exit_code(rows: list[Placed]) -> int:
    """1 when any workstream failed, else 3 when any waits for an approval, else 2 for bad input, else 0."""
    codes = {r.exit_code for r in rows}
    for code in (1, 3, 2):
        if code in codes:
            return code
    return 0 if codes <= {0} else 1


__all__ = ["Placed", "exit_code", "group", "places", "run_all", "visible_gpus"]
