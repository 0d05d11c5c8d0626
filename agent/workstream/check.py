"""``kinv check PLAN``: everything a run would do before it times anything, on any machine.

A plugin author on a laptop has no GPU and no recording of a new kernel; this is their whole path short of
timing.  For one plan it

* validates the plan (a bad plan is bad input, as for ``kinv run``);
* resolves every arm's config (the baseline and each variant) at every level, with the environment it runs in and,
  for a command, the command line it runs;
* runs the correctness gate of the baseline and of every variant, as a run does: on a GPU where one is visible, else
  on CPU in the Triton interpreter (a command: it exits 0 and prints its metric at every level).  A variant's
  source patch is applied to a copy of the kernel's package, never to the live file;
* shows each variant's edit as ``kinv pending`` would show its approval (the diff from the live config file's exact
  bytes, the environment, the source patch) and predicts its resources where the adapter has a model;
* writes a close-out skeleton that says, first, that nothing was timed.

Nothing is patched, timed or written to kinv.db; the skeleton goes under ``<state>/checks/``.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kinv.agent.errors import BackendError, PatchError
from kinv.agent.plan import Plan
from kinv.agent.plan_file import load_plan
from kinv.agent.plan_sections import Variant
from kinv.agent.tools.backends.base import Backend, gpu_visible
from kinv.agent.tools.measure import reach
from kinv.agent.tools.runners import plugin_imports
from kinv.kernels.adapter import Level, get_adapter
from kinv.kernels.devices import get_device
from kinv.kernels.launch_config import describe, effective


@dataclass
class ArmCheck:
    """One arm as a run would run it: its config at every level, its gate, its edit and its predicted resources."""

    name: str  # "baseline" or the variant's id
    title: str
    config: str  # the config's label (describe)
    env: dict[str, str]
    levels: list[dict]  # [{level, label, runs}]: what runs there (the resolved config, or the command line)
    gate: dict = field(default_factory=dict)  # the correctness check's result
    diff: str = ""  # what its approval would show (variants only)
    resources: dict = field(default_factory=dict)  # {feasible, reason, predicted} or {note}
    skipped: str = ""  # why its gate did not run (a patch that does not apply, an infeasible config)
    premise: str = ""  # what the check can say of the variant's premise (its targets): on CPU, that it cannot judge it

    @property
    def ok(self) -> bool:
        return not self.skipped and bool(self.gate.get("ok"))

    def failed_level(self) -> str | None:
        """The level whose check failed first (None: none did, or no level ran)."""
        for e in self.gate.get("levels", []):
            if e.get("ok") is False:
                return e.get("level")
        return None


@dataclass
class CheckOutcome:
    plan_path: str
    ws: str
    kernel: str
    device: str  # where the gate ran: cuda, cpu (the Triton interpreter), or the command's own run
    seconds: float
    arms: list[ArmCheck]
    report: Path | None = None
    #: what a plugin imports from kinv outside kinv.plugin: deprecated paths and private modules, one line each
    plugin_imports: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.arms)

    def failures(self) -> list[str]:
        """One phrase per failed arm: who, where, why."""
        out = []
        for a in self.arms:
            if a.ok:
                continue
            if a.skipped:
                out.append(f"{a.name}: {a.skipped}")
                continue
            lv = a.failed_level()
            out.append(f"{a.name}" + (f" at {lv}" if lv else "") + f": {a.gate.get('reason') or 'failed'}")
        return out


class _GateOnly(Backend):
    """The backend of a check: the shared correctness gate (crash-isolated, judged out of the kernel's reach, kept
    processes on CPU) and nothing that times."""

    name = "check"
    loud = "CHECK: the correctness gate only; nothing is timed"

    def open(self, *args, **kwargs):
        raise BackendError("kinv check times nothing: run the plan (kinv run) to measure it")


def _gate_backend(kernel: str) -> Backend:
    if kernel == "command":
        from kinv.agent.tools.backends.command import CommandBackend

        return CommandBackend()
    return _GateOnly()


def _gate_device(kernel: str) -> str:
    if kernel == "command":
        return "command"
    return "cuda" if gpu_visible() else "cpu"


def _runs_at(plan: Plan, adapter, cfg: dict, env: dict, level: Level) -> str:
    """What runs at ``level``: the command line (a command plan), else the resolved config's label."""
    if plan.kernel == "command":
        return " ".join(adapter.argv(level, env=env, placeholder_port=True))
    return describe(effective(adapter, cfg, level))


