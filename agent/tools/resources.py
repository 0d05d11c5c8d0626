"""Feasibility and the "why" figures of a config: shared memory, occupancy, splits, tiles.

The seed's lesson lives here.  DeepSeek-V4-Flash has 64 attention heads; at
attention TP 4 each GPU holds 64 / 4 = 16 of them, so a head tile of
BLOCK_H = 16 covers them.  In the seed, a stale BLOCK_H = 32 assumption
estimated 80 KB of shared memory per CTA; the correct 16 gave 60 KB (the
seed's estimator; the calibrated model of ``kernels/mla_decode_adapter.py``
gives smaller figures, 48.5 KB vs 32.5 KB at two stages).  So the head tile
is derived from the model (:func:`local_heads`, :func:`block_h_for`), never
assumed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from kernels.adapter import KernelAdapter, Level
from kernels.devices import DeviceSpec
from kernels.launch_config import config_hash, describe

if TYPE_CHECKING:
    from agent.store import Store

BLOCK_H_BOUNDS = (16, 32, 64, 128)
WHY_KEYS = ("tile", "mma_tile", "num_splits", "iterations_per_split", "ctas", "waves")


class ResourceError(ValueError):
    """A model shape or level that cannot be assessed; one line naming the value."""


def local_heads(model_heads: int, attention_tp: int) -> int:
    """Heads one GPU holds: ``model_heads / attention_tp`` (64 heads at TP 4 -> 16)."""
    for name, value in (("model_heads", model_heads), ("attention_tp", attention_tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResourceError(f"{name}={value!r} is invalid: must be a positive integer")
    if model_heads % attention_tp:
        valid = [d for d in range(1, model_heads + 1) if model_heads % d == 0]
        raise ResourceError(
            f"{model_heads} heads do not split evenly over attention_tp={attention_tp}; "
            f"valid attention_tp: {', '.join(map(str, valid))}"
        )
    return model_heads // attention_tp


def block_h_for(local_heads: int, bounds: tuple[int, ...] = BLOCK_H_BOUNDS) -> int:
    """The smallest head tile covering ``local_heads`` (16 -> 16, 17..32 -> 32), capped at the largest bound.

    Above the cap the kernel loops over several head tiles.
    """
    if isinstance(local_heads, bool) or not isinstance(local_heads, int) or local_heads < 1:
        raise ResourceError(f"local_heads={local_heads!r} is invalid: must be a positive integer")
    if not bounds:
        raise ResourceError("bounds is empty; give the valid BLOCK_H values, e.g. (16, 32, 64, 128)")
    ordered = sorted(bounds)
    return next((b for b in ordered if b >= local_heads), ordered[-1])


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
        raise ResourceError("no levels to assess; give at least one workload level")
    config = adapter.validate_config(config)
    levels, occ, why = [], {}, {}
    feasible, reason = True, ""
    for level in plan_levels:
        params = adapter.params_for(config, level)
        res = adapter.resources(params, level, device).to_dict()
        levels.append({"level": level.key, "batch": level.batch, "params": asdict(params), **res})
        occ[level.key] = {k: res["occupancy"].get(k) for k in ("ctas_per_sm", "warps_per_sm", "limited_by")}
        why[level.key] = {k: res["why"][k] for k in WHY_KEYS if k in res["why"]}
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


__all__ = ["ResourceError", "assess", "block_h_for", "local_heads", "predicted_change", "record"]
