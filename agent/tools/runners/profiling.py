"""The profile step: the baseline and each decided variant profiled (``Backend.profile``: Nsight Compute on the
cuda backend, agent/tools/backends/profile.py) at the level where its verdict's effect is largest, and the figures
stored with the experiment."""

from __future__ import annotations

from kinv.agent.tools.backends.profile import SKIPPED


def step(store, ws: str, backend, adapter, env: dict, baseline: dict, decided: list[tuple[int, str, dict, dict]],
         levels) -> list[str]:  # fmt: skip
    """Profile the baseline (in ``env``) and each decided variant (``(experiment, variant id, config, its environment)``) at the level where its
    verdict's effect is largest, and store the figures; returns one line per skip or failure (never raises for a
    profiler's failure).  The baseline is profiled once per level."""
    from kinv.kernels.launch_config import config_hash

    by_key = {lv.key: lv for lv in levels}
    notes: list[str] = []
    seen: dict[str, tuple[dict | None, str, float]] = {}
    charged: set[str] = set()  # levels whose baseline profile's seconds are already in the ledger
    for exp, vid, cfg, var_env in decided:
        rows = [r for r in store.verdicts(exp) if r.get("effect") is not None and r["level"] in by_key]
        if not rows:
            continue
        lv = by_key[max(rows, key=lambda r: abs(r["effect"]))["level"]]
        if lv.key not in seen:
            seen[lv.key] = backend.profile(adapter, baseline, lv, env)
        for arm, config, got in (("baseline", baseline, seen[lv.key]), (vid, cfg, None)):
            figures, why, secs = got or backend.profile(adapter, config, lv, var_env)
            if figures is None:
                if why.endswith(SKIPPED):  # no profiler here, or it failed: one line for the whole step
                    return [why[0].upper() + why[1:]]
                notes.append(f"{vid} at {lv.label}: {arm} not profiled: {why}")
                continue
            if arm == "baseline":
                secs, _ = (0.0 if lv.key in charged else secs), charged.add(lv.key)
            store.add_profile(ws, exp, "base" if arm == "baseline" else "variant", config_hash(config), lv.key,
                              figures, backend.name, secs)  # fmt: skip
        store.event(ws, "profile", f"{vid} profiled at {lv.label}", {"experiment": exp, "level": lv.key})
    return notes


__all__ = ["step"]