def _levels_of(plan: Plan, adapter, cfg: dict, env: dict) -> list[dict]:
    return [{"level": lv.key, "label": lv.label, "runs": _runs_at(plan, adapter, cfg, env, lv)} for lv in plan.levels()]


def _edit_diff(plan: Plan, adapter, v: Variant, cfg: dict) -> str:
    """What ``kinv pending`` would show for ``v``'s approval: its environment, its command line where it changes,
    the live config file's diff, its source patch."""
    from kinv.agent.tools.files import configs
    from kinv.agent.workstream.context import source_patch_of

    lines = [f"environment of {v.id}'s processes: {k}={plan.environment.get(k, '(unset)')} -> {k}={val}\n"
             for k, val in v.env.items()]  # fmt: skip
    if plan.kernel == "command":
        levels = plan.levels()[:1]
        for lv in levels:
            before = " ".join(adapter.argv(lv, env=plan.environment, placeholder_port=True))
            after = " ".join(adapter.argv(lv, env=plan.variant_env(v), placeholder_port=True))
            if before != after:
                lines.append(f"command line of {v.id}'s runs at {lv.key}: {before} -> {after}\n")
    path = adapter.config_path()
    if adapter.name != "command":
        if path.is_file():
            edit = configs.plan_config_edit(path, cfg, adapter.name)
            lines.append(edit.diff)
        elif hasattr(adapter, "default_text"):  # a quick plugin: a run first writes its declared default there
            from kinv.agent.tools.files.config_text import diff_text, edit_config_text

            old = adapter.default_text()
            lines.append(f"(the live config file {path} does not exist yet: a run writes the declared default there "
                         "first; the diff is from it)\n")  # fmt: skip
            lines.append(diff_text(old, edit_config_text(old, cfg, adapter.name), path.name))
        else:
            lines.append(f"(the live config file {path} does not exist yet: a run writes the kernel's declared default "
                         f"there first, then {describe(cfg)} while {v.id} is measured)\n")  # fmt: skip
    src = source_patch_of(adapter, v)
    if src:
        lines.append(("\n" if lines else "") + src[1])
    return "".join(lines)


def _resources(plan: Plan, adapter, base_cfg: dict, cfg: dict) -> dict:
    from kinv.agent.tools.runners import resources

    if adapter.name == "command":
        return {}  # a whole command has no launch resources
    if not adapter.resource_model:
        return {"note": "no analytical resource model for this kernel: the compiler's figures come from a GPU run "
                        "(kinv run --approval ask shows them before the edit)"}  # fmt: skip
    device = get_device(plan.device)
    levels = plan.levels()
    base_a = resources.assess(adapter, base_cfg, levels, device)
    var_a = resources.assess(adapter, cfg, levels, device)
    out = {"feasible": var_a["feasible"], "reason": var_a["reason"],
           "predicted": resources.predicted_change(base_a, var_a), "device": plan.device}  # fmt: skip
    if any(lv.get("registers") is None for lv in [*base_a["levels"], *var_a["levels"]]):
        # nothing was compiled: the analytical model knows shared memory, not the registers that often bind first
        out["basis"] = f"registers unknown {_unknown_where()}: occupancy from shared memory and thread limits only"
    return out


def _unknown_where() -> str:
    return "on CPU" if not gpu_visible() else "before a compile (kinv check compiles nothing)"


def _premise(adapter, v: Variant) -> str:
    """What the check says of ``v``'s premise: the quantity its targets names is read from a compiled kernel and its
    profile, which a check has neither of, so it is not judged (empty: the variant names no premise)."""
    from kinv.agent.tools.runners.premise import premises_of, words

    readings = premises_of(v.targets, adapter)
    if not readings:
        return ""
    said = ", ".join(f"{p.quantity} {p.direction}" for p in readings)
    where = "on CPU" if not gpu_visible() else "by kinv check"
    return (f"premise {words(v.targets)} ({said}): not judged {where}; a run reads it from the compiled kernel "
            "(registers included) and its profile")  # fmt: skip


