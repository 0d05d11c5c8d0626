"""Verdicts near the threshold, simulated over recorded H200 noise: error rates of kinv's decision rules.

    python benchmarks/verdict_simulation.py --n 1000 --out benchmarks/results/verdict_simulation.json

Each simulated investigation runs the same code the graph runs (agent.stats):

1. an A/A of ``aa_arms`` baseline workers x ``aa_rounds`` rounds, analysed by :func:`agent.noise.aa_noise`
   at every level (it yields the between-arm offset SD that enters the A/B's interval);
2. a sequential A/B (:func:`agent.stats.run_sequential`) of one variant against a baseline worker of its
   own, at the 5 levels of #3a, with #3a's plan: threshold 1%, looks at 8, 12, ..., 32 rounds, and the
   per-look confidence corrected for 5 levels x 7 looks x 3 variants.

A sample's log time is ``mu + e + o``: ``e`` is drawn (bootstrap) from the recorded residuals of that level
(``kernels/recordings/h200``: the A/A arms' log times less their arm and round means, rescaled for the
degrees of freedom the means took; they already hold the recorded per-round placement noise), and ``o`` is a
planted per-arm memory-placement offset, normal with SD 0.25%, 0.5% or 0.75%:

* ``re-set`` (the harness kinv ships): the arm is re-set every round, so ``o`` is drawn again every round;
* ``fixed`` (one allocation per worker, kinv before it re-set every sample): ``o`` is drawn once per worker and kept.

The variant's times carry a planted throughput change ``delta`` at every level (time / (1 + delta)).
Reported per condition: false claims under the null (any level improved or regressed, per investigation and
per level), correct decisions at each level, wrong-direction verdicts, and mean rounds per variant.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.measure import (
    noise,
    stats,  # noqa: E402
)

LEVELS = ("b1", "b8", "b32", "b64", "b96")
EFFECTS = (0.0, 0.005, -0.005, 0.01, -0.01, 0.015, -0.015, 0.02, -0.02, 0.05, -0.05)
OFFSET_SDS = (0.0025, 0.005, 0.0075)
PLAN = stats.SequentialPlan(quick_rounds=8, step_rounds=4, max_rounds=32, conf=0.95)
AA_ARMS, AA_ROUNDS, N_VARIANTS, THRESHOLD = 4, 16, 3, 0.01


def recorded_residuals(directory: Path | None = None) -> dict[str, np.ndarray]:
    """Per level (b1..b96): residuals of the recorded A/A arms' log times after arm and round means."""
    from kinv.agent.tools.backends.base import RECORDINGS
    from kinv.agent.tools.backends.replay_index import Recording

    directory = directory or RECORDINGS / "h200"
    rec = Recording(sorted(directory.rglob("*.jsonl.gz")), "mla_decode")
    out = {}
    for _kind, _pair, _role, level in {k for k in rec.cells if k[0] == "aa"}:
        tag = "b" + level.rsplit("/b", 1)[1]
        if tag in out:
            continue
        arms = sorted({k[2] for k in rec.cells if k[0] == "aa" and k[3] == level})
        rounds = sorted(set.intersection(*(set(rec.cells[("aa", "aa", a, level)]) for a in arms)))
        y = np.log([[rec.cells[("aa", "aa", a, level)][r]["us"] for r in rounds] for a in arms])
        k, n = y.shape
        e = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
        out[tag] = (e * math.sqrt(k * n / ((k - 1) * (n - 1)))).ravel()
    return out


