"""Adopt a measured winner: the accepted config (or the level-conditional overrides a mixed verdict
proposes, or an accepted source patch) written to the live kernel file as a journaled, reviewed change.

``kinv adopt WS VARIANT`` shows the diff and the commit message first; ``--yes`` writes it.  The write goes
through the patch journal (backup, intent, atomic write) under the same locks as a run, and the journal row
is then marked ``adopted``: a final state, so no later start "recovers" it back to the old baseline.  The
commit message cites the close-out and every level's measured change, so the commit says why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kinv.agent.store import Store
from kinv.kernels.errors import BadInput


class AdoptError(BadInput):
    """The variant cannot be adopted (not a win, state moved on, plan changed); the message says why."""


@dataclass
class Adoption:
    ws: str
    variant: str
    kind: str  # "config", "overrides" or "source"
    path: Path
    new_config: dict | None
    source_diff: str | None
    diff: str
    message: str


def prepare(store: Store, ws: str, vid: str) -> Adoption:
    """What adopting ``vid`` of ``ws`` would write, and the commit message; changes nothing."""
    from kinv.agent import planner
    from kinv.agent.models import PlanError, load_plan
    from kinv.agent.stats import level_names
    from kinv.agent.tools import configs
    from kinv.kernels.launch_config import describe

    row = store.workstream(ws)
    if row["status"] != "closed":
        raise AdoptError(f"{ws} is {row['status']}: adopt a variant once its workstream has closed out")
    exp = next((e for e in reversed(store.experiments(ws)) if e["variant"] == vid and e["kind"] == "ab"), None)
    if exp is None:
        ids = sorted({e["variant"] for e in store.experiments(ws) if e["kind"] == "ab"})
        raise AdoptError(f"{ws} has no measured variant {vid!r}; measured: {', '.join(ids) or 'none'}")
    if exp["verdict"] not in ("accept", "mixed"):
        raise AdoptError(f"{ws} {vid} was not a win ({exp['verdict']}: {exp['reason']}); only an accepted variant, or a "
                         "mixed one's level-conditional config, can be adopted")  # fmt: skip
    try:
        plan, plan_hash = load_plan(row["plan_path"])
    except PlanError as exc:
        raise AdoptError(f"the plan of {ws} cannot be read again: {exc}") from None
    if plan_hash != row["plan_hash"]:
        raise AdoptError(f"{row['plan_path']} changed since {ws} ran (hash {plan_hash[:12]}, ran with "
                         f"{row['plan_hash'][:12]}): adopt from the plan that was measured")  # fmt: skip
    variant = plan.variant(vid)
    verdicts = store.verdicts(exp["id"])
    levels = {v["level"]: v["verdict"] for v in verdicts}
    path = plan.adapter.config_path()
    live_sha = configs.sha(path)
    if live_sha != row["baseline_hash"]:
        raise AdoptError(f"{path} is at {live_sha}, not the baseline {row['baseline_hash']} that {ws} measured "
                         f"against; the file moved on (kinv backups shows its history)")  # fmt: skip
    base = configs.read_config(path, plan.adapter.name)
    if exp["verdict"] == "mixed" and variant.source_patch:
        raise AdoptError(f"{ws} {vid} is mixed and carries a source patch: a source change applies at every level, "
                         "so it cannot be adopted only where it won; split the patch or tune the levels it lost")
    if exp["verdict"] == "mixed":
        cond = planner.level_conditional(plan, variant, levels)
        if cond is None:
            raise AdoptError(f"{ws} {vid} is mixed and {plan.adapter.name} takes no per-level overrides to adopt it "
                             "where it won")  # fmt: skip
        kind, new_cfg, src_diff = "overrides", cond, None
    elif variant.source_patch:
        from kinv.agent.graph import source_patch_of

        target, src_diff = source_patch_of(plan.adapter, variant)
        kind, new_cfg, path = "source", None, target
    else:
        kind, new_cfg, src_diff = "config", plan.variant_config(variant), None
    if new_cfg is not None:
        new_cfg = {**new_cfg, "description": f"Adopted from {ws} {vid} ({variant.title}) by kinv adopt; the "
                   f"close-out says why: {Path(row['report_path'] or '').name}."}  # fmt: skip
        diff = configs.config_diff(base, new_cfg, path.name)
        what = describe(new_cfg)
    else:
        diff, what = src_diff, f"source patch {variant.source_patch}"
    _, short = level_names(v["level"] for v in verdicts)
    lines = [f"{plan.adapter.name}: adopt {ws} {vid} ({variant.title})", "",
             f"{what}, replacing {describe(base)}. Measured by kinv ({exp['backend']} backend, experiment "
             f"{exp['id']}, {exp['rounds']} paired rounds): {exp['verdict']}.", ""]  # fmt: skip
    for v in verdicts:
        lo, hi = math.expm1(v["ci_low"]), math.expm1(v["ci_high"])
        lines.append(f"  {short[v['level']]:>8s}  {math.expm1(v['effect']):+.2%} [{lo:+.2%}, {hi:+.2%}] "
                     f"({v['conf']:.3%} CI)  {v['verdict']}")  # fmt: skip
    if kind == "overrides":
        lines += ["", "Mixed verdict: the variant is used only at the levels where it improved (overrides)."]
    lines += ["", f"Close-out: {row['report_path']}", f"Plan: {row['plan_path']} (sha {row['plan_hash'][:12]})"]
    return Adoption(ws, vid, kind, path, new_cfg, src_diff, diff, "\n".join(lines) + "\n")


def apply(store: Store, a: Adoption) -> dict:
    """Write the adoption through the journal (the caller holds the run locks) and mark it final."""
    from kinv.agent.tools import configs

    exp = next(e for e in reversed(store.experiments(a.ws)) if e["variant"] == a.variant and e["kind"] == "ab")
    if a.kind == "source":
        row = configs.patch_source(store, a.path, a.source_diff, a.ws, exp["id"])
    else:
        row = configs.patch_config(store, a.path, a.new_config, a.ws, exp["id"])
    store.journal_set(row["id"], "adopted")
    msg = store.dir / "adoptions" / f"{a.ws.lstrip('#')}-{a.variant}.txt"
    msg.parent.mkdir(parents=True, exist_ok=True)
    msg.write_text(a.message)
    store.event(a.ws, "adopted", f"adopted {a.ws} {a.variant} into {a.path.name} (patch #{row['id']})",
                {"patch": row["id"], "path": str(a.path), "message": str(msg)})  # fmt: skip
    return {"patch": row["id"], "path": str(a.path), "message_file": str(msg), "kind": a.kind,
            "sha_after": configs.sha(a.path), "diff": a.diff, "message": a.message}  # fmt: skip


def as_json(a: Adoption) -> str:
    return json.dumps({"workstream": a.ws, "variant": a.variant, "kind": a.kind, "path": str(a.path),
                       "diff": a.diff, "message": a.message, "written": False}, indent=2)  # fmt: skip
