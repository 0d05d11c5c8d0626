"""Where a run's wall time went: graph nodes (kinv.db node_runs), GPU seconds in samples, and the benchmark
workers' start, set-up and request times (the cuda backend's lines in kinv.log).

    python3 benchmarks/wall_breakdown.py STATE_DIR [--json]
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

READY = re.compile(r"arm (\S+): (new|kept) worker pid \d+ ready in ([\d.]+) s")
SETUP = re.compile(r"arm (\S+): set up \S+ in ([\d.]+) s")
CLOSE = re.compile(r"arm (\S+): (\d+) samples, ([\d.]+) GPU s in ([\d.]+) s of requests \(memory re-set ([\d.]+) s\)")


def breakdown(state: Path) -> dict:
    db = sqlite3.connect(state / "kinv.db")
    nodes: dict[str, float] = defaultdict(float)
    first, last = None, None
    for node, started, finished in db.execute("select node, started, finished from node_runs where finished is not null"):
        nodes[node] += finished - started
        first = started if first is None else min(first, started)
        last = finished if last is None else max(last, finished)
    gpu = db.execute("select coalesce(sum(gpu_s), 0), count(*) from samples").fetchone()
    out = {"graph_wall_s": round((last or 0) - (first or 0), 2), "nodes_s": {k: round(v, 2) for k, v in nodes.items()},
           "gpu_s_in_samples": round(gpu[0], 2), "samples": gpu[1],
           "workers": {"new": 0, "kept": 0, "ready_s": 0.0}, "setups": 0, "setup_s": 0.0,
           "request_s": 0.0, "reset_s": 0.0}  # fmt: skip
    log = state / "kinv.log"
    for line in log.read_text().splitlines() if log.is_file() else []:
        if m := READY.search(line):
            out["workers"][m[2]] += 1
            out["workers"]["ready_s"] += float(m[3])
        elif m := SETUP.search(line):
            out["setups"] += 1
            out["setup_s"] += float(m[2])
        elif m := CLOSE.search(line):
            out["request_s"] += float(m[4])
            out["reset_s"] += float(m[5])
    for k in ("setup_s", "request_s", "reset_s"):
        out[k] = round(out[k], 2)
    out["workers"]["ready_s"] = round(out["workers"]["ready_s"], 2)
    if out["gpu_s_in_samples"]:
        out["wall_per_gpu_s"] = round(out["graph_wall_s"] / out["gpu_s_in_samples"], 2)
    return out


def main(argv: list[str]) -> int:
    if not argv or not (Path(argv[0]) / "kinv.db").is_file():
        print(f"usage: wall_breakdown.py STATE_DIR [--json]; {argv[0] if argv else 'no state dir'!r} holds no kinv.db")
        return 2
    b = breakdown(Path(argv[0]))
    if "--json" in argv:
        print(json.dumps(b, indent=1))
        return 0
    w = b["workers"]
    print(f"graph wall {b['graph_wall_s']} s; GPU s in samples {b['gpu_s_in_samples']} ({b['samples']} samples); "
          f"wall / GPU s {b.get('wall_per_gpu_s')}")
    print("nodes: " + ", ".join(f"{k} {v} s" for k, v in sorted(b["nodes_s"].items(), key=lambda x: -x[1])))
    print(f"workers: {w['new']} started, {w['kept']} kept ones taken; {w['ready_s']} s until ready (summed over arms "
          f"started together); {b['setups']} level set-ups {b['setup_s']} s; sample requests {b['request_s']} s "
          f"(memory re-set {b['reset_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
