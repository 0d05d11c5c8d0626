"""A realistic #3a state store at any size: the seed's occupancy investigation (noise, V1 and V2 rejected, V3 moot).

Shared by the `kinv status` benchmark (benchmarks/status_speed.py: 50 experiments, 10,000 samples) and the
read-path tests (tests/agent/report/test_views.py and the terminal tests), which fill small ones.
"""

from __future__ import annotations

import math
import random

from kinv.agent.store.db import Store

LEVELS = [f"v4flash/h16/p64/ctx4096/b{b}" for b in (1, 8, 32, 64, 96)]
BASE_US = {lv: us for lv, us in zip(LEVELS, (21.0, 24.0, 38.0, 61.0, 88.0), strict=True)}
# the seed: V1 (num_warps 8) regressed 14-18% at low concurrency, 3-7% at high; V2 (num_stages 3) ~10% at C=64
SLOWDOWN = {"V1": (1.17, 1.15, 1.07, 1.05, 1.04), "V2": (1.01, 1.02, 1.03, 1.099, 1.02), "noise": (1.0,) * 5}
VERDICT = {"noise": ("equivalent", "A/A equivalent at every level: noise band 2.5-3.4%"),
           "V1": ("reject", "regressed at every level (b1 -17%, b8 -15%, b32 -7%, b64 -5%, b96 -4%)"),
           "V2": ("reject", "regressed at b64 (-9.9%), equivalent elsewhere")}  # fmt: skip
V1_DIFF = """--- kernels/configs/mla_decode.json
+++ kernels/configs/mla_decode.json
@@ -3,3 +3,3 @@
   "BLOCK_H": 16,
-  "num_warps": 4,
+  "num_warps": 8,
   "num_stages": 2
"""


