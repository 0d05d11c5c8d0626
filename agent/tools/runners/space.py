"""A campaign's search space: every config of the space, and which of them the resource model prunes.

Shared by the campaign (agent/campaign/) and the sweep recorder (benchmarks/record.py --sweep), so the
replay recordings cover exactly the configs a campaign can propose.
"""

from __future__ import annotations

import itertools

from kinv.kernels.errors import ConfigError
from kinv.kernels.launch_config import config_hash


def space_configs(plan, names: list[str] | None = None, around: dict | None = None) -> list[dict]:
    """Every config of the plan's campaign space, in a stable order.  ``names`` limits the search to those
    tunables, the others held at ``around`` (a uniform config, default the plan's baseline)."""
    adapter = plan.adapter
    space = plan.search_space()
    fixed = {k: v for k, v in (around or plan.baseline).items() if k in adapter.spec.names}
    keys = [k for k in space if names is None or k in names]
    out, seen = [], set()
    for values in itertools.product(*(space[k] for k in keys)):
        cfg = {**fixed, **dict(zip(keys, values)), "kernel": adapter.name}
        try:
            cfg = adapter.validate_config(cfg)
        except ConfigError:
            continue  # a restriction between tunables rules it out
        h = config_hash(cfg)
        if h not in seen:
            seen.add(h)
            out.append(cfg)
    return out


def feasibility(plan, config: dict) -> tuple[bool, str]:
    """(feasible, reason) of a uniform config at every level of the plan, by the resource model."""
    from kinv.agent.tools.runners import resources
    from kinv.kernels.devices import get_device

    a = resources.assess(plan.adapter, config, plan.levels(), get_device(plan.device))
    return a["feasible"], a["reason"]
