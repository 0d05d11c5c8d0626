"""How often ``kinv regress`` decides a revision against itself as improved or regressed (a false claim), on replay.

Each self-comparison is a git repository made here whose committed mla_decode config is one config recorded in a
sweep of kernels/recordings/ (every config of the space timed by independent workers in every round), compared
against itself: ``kinv regress HEAD HEAD --kernel mla_decode --backend replay`` with the whole protocol (A/A, the
correctness gate on both snapshots, the sequential A/B, margins of plans/regress/margins.yaml with the rounds capped
at what the sweeps recorded).  Replay serves recorded samples: each comparison pairs two real workers of one config
(the sweep's R0 and R1), so comparisons of different configs are different data, and a comparison repeated on the
same config would replay the same samples (it is run once).  The shipped level-conditional config is one of them.

    PYTHONPATH=. python benchmarks/regress_false_claims.py            # every recorded config (28 comparisons)
    PYTHONPATH=. python benchmarks/regress_false_claims.py --limit 20

Writes benchmarks/results/regress_false_claims_replay.json: per comparison its config, the verdict at each level
and the exit code; the false-claim rate over comparisons and over levels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARGINS = """kernels:
  mla_decode:
    plan: plans/3a-attention-occupancy.yaml
    stats: {threshold: 0.01, conf: 0.95, aa_rounds: 16, aa_arms: 4, quick_rounds: 8, step_rounds: 4, max_rounds: 24}
"""


def recorded_configs() -> list[dict]:
    """Every config a sweep recording of mla_decode holds (once each), then the shipped config."""
    from kinv.agent.tools.backends.replay_index import Recording
    from kinv.kernels.launch_config import config_hash

    rec = Recording.load(sorted((ROOT / "kernels" / "recordings").rglob("*.jsonl.gz")), "mla_decode")
    swept = set().union(*rec.sweeps)
    out = [rec.configs[h] for h in sorted(swept) if h in rec.configs]
    shipped = {k: v for k, v in json.loads((ROOT / "kernels/configs/mla_decode.json").read_text()).items()
               if k != "description"}  # fmt: skip
    if config_hash(shipped) not in swept:
        out.append(shipped)
    return out


def make_repo(where: Path, config: dict) -> Path:
    def git(*a):
        subprocess.run(["git", "-C", str(where), *a], check=True, capture_output=True)

    shutil.copytree(ROOT / "kernels", where / "kernels", ignore=shutil.ignore_patterns("__pycache__", "recordings"))
    (where / "plans" / "regress").mkdir(parents=True)
    shutil.copy(ROOT / "plans" / "3a-attention-occupancy.yaml", where / "plans")
    (where / "plans" / "regress" / "margins.yaml").write_text(MARGINS)
    (where / "kernels" / "configs" / "mla_decode.json").write_text(json.dumps(config, indent=2) + "\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.email=b@example.com", "-c", "user.name=bench", "commit", "-qm", "a recorded config")
    return where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=0, help="at most this many comparisons (0: every recorded config)")
    ap.add_argument("--only", default="", help="only the recorded config this label names (e.g. BT16/BH16/w4/s2)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/regress_false_claims_replay.json"))
    args = ap.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("KINV_FORCE_NO_GPU", "1")
    from kinv.agent.store.db import Store
    from kinv.agent.tools.runners import bench, regress, regress_prepare
    from kinv.kernels.launch_config import describe

    configs = recorded_configs()
    if args.only:
        configs = [c for c in configs if describe(c) == args.only]
    if args.limit:
        configs = configs[: args.limit]
    be = bench.get_backend("replay")
    rows = []
    t_all = time.time()
    with tempfile.TemporaryDirectory(prefix="kinv-false-claims-") as tmp:
        store = Store(Path(tmp) / "state")
        for i, cfg in enumerate(configs):
            repo = make_repo(Path(tmp) / f"repo{i}", cfg)
            t0 = time.time()
            try:
                prep = regress_prepare.prepare(repo, "HEAD", "HEAD", be, None, ["mla_decode"], Path(tmp) / f"snap{i}")
                comp = regress.run(store, prep, be)
            except Exception as exc:  # noqa: BLE001 - a config replay cannot serve is counted apart, not as a claim
                rows.append({"config": describe(cfg), "error": f"{type(exc).__name__}: {exc}"})
                print(f"{i + 1:2d} {describe(cfg)}: not measured ({exc})", flush=True)
                continue
            k = comp.kernels[0]
            levels = {lv.label: lv.verdict for lv in k.levels}
            claimed = sorted(lb for lb, v in levels.items() if v in ("improved", "regressed"))
            rows.append({"config": describe(cfg), "verdict": k.verdict, "outcome": comp.outcome, "levels": levels,
                         "reason": k.reason,
                         "rounds": k.rounds, "claimed": claimed, "wall_s": round(time.time() - t0, 1),
                         "changes": {lv.label: [lv.change, lv.ci_low, lv.ci_high] for lv in k.levels}})  # fmt: skip
            print(f"{i + 1:2d} {describe(cfg)}: {k.verdict} ({', '.join(f'{a}:{b}' for a, b in levels.items())}) "
                  f"{k.rounds} rounds, {time.time() - t0:.0f} s", flush=True)  # fmt: skip
    done = [r for r in rows if "error" not in r]
    n_levels = sum(len(r["levels"]) for r in done)
    claims = [r for r in done if r["claimed"]]
    level_claims = sum(len(r["claimed"]) for r in done)
    summary = {
        "comparisons": len(done), "not_measured": len(rows) - len(done),
        "false_claims": len(claims), "false_claim_rate": len(claims) / len(done) if done else None,
        "levels": n_levels, "level_false_claims": level_claims,
        "level_false_claim_rate": level_claims / n_levels if n_levels else None,
        "outcomes": {o: sum(1 for r in done if r["outcome"] == o) for o in ("ok", "undecided", "regressed", "failed")},
        "wall_s": round(time.time() - t_all, 1), "backend": be.loud,
        "command": "PYTHONPATH=. python benchmarks/regress_false_claims.py",
    }  # fmt: skip
    Path(args.out).write_text(json.dumps({"summary": summary, "comparisons": rows}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
