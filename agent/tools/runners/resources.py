"""Feasibility and the "why" figures of a config: shared memory, occupancy, and whatever the adapter
explains (``Resources.why``: a split kernel's splits, tiles and waves, say), per level.

The figures come from the kernel's adapter (``KernelAdapter.resources``); the derivations that feed
them (a tunable derived from the workload, ``KernelAdapter.workload_notes``) live in the adapter too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kinv.kernels.adapter import KernelAdapter, Level
from kinv.kernels.devices import DeviceSpec
from kinv.kernels.errors import BadInput
from kinv.kernels.launch_config import config_hash, describe

if TYPE_CHECKING:
    from kinv.agent.store.db import Store

def _smem(level_res: dict) -> int:
    compiled = level_res.get("smem_compiled")
    return compiled if compiled is not None else level_res["smem_estimate"]


def assess(adapter: KernelAdapter, config: dict, plan_levels: list[Level], device: DeviceSpec) -> dict:
    """Resources of ``config`` at every level on ``device`` (per-level overrides honored), and the verdict.

    Returns ``{"config_hash", "config", "device", "smem_per_block", "levels": [...], "feasible", "reason",
    "smem_estimate_max", "occupancy": {level: ...}, "why": {level: ...}}``; ``reason`` names the first
    infeasible level.
    """
    if not plan_levels:
        raise BadInput("no levels to assess; give at least one workload level")
    config = adapter.validate_config(config)
    levels, occ, why = [], {}, {}
    feasible, reason = True, ""
    for level in plan_levels:
        params = adapter.params_for(config, level)
        res = adapter.resources(params, level, device).to_dict()
        levels.append({"level": level.key, "label": level.label, "params": dict(params), **res})
        occ[level.key] = {k: res["occupancy"].get(k) for k in ("ctas_per_sm", "warps_per_sm", "limited_by")}
        why[level.key] = dict(res.get("why") or {})
        if feasible and not res["feasible"]:
            feasible, reason = False, f"{params.short()} at {level.key}: {res['reason']}"
    return {
        "config_hash": config_hash(config),
        "config": describe(config),
        "device": device.arch,
        "device_name": device.name,
        "smem_per_block": device.smem_per_block,
        "levels": levels,
        "feasible": feasible,
        "reason": reason,
        "smem_estimate_max": max(lv["smem_estimate"] for lv in levels),
        "occupancy": occ,
        "why": why,
    }


def record(store: Store, ws_id: str | None, experiment: int, assessment: dict) -> None:
    """Store the assessment on the experiment and log one event."""
    store.update_experiment(experiment, resources=assessment)
    kb = assessment["smem_estimate_max"] / 1024
    verdict = "feasible" if assessment["feasible"] else f"infeasible: {assessment['reason']}"
    store.event(ws_id, "resources", f"{assessment['config']} on {assessment['device']}: {verdict} "
                f"(max smem estimate {kb:.1f} KB)", {"experiment": experiment, "feasible": assessment["feasible"]})  # fmt: skip


def predicted_change(base_assessment: dict, variant_assessment: dict) -> dict:
    """Shared-memory and occupancy deltas per level, variant minus base: the close-out's "predicted" column.

    Levels are matched by key; a level only one side has is skipped.
    """
    base = {lv["level"]: lv for lv in base_assessment["levels"]}
    out: dict = {}
    for lv in variant_assessment["levels"]:
        b = base.get(lv["level"])
        if b is None:
            continue
        smem_b, smem_v = _smem(b), _smem(lv)
        occ_b, occ_v = b["occupancy"], lv["occupancy"]
        out[lv["level"]] = {
            "smem_base": smem_b,
            "smem_variant": smem_v,
            "smem_delta": smem_v - smem_b,
            "smem_delta_pct": round(100 * (smem_v - smem_b) / smem_b, 1) if smem_b else None,
            "ctas_per_sm_base": occ_b.get("ctas_per_sm"),
            "ctas_per_sm_variant": occ_v.get("ctas_per_sm"),
            "ctas_per_sm_delta": occ_v.get("ctas_per_sm", 0) - occ_b.get("ctas_per_sm", 0),
            "warps_per_sm_base": occ_b.get("warps_per_sm"),
            "warps_per_sm_variant": occ_v.get("warps_per_sm"),
            "warps_per_sm_delta": occ_v.get("warps_per_sm", 0) - occ_b.get("warps_per_sm", 0),
            "limited_by_base": occ_b.get("limited_by"),
            "limited_by_variant": occ_v.get("limited_by"),
            "feasible_variant": lv["feasible"],
        }
    return out


__all__ = ["assess", "predicted_change", "record"]
