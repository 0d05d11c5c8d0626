"""The process Nsight Compute profiles: one config at one level, checked, warmed, then launched inside a
profiler range over input sets larger than L2 (so every profiled launch reads its data from DRAM).

    ncu --profile-from-start off ... python -m kinv.agent.tools.worker.profile_target JOB_JSON

``JOB_JSON`` is ``{"kernel", "config", "level", "launches"}``.  The correctness gate runs first
(agent/tools/worker/gate.py): a wrong kernel is never profiled (exit 1, one line).  Only torch, triton, the
standard library and kinv.kernels are imported, as in the benchmark worker.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import torch

    from kinv.agent.tools.worker.gate import check
    from kinv.kernels.adapter import get_adapter

    job = json.loads(argv[0])
    adapter = get_adapter(job["kernel"])
    config = adapter.validate_config(job["config"])
    level = adapter.level(job["level"])
    params = adapter.params_for(config, level)
    gate = check(adapter, config, [level], seed=0, device="cuda")
    if not gate["ok"]:
        print(f"kinv: {params.short()} at {level.key} fails the correctness check ({gate['reason']}); not profiled",
              file=sys.stderr)  # fmt: skip
        return 1
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or 60 * 2**20
    n_sets = max(2, -(-3 * l2 // max(1, adapter.bytes_moved(level))))
    sets = [adapter.make_inputs(level, seed=1 + i) for i in range(min(n_sets, 64))]
    out = adapter.make_output(sets[0], params)
    scratch = adapter.make_scratch(sets[0], params)
    launches = int(job.get("launches", 3))

    def launch(inputs):
        if scratch is None:
            adapter.launch(inputs, params, out=out)
        else:
            adapter.launch(inputs, params, out=out, scratch=scratch)

    for i in range(len(sets)):  # warm: compiled, caches and clocks past their first launch
        launch(sets[i])
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for i in range(launches):
        launch(sets[(i * 7 + 3) % len(sets)])
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(json.dumps({"level": level.key, "config": params.short(), "launches": launches, "input_sets": len(sets)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