def populate_demo(store: Store, n_experiments: int = 50, n_samples: int = 10000, seed: int = 0) -> dict:
    """Fill ``store`` with workstreams #3a (the seed's occupancy A/B) and #3b, their todos, ``n_experiments``
    experiments on #3a (noise, then V1 and V2 alternating) holding ``n_samples`` samples in all, per-level
    verdicts and noise bands, env checks, one pending and one decided approval, and two backups.

    Returns the ids it made: {"experiments": [...], "by_variant": {variant: [ids]}, "approval": id, ...}.
    """
    rng = random.Random(seed)
    store.upsert_workstream({
        "id": "#3a", "parent": "#3", "parent_title": "Decode throughput ceiling (~845 tok/s/GPU at C=96)",
        "title": "Attention-kernel occupancy A/B on the MLA split-K decode kernel", "kernel": "mla_decode",
        "hypothesis": "KV gathers stall the warps: more warps or stages should hide the latency",
        "status": "closed", "backend": "replay", "approval": "auto", "baseline_hash": "b45e11ne0000",
        "recommendation": "OEA: Opportunistic Expert Activation (decode time outside attention)",
        "report_path": "plans/3a-attention-occupancy.closeout.md"})  # fmt: skip
    store.upsert_workstream({"id": "#3b", "parent": "#3", "title": "BLOCK_T sweep with fewer stages",
                             "kernel": "mla_decode", "status": "planned", "backend": "replay"})  # fmt: skip
    todos = [
        ("#3a.noise", None, "Measure the noise band (A/A)", "Measuring the noise band (A/A)", "completed",
         "band 2.5-3.4% per level; threshold 6.8%", "high"),
        ("#3a.V1", None, "V1: num_warps 8", None, "completed", "rejected: regressed at every level", "high"),
        ("#3a.V2", None, "V2: num_stages 3", None, "completed", "rejected: -9.9% at b64", "medium"),
        ("#3a.V3", "#3a.V1", "V3: batch-aware warps (4 at batch <= 8, 8 above)", None, "cancelled",
         "moot: V1 regressed at every level", "low"),
    ]  # fmt: skip
    for pos, (tid, parent, content, active, st, reason, prio) in enumerate(todos):
        store.upsert_todo({"id": tid, "workstream": "#3a", "parent": parent, "content": content,
                           "active_form": active, "status": st, "reason": reason, "priority": prio,
                           "position": pos})  # fmt: skip
    store.upsert_todo({"id": "#3b.T32", "workstream": "#3b", "content": "Test BLOCK_T 32 with num_stages 1",
                       "status": "pending", "priority": "medium", "position": 0})  # fmt: skip

    n_experiments = max(1, n_experiments)
    per_exp = [n_samples // n_experiments + (1 if i < n_samples % n_experiments else 0) for i in range(n_experiments)]
    exp_ids: list[int] = []
    by_variant: dict[str, list[int]] = {}
    for i in range(n_experiments):
        variant = "noise" if i == 0 else ("V1", "V2")[(i - 1) % 2]
        kind = "noise" if variant == "noise" else "ab"
        verdict, reason = VERDICT[variant]
        rows = []
        cells = [(lv, arm) for lv in LEVELS for arm in ("A", "B")]
        rounds = math.ceil(per_exp[i] / len(cells)) if per_exp[i] else 0
        for k in range(per_exp[i]):
            r, (lv, arm) = divmod(k, len(cells))[0], cells[k % len(cells)]
            slow = SLOWDOWN[variant][LEVELS.index(lv)] if arm == "B" else 1.0
            rows.append({"round": r, "arm": arm, "level": lv, "us": BASE_US[lv] * slow * rng.lognormvariate(0, 0.03),
                         "replays": 50, "gpu_s": 0.002, "harness_hash": "h4rness", "reference_hash": "r3f",
                         "config_hash": "base" if arm == "A" else f"cfg-{variant}", "backend": "replay",
                         "env": {"seen": {"TARGET_CTAS": "512"}}, "t": 1.7e9 + k})  # fmt: skip
        eid = store.new_experiment(
            workstream="#3a", todo=f"#3a.{variant}", variant=None if variant == "noise" else variant, kind=kind,
            backend="replay", config_hash="base" if variant == "noise" else f"cfg-{variant}",
            base_config_hash="base", status="done", verdict=verdict, reason=reason, rounds=rounds,
            gpu_s=0.002 * per_exp[i], wall_s=1.5 * rounds,
            resources={"smem_bytes": 61440 if variant != "V2" else 82944, "registers": 168, "spills": 0},
            correctness={"ok": True, "max_abs_err": 3.1e-3, "atol": 2e-2} if variant != "noise" else None,
            diff=V1_DIFF if variant == "V1" else None)  # fmt: skip
        for j in range(0, len(rows), 2000):
            for row in rows[j : j + 2000]:
                row["experiment"] = eid
            store.add_samples(rows[j : j + 2000])
        if kind == "noise":
            store.add_noise(eid, "#3a", [{"level": lv, "band": 0.025 + 0.002 * n, "cv": 0.03, "n_pairs": rounds,
                                          "equivalent": 1, "effect": 0.001, "ci_low": -0.01, "ci_high": 0.012}
                                         for n, lv in enumerate(LEVELS)])  # fmt: skip
        else:
            vs = []
            for n, lv in enumerate(LEVELS):
                ratio = 1 / SLOWDOWN[variant][n]
                eff = math.log(ratio)
                v = "regressed" if eff < -0.068 else ("equivalent" if abs(eff) < 0.03 else "undecided")
                vs.append({"level": lv, "n": rounds, "base_us": BASE_US[lv], "variant_us": BASE_US[lv] / ratio,
                           "effect": eff, "ci_low": eff - 0.02, "ci_high": eff + 0.02, "ratio": ratio,
                           "threshold": 0.068, "verdict": v})  # fmt: skip
            store.add_verdicts(eid, vs)
        store.add_env_check(workstream="#3a", experiment=eid, source="worker", expected={"TARGET_CTAS": "512"},
                            seen={"TARGET_CTAS": "512"}, ok=1, mismatch=None)  # fmt: skip
        exp_ids.append(eid)
        by_variant.setdefault(variant, []).append(eid)

    store.add_approval(id="ap-3a-V2", workstream="#3a", todo="#3a.V2", variant="V2", kind="config",
                       diff=V1_DIFF.replace("num_warps", "num_stages"), resources={"smem_bytes": 82944},
                       hypothesis="a deeper pipeline hides the gather latency", status="approved")  # fmt: skip
    store.add_approval(
        id="ap-3b-T32",
        workstream="#3b",
        todo="#3b.T32",
        variant="T32",
        kind="config",
        diff='--- a\n+++ b\n-  "BLOCK_T": 16,\n+  "BLOCK_T": 32,\n',
        resources={"smem_bytes": 98304, "fits": True},
        hypothesis="larger tiles amortize softmax",
    )
    b1 = store.add_backup("kernels/configs/mla_decode.json", "state/backups/1-mla_decode.json", "abc123", "#3a")
    b2 = store.add_backup("kernels/configs/mla_decode.json", "state/backups/2-mla_decode.json", "abc123", "#3a")
    return {"experiments": exp_ids, "by_variant": by_variant, "approval": "ap-3b-T32", "backups": [b1, b2]}