def investigation(rng: np.random.Generator, resid: dict[str, np.ndarray], delta: float, offset_sd: float,
                  regime: str, use_offset: bool = True) -> dict:  # fmt: skip
    def draw(shape, level):
        return rng.choice(resid[level], size=shape)

    def arm_offsets(n_arms, rounds):
        if regime == "fixed":
            return np.repeat(rng.normal(0, offset_sd, (n_arms, 1)), rounds, axis=1)
        return rng.normal(0, offset_sd, (n_arms, rounds))

    # A/A: AA_ARMS workers x AA_ROUNDS rounds at every level
    offsets = {}
    for lv in LEVELS:
        logs = draw((AA_ARMS, AA_ROUNDS), lv) + arm_offsets(AA_ARMS, AA_ROUNDS)
        band = noise.aa_noise(100.0 * np.exp(logs), lv, THRESHOLD, PLAN.max_rounds,
                              stats.look_confidence(PLAN, len(LEVELS), N_VARIANTS))  # fmt: skip
        offsets[lv] = band.offset_sd if use_offset else 0.0
    # A/B: a baseline worker and the variant's worker, their own offsets
    base = {lv: draw((PLAN.max_rounds,), lv) + arm_offsets(1, PLAN.max_rounds)[0] for lv in LEVELS}
    var = {lv: draw((PLAN.max_rounds,), lv) + arm_offsets(1, PLAN.max_rounds)[0] - math.log1p(delta) for lv in LEVELS}

    def sample(r):
        return {lv: (100.0 * math.exp(base[lv][r]), 100.0 * math.exp(var[lv][r])) for lv in LEVELS}

    res = stats.run_sequential(sample, list(LEVELS), {lv: THRESHOLD for lv in LEVELS}, PLAN, offset_sd=offsets,
                               n_variants=N_VARIANTS)  # fmt: skip
    return {"levels": {lv: e.verdict for lv, e in res.effects.items()}, "rounds": res.rounds, "verdict": res.verdict}


def condition(args) -> dict:
    delta, offset_sd, regime, use_offset, n, seed = args
    rng = np.random.default_rng(seed)
    resid = recorded_residuals()
    runs = [investigation(rng, resid, delta, offset_sd, regime, use_offset) for _ in range(n)]
    right = "improved" if delta > 0 else "regressed"
    wrong = "regressed" if delta > 0 else "improved"
    per_level = {}
    for lv in LEVELS:
        v = [r["levels"][lv] for r in runs]
        per_level[lv] = {x: v.count(x) / n for x in stats.LEVEL_VERDICTS}
    out = {
        "delta": delta, "offset_sd": offset_sd, "regime": regime, "offset_component": use_offset, "n": n,
        "mean_rounds": float(np.mean([r["rounds"] for r in runs])), "per_level": per_level,
        "variant_verdicts": {x: sum(r["verdict"] == x for r in runs) / n for x in stats.VARIANT_VERDICTS},
    }  # fmt: skip
    if delta == 0:
        out["false_claim_any_level"] = sum(any(v in ("improved", "regressed") for v in r["levels"].values())
                                           for r in runs) / n  # fmt: skip
    else:
        out["correct"] = {lv: per_level[lv][right] for lv in LEVELS}
        out["wrong_direction"] = sum(any(v == wrong for v in r["levels"].values()) for r in runs) / n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="investigations per condition")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the shipped regime at SD 0.5% only")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    conds = []
    sds = (0.005,) if args.quick else OFFSET_SDS
    for i, sd in enumerate(sds):
        for j, d in enumerate(EFFECTS):
            conds.append((d, sd, "re-set", True, args.n, 1000 * i + j))
    if not args.quick:  # one allocation per worker: with and without the offset component in the interval
        for j, d in enumerate((0.0, 0.015, -0.015)):
            conds.append((d, 0.005, "fixed", True, args.n, 5000 + j))
            conds.append((d, 0.005, "fixed", False, args.n, 6000 + j))
    t0 = time.time()
    with ProcessPoolExecutor(args.workers) as ex:
        results = list(ex.map(condition, conds))
    print(f"{len(conds)} conditions x {args.n} investigations in {time.time() - t0:.0f} s\n")
    print("| harness | offset SD | offset in CI | effect | false claims (any level) | correct b1 / b8 / b32 / b64 / b96 "
          "| wrong direction | mean rounds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        corr = " / ".join(f"{r['correct'][lv]:.1%}" for lv in LEVELS) if "correct" in r else "—"
        fc = f"{r['false_claim_any_level']:.1%}" if "false_claim_any_level" in r else "—"
        wd = f"{r['wrong_direction']:.1%}" if "wrong_direction" in r else "—"
        print(f"| {r['regime']} | {r['offset_sd']:.2%} | {'yes' if r['offset_component'] else 'no'} | "
              f"{r['delta']:+.1%} | {fc} | {corr} | {wd} | {r['mean_rounds']:.1f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