def _patched_copy(adapter, v: Variant, where: Path) -> list[str]:
    """A copy of the kernel's package with ``v``'s source patch applied (the live files untouched): the import path
    that puts it first.  Raises PatchError when the patch does not apply."""
    from kinv.agent.tools.files.config_text import apply_unified_diff
    from kinv.agent.tools.files.snapshot import materialize, package_files
    from kinv.agent.workstream.context import source_patch_of

    target, diff = source_patch_of(adapter, v)
    rel = target.resolve().relative_to(adapter.package_dir()).as_posix()
    files = package_files(adapter.package_dir())
    if rel not in files:
        raise PatchError(f"{v.source_patch} targets {rel}, which is not in {adapter.package_dir()}")
    files[rel] = apply_unified_diff(files[rel].decode("utf-8"), diff, target).encode("utf-8")
    return [str(materialize(files, where / v.id, adapter.package_name()))]


def check_plan(plan_path: str, say=None) -> CheckOutcome:
    """Check ``plan_path`` end to end short of timing it (the module's docstring).  Raises PlanError (bad input) for
    a plan that cannot be used; a failed gate is in the outcome, never raised."""
    t0 = time.time()
    plan, _ = load_plan(plan_path)
    adapter = get_adapter(plan.kernel)
    say = say or (lambda _msg: None)
    device = _gate_device(plan.kernel)
    backend = _gate_backend(plan.kernel)
    levels = plan.levels()
    seed = random.SystemRandom().randrange(2**31)
    base_cfg = {**plan.baseline, "kernel": adapter.name}
    arms = [ArmCheck("baseline", "the plan's baseline", describe(base_cfg), dict(plan.environment),
                     _levels_of(plan, adapter, base_cfg, plan.environment))]  # fmt: skip
    for v in plan.variants:
        cfg = plan.variant_config(v)
        env = plan.variant_env(v)
        arms.append(ArmCheck(v.id, v.title, describe(cfg), env, _levels_of(plan, adapter, cfg, env),
                             diff=_edit_diff(plan, adapter, v, cfg), resources=_resources(plan, adapter, base_cfg, cfg),
                             premise=_premise(adapter, v)))  # fmt: skip
    where = {"cpu": "on CPU in the Triton interpreter", "cuda": "on this machine's GPU",
             "command": "by running the command"}[device]  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="kinv-check-") as tmp:
            for arm in arms:
                v = plan.variant(arm.name) if arm.name != "baseline" else None
                cfg = plan.variant_config(v) if v else base_cfg
                if arm.resources.get("feasible") is False:
                    arm.skipped = f"infeasible on {plan.device}: {arm.resources['reason']} (a run never patches it)"
                    continue
                path = None
                if v is not None and v.source_patch:
                    try:
                        path = _patched_copy(adapter, v, Path(tmp))
                    except PatchError as exc:
                        arm.skipped = f"its source patch does not apply: {exc}"
                        continue
                    arm.skipped = reach.refusal(adapter, v, allowed=say)  # code that reaches for the harness
                    if arm.skipped:
                        continue
                say(f"{arm.name}: correctness gate at {len(levels)} level(s) {where} ...")
                arm.gate = backend.check(plan.kernel, cfg, levels, seed=seed, device=device, env=arm.env,
                                         pythonpath=path)  # fmt: skip
                say(f"{arm.name}: " + ("correct" if arm.gate.get("ok") else f"FAILED: {arm.gate.get('reason')}"))
    finally:
        backend.close()
    return CheckOutcome(str(plan_path), plan.ws, plan.kernel, device, time.time() - t0, arms,
                        plugin_imports=plugin_imports.scan(adapter))  # fmt: skip


def write_report(outcome: CheckOutcome, state_dir: Path) -> Path:
    """The close-out skeleton under ``<state>/checks/<ws>-check.md`` (a later check replaces it)."""
    from kinv.agent.report.check import skeleton

    d = Path(state_dir) / "checks"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{outcome.ws.lstrip('#')}-check.md"
    path.write_text(skeleton(outcome))
    outcome.report = path
    return path
