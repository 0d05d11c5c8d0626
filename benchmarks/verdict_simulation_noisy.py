"""The decision rules at end-to-end noise: ±5% run to run, as a serving benchmark's tokens/s (the seed's ±5-7%).

    python benchmarks/verdict_simulation_noisy.py --n 1000

Simulated, not measured: each sample's log time is normal with SD ``--sd`` (default 2.55%: 95% of single runs
within ±5%), plus a per-arm offset re-drawn every round (SD ``--offset``).  Each investigation runs the code the
graph runs (agent.stats): an A/A of 2 arms x 8 rounds per level, then a sequential A/B at 3 levels with the
noise-appropriate plan a command benchmark would set: threshold 3%, looks at 8, 12, ..., 48 rounds, the per-look
confidence corrected for 3 levels x the looks x 2 variants.  Reported: false claims under the null (any level
improved or regressed, per investigation) and, for a true change of 1.5x the margin, the share of levels decided
in the right direction, with the mean rounds.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.measure import (
    noise,
    stats,  # noqa: E402
)

LEVELS = ("C1", "C32", "C96")
THRESHOLD, AA_ARMS, AA_ROUNDS, N_VARIANTS = 0.03, 2, 8, 2
PLAN = stats.SequentialPlan(quick_rounds=8, step_rounds=4, max_rounds=48, conf=0.95)


def investigation(rng, delta: float, sd: float, offset: float) -> dict:
    offsets = {}
    look = stats.look_confidence(PLAN, len(LEVELS), N_VARIANTS)
    for lv in LEVELS:
        logs = rng.normal(0, sd, (AA_ARMS, AA_ROUNDS)) + rng.normal(0, offset, (AA_ARMS, AA_ROUNDS))
        offsets[lv] = noise.aa_noise(100.0 * np.exp(logs), lv, THRESHOLD, PLAN.max_rounds, look).offset_sd
    n = PLAN.max_rounds
    base = {lv: rng.normal(0, sd, n) + rng.normal(0, offset, n) for lv in LEVELS}
    var = {lv: rng.normal(0, sd, n) + rng.normal(0, offset, n) - math.log1p(delta) for lv in LEVELS}

    def sample(r):
        return {lv: (100.0 * math.exp(base[lv][r]), 100.0 * math.exp(var[lv][r])) for lv in LEVELS}

    res = stats.run_sequential(sample, list(LEVELS), {lv: THRESHOLD for lv in LEVELS}, PLAN, offset_sd=offsets,
                               n_variants=N_VARIANTS)  # fmt: skip
    return {"levels": {lv: e.verdict for lv, e in res.effects.items()}, "rounds": res.rounds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--sd", type=float, default=0.0255)
    ap.add_argument("--offset", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    null = [investigation(rng, 0.0, a.sd, a.offset) for _ in range(a.n)]
    false = sum(any(v in ("improved", "regressed") for v in r["levels"].values()) for r in null) / a.n
    print(f"null: false claims {false:.2%} of {a.n} investigations; mean rounds {np.mean([r['rounds'] for r in null]):.1f}")
    for delta in (1.5 * THRESHOLD, -1.5 * THRESHOLD):
        runs = [investigation(rng, delta, a.sd, a.offset) for _ in range(a.n)]
        right = "improved" if delta > 0 else "regressed"
        share = np.mean([v == right for r in runs for v in r["levels"].values()])
        wrong = np.mean([v == ("regressed" if delta > 0 else "improved") for r in runs for v in r["levels"].values()])
        print(f"true change {delta:+.1%}: right {share:.2%} of levels, wrong direction {wrong:.2%}; "
              f"mean rounds {np.mean([r['rounds'] for r in runs]):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
