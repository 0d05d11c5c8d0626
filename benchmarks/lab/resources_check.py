"""The analytical resource model against the compiler, over a campaign plan's whole space, on a GPU.

    python3 benchmarks/lab/resources_check.py --plan plans/7-decode-ceiling.yaml \
        --out benchmarks/results/resources_check_h200.json

Every config of the plan's space, at every level of its workload: the config's kernel is compiled by one launch
on a small stand-in of the level (what is compiled does not depend on the batch), no timing.  Beside what the
model says without the compiler (shared memory estimated, registers unknown) it prints what the compiled kernel
implies: registers per thread, spills, shared memory, CTAs per SM and the limit that binds, and waves.  The
summary counts the levels where the model's CTAs per SM, limiter or waves differ from the compiled ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kinv.agent.models import load_plan  # noqa: E402
from kinv.agent.tools.space import space_configs  # noqa: E402
from kinv.kernels.devices import detect  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default="plans/7-decode-ceiling.yaml")
    ap.add_argument("--workstream", default="plans/3a-attention-occupancy.yaml",
                    help="a workstream plan whose baseline and variants (plain patches) are checked too")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    plan, _ = load_plan(args.plan)
    ws, _ = load_plan(args.workstream)
    extra = [ws.baseline] + [{**ws.baseline, **v.patch} for v in ws.variants
                             if isinstance(v.patch, dict) and "overrides" not in v.patch]  # fmt: skip
    adapter, device, levels = plan.adapter, detect(), plan.levels()
    if device is None:
        print("resources_check.py: no CUDA GPU visible; the compiler's figures need one", file=sys.stderr)
        return 2
    compiled_by: dict[tuple, object] = {}  # launch parameters -> the compiled kernel (one compile each)
    rows, t0 = [], time.time()
    for cfg in [*space_configs(plan), *extra]:
        for lv in levels:
            params = adapter.params_for(cfg, lv)
            key = tuple(sorted(dict(params).items())) + (lv.shape,)
            if key not in compiled_by:
                inputs = adapter.make_inputs(adapter.level({**lv.dims, "batch": 1}), seed=1)
                compiled_by[key] = adapter.launch(inputs, params)[1]
            model = adapter.resources(params, lv, device).to_dict()
            real = adapter.resources(params, lv, device, compiled_by[key]).to_dict()
            m, r = model["occupancy"], real["occupancy"]
            rows.append({"level": lv.key, "params": dict(params), "smem_estimate": model["smem_estimate"],
                         "smem_compiled": real["smem_compiled"], "registers": real["registers"],
                         "spills": real["spills"], "model": {"ctas_per_sm": m.get("ctas_per_sm"),
                         "limited_by": m.get("limited_by"), "waves": model["why"].get("waves")},
                         "compiled": {"ctas_per_sm": r.get("ctas_per_sm"), "limited_by": r.get("limited_by"),
                         "waves": real["why"].get("waves")}})  # fmt: skip
            x = rows[-1]
            print(f"{lv.key:24s} {params.short():22s} regs {x['registers']:>4} spills {x['spills']} smem "
                  f"{x['smem_estimate']}/{x['smem_compiled']}  CTAs/SM {m.get('ctas_per_sm')}->{r.get('ctas_per_sm')} "
                  f"({m.get('limited_by')}->{r.get('limited_by')})  waves {x['model']['waves']}->{x['compiled']['waves']}",
                  flush=True)  # fmt: skip
    n = len(rows)
    diff = {f: sum(1 for x in rows if x["model"][f] != x["compiled"][f]) for f in ("ctas_per_sm", "limited_by", "waves")}
    smem_err = max(abs(x["smem_estimate"] - x["smem_compiled"]) / x["smem_compiled"] for x in rows)
    summary = {"levels_checked": n, "compiles": len(compiled_by), "differ": diff, "smem_worst_rel_err": smem_err,
               "ctas_ratio_compiled_over_model": sorted({round(x["compiled"]["ctas_per_sm"] / x["model"]["ctas_per_sm"], 3)
                                                         for x in rows if x["model"]["ctas_per_sm"]}),
               "seconds": round(time.time() - t0, 1)}  # fmt: skip
    print("# " + json.dumps(summary))
    Path(args.out).write_text(json.dumps({"device": device.to_dict(), "plan": args.plan, "summary": summary,
                                          "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
