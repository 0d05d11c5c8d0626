"""A campaign's configs per level: the incumbent as each level runs it, and one config that runs a chosen config
at each level (the most common choice as its base, overrides for the rest)."""

from __future__ import annotations

from kinv.agent.errors import CampaignError
from kinv.agent.plan import Plan
from kinv.kernels.launch_config import config_hash, effective


def uniform(adapter, config: dict) -> dict:
    """The config without its overrides (what runs where no override matches)."""
    return adapter.validate_config({k: v for k, v in config.items() if k not in ("overrides", "description")})


def per_level(plan: Plan, config: dict) -> dict[str, dict]:
    """level key -> the uniform config that runs there."""
    return {lv.key: effective(plan.adapter, config, lv) for lv in plan.levels()}


def compose(plan: Plan, by_level: dict[str, dict]) -> dict:
    """One config that runs ``by_level[level]`` at each level: the most common choice as the base and an
    override for each run of neighbouring levels that differs, over ranges of the kernel's override dimension
    that cover the values between the levels too (b9-32 for the level b32 after b8)."""
    adapter = plan.adapter
    levels = plan.levels()
    hashes = {k: config_hash(c) for k, c in by_level.items()}
    if len(set(hashes.values())) == 1:
        return uniform(adapter, next(iter(by_level.values())))
    dims = [d for d in adapter.spec.override_dims
            if len({lv.dims.get(d) for lv in levels}) == len(levels)]  # fmt: skip
    if not dims:
        raise CampaignError(f"{adapter.name}'s overrides cannot tell these levels apart; set campaign.per_level: false")
    d = dims[0]
    order = sorted(levels, key=lambda lv: lv.dims[d])
    counts: dict[str, int] = {}
    for lv in order:
        counts[hashes[lv.key]] = counts.get(hashes[lv.key], 0) + 1
    # the config of the most levels is the base (a tie goes to the one of the largest level)
    base_hash = max(counts, key=lambda h: (counts[h], max(i for i, lv in enumerate(order) if hashes[lv.key] == h)))
    base = next(by_level[k] for k, h in hashes.items() if h == base_hash)
    overrides, i = [], 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and hashes[order[j + 1].key] == hashes[order[i].key]:
            j += 1
        h = hashes[order[i].key]
        if h != base_hash:
            cfg = by_level[order[i].key]
            ov = {}
            if i > 0:
                ov[f"{d}_min"] = order[i - 1].dims[d] + 1
            if j < len(order) - 1:
                ov[f"{d}_max"] = order[j].dims[d]
            ov.update({k: cfg[k] for k in adapter.spec.names if cfg[k] != base[k]})
            overrides.append(ov)
        i = j + 1
    out = adapter.validate_config({**uniform(adapter, base), "overrides": overrides})
    got = per_level(plan, out)
    assert all(config_hash(got[k]) == hashes[k] for k in hashes), "composed config does not resolve as chosen"
    return out


def with_params(plan: Plan, incumbent: dict, params: dict) -> dict:
    """The incumbent with ``params`` set at every level (its other tunables keep their per-level values)."""
    by = {k: {**c, **params} for k, c in per_level(plan, incumbent).items()}
    by = {k: plan.adapter.validate_config(c) for k, c in by.items()}
    return compose(plan, by)


def patch_of(adapter, config: dict) -> dict:
    """A variant patch that yields ``config`` whatever the baseline (every tunable, and its overrides)."""
    p = {k: config[k] for k in adapter.spec.names}
    if config.get("overrides"):
        p["overrides"] = config["overrides"]
    return p
