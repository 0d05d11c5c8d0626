"""The compiler's figures of a config, from a set-up's resources: a pure transform of what a worker's ``compile``
request (or a recording) reports, shared by the cuda backend and the round loop's close of an A/B."""

from __future__ import annotations


def compiled_figures(res: dict | None) -> dict | None:
    """The compiler's figures from one set-up's resources (``KernelAdapter.resources`` with the compiled kernel):
    registers per thread, spills, shared memory per CTA, CTAs per SM and the limit that binds (threads, registers,
    shared memory, CTA slots), the CTAs each limit allows, and waves (the adapter's ``why``).  ``None`` when the
    kernel was not compiled (the interpreter, a replay without a recording of it)."""
    if not res or (res.get("registers") is None and res.get("smem_compiled") is None):
        return None
    occ = res.get("occupancy") or {}
    return {"registers": res.get("registers"), "spills": res.get("spills"), "smem": res.get("smem_compiled"),
            "ctas_per_sm": occ.get("ctas_per_sm"), "warps_per_sm": occ.get("warps_per_sm"),
            "limited_by": occ.get("limited_by"), "limits": occ.get("limits") or {},
            "waves": (res.get("why") or {}).get("waves")}  # fmt: skip


def compiled_of(setups_by_arm: dict[str, dict]) -> dict:
    """``{level: {arm: figures}}`` from arms' set-up records (``{arm: {level: setup}}``), levels with figures."""
    out: dict = {}
    for arm, setups in setups_by_arm.items():
        for level, s in (setups or {}).items():
            figs = s.get("compiled") or compiled_figures(s.get("resources"))  # replay serves recorded figures
            if figs:
                out.setdefault(level, {})[arm] = figs
    return out
