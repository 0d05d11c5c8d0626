"""Where a campaign's wall time goes, and how much of it more GPUs could take.

    python benchmarks/campaign_critical_path.py benchmarks/results/ray_campaign_h200/local/kinv.db --wall 225.8 \
        --gpus 2 4 --out benchmarks/results/ray_campaign_h200/critical_path_local.json

It reads a one-GPU campaign's state database (a copy: the file given is never opened for writing) through
kinv's store: the graph's node runs, the events and the campaign row.  It splits the wall time into parts:

* ``startup``: the process before the campaign's first record.  This is ``--wall`` minus the campaign's span,
  and it is left out when no ``--wall`` is given.
* ``setup``: the campaign's own set-up, up to the first screening.
* ``screening``: each backlog item's screening.  Its candidates and levels are independent trials.
* per workstream, from the node runs:
  - ``correctness``: the baseline's correctness check at every level, and each variant's (the gate node);
  - ``env``: the baseline worker's start and environment check;
  - ``noise``: the A/A rounds;
  - ``worker starts``: a variant's arms starting, up to their environment checks;
  - ``rounds``: the paired A/B rounds;
  - ``closeout`` and ``other``: the close-out, and the graph's own bookkeeping.

Then it bounds the wall time on N GPUs.  The bound keeps the campaign's chain of dependent steps as it is. Each
workstream needs the previous one's adoption, and each variant is decided before the next.  The bound is
optimistic:
* the parts done per level (correctness, noise, rounds) take ``ceil(L / N) / L`` of their one-GPU time, with
  L levels dealt to N GPUs;
* screening takes ``1 / N``;
* the rest stays serial;
* starting Ray and its actors costs nothing.
A second bound also runs a workstream's finalists at once, one per GPU.
Speculation is not in either bound. For example, screening the next backlog item while the current workstream
is still deciding could change which item comes next.

Standard library and kinv's store only (runs anywhere the project is installed).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.store.db import Store  # noqa: E402

LEVEL_PARTS = ("correctness", "noise", "rounds")


def _times(events: list[dict], kind: str, t0: float, t1: float) -> list[float]:
    return [e["t"] for e in events if e["kind"] == kind and t0 <= e["t"] <= t1]


def workstream_parts(runs: list[dict], events: list[dict]) -> tuple[dict, int, float]:
    """One workstream's seconds by part, how many variants it measured, and its gates' seconds."""
    parts = dict.fromkeys(("correctness", "env", "noise", "worker starts", "rounds", "closeout", "other"), 0.0)
    variants, gates = 0, 0.0
    for r in runs:
        t0, t1 = r["started"], r["finished"]
        span = t1 - t0
        if r["node"] == "baseline":
            ok = min(_times(events, "correctness.ok", t0, t1), default=t0)
            parts["correctness"] += ok - t0
            parts["env"] += t1 - ok
        elif r["node"] == "noise":
            parts["noise"] += span
        elif r["node"] == "gate":
            parts["correctness"] += span
            gates += span
        elif r["node"] == "measure":
            variants += 1
            started = max(_times(events, "env.ok", t0, t1), default=t0)
            parts["worker starts"] += started - t0
            parts["rounds"] += t1 - started
        elif r["node"] == "closeout":
            parts["closeout"] += span
        else:
            parts["other"] += span
    return parts, variants, gates


def analyse(state_dir: Path, wall: float | None, gpus: list[int]) -> dict:
    store = Store(state_dir, create=False)
    campaigns = store.campaigns()
    if len(campaigns) != 1:
        raise SystemExit(f"{state_dir}: expected one campaign in the database, found {len(campaigns)}")
    camp = campaigns[0]
    events = store.events(limit=100000)
    steps = [s for s in camp["steps"] if s.get("ws")]
    levels = {k for s in steps for k in (s.get("levels") or {})}
    span = camp["updated"] - camp["created"]
    parts = {"startup": max(0.0, wall - span) if wall else 0.0, "setup": 0.0, "screening": 0.0}
    # "#7a: BTSWEEP (Token-tile sweep (BLOCK_T)): screening BLOCK_T" (not "#7: screening on 2 Ray actors")
    screen_starts = [e["t"] for e in events if e["kind"] == "campaign" and "): screening " in e["message"]]
    screen_ends = [e["t"] for e in events if e["kind"] == "campaign" and " screened (" in e["message"]]
    if screen_starts:
        parts["setup"] = min(screen_starts) - camp["created"]
    for a, b in zip(sorted(screen_starts), sorted(screen_ends), strict=False):
        parts["screening"] += b - a
    runs = {s["ws"]: store.node_runs(s["ws"]) for s in steps}
    per_ws, finalists, gates = {}, {}, {}
    for ws, ws_runs in runs.items():
        ws_events = [e for e in events if e["workstream"] == ws]
        per_ws[ws], finalists[ws], gates[ws] = workstream_parts(ws_runs, ws_events)
    for p in next(iter(per_ws.values()), {}):
        parts[p] = sum(w[p] for w in per_ws.values())
    end = max((r["finished"] for ws_runs in runs.values() for r in ws_runs), default=camp["updated"])
    parts["tail"] = max(0.0, camp["updated"] - end)
    total = sum(parts.values())
    out = {"state": str(state_dir), "campaign": camp["id"], "wall_s": wall, "span_s": span, "levels": len(levels),
           "parts_s": {k: round(v, 2) for k, v in parts.items()}, "accounted_s": round(total, 2),
           "workstreams": {ws: {k: round(v, 2) for k, v in p.items()} for ws, p in per_ws.items()},
           "variants": finalists, "bounds": {}}  # fmt: skip
    base = wall or total
    for n in gpus:
        level_share = math.ceil(len(levels) / n) / len(levels) if levels else 1.0
        spread = sum(parts[p] for p in LEVEL_PARTS) * level_share + parts["screening"] / n
        serial = total - sum(parts[p] for p in LEVEL_PARTS) - parts["screening"]
        t_levels = serial + spread
        # finalists at once: every measured variant's worker starts, gate and rounds run beside the first's
        saved = 0.0
        for ws, p in per_ws.items():
            k = finalists[ws]
            if k > 1:
                share = (min(k, n) - 1) / k  # the part of the variants' time that overlaps the others'
                var_level = (p["rounds"] + gates[ws]) * level_share
                saved += share * (var_level + p["worker starts"])
        out["bounds"][str(n)] = {
            "level_share": round(level_share, 3),
            "levels_spread_s": round(t_levels, 1),
            "speedup_levels_spread": round(base / t_levels, 2),
            "with_finalists_at_once_s": round(t_levels - saved, 1),
            "speedup_with_finalists_at_once": round(base / (t_levels - saved), 2),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", help="kinv.db of a one-GPU campaign (read from a copy)")
    ap.add_argument("--wall", type=float, help="the run's measured wall time in seconds (the process, end to end)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--out")
    args = ap.parse_args()
    src = Path(args.db)
    if not src.is_file():
        print(f"kinv: no database at {src}: give the kinv.db of a campaign's state dir", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(src, Path(tmp) / "kinv.db")
        result = analyse(Path(tmp), args.wall, args.gpus)
    result["state"] = str(src)
    base = result["wall_s"] or result["accounted_s"]
    print(f"campaign {result['campaign']}: {base:.1f} s, {result['levels']} levels")
    for k, v in result["parts_s"].items():
        print(f"  {k:14s} {v:7.1f} s  {100 * v / base:5.1f}%")
    for n, b in result["bounds"].items():
        print(f"  {n} GPUs: levels spread {b['levels_spread_s']:.1f} s ({b['speedup_levels_spread']:.2f}x); "
              f"with finalists at once {b['with_finalists_at_once_s']:.1f} s "
              f"({b['speedup_with_finalists_at_once']:.2f}x)")  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
