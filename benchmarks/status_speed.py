"""`kinv status` wall time on a store with 50 experiments and 10,000 samples, against a bare `python -c pass`.

    python benchmarks/status_speed.py [--runs N]

Both are whole processes (python start included), run alternately in the same loop so a loaded machine slows
both alike; the figure is the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.demo_store import populate_demo  # noqa: E402
from kinv.agent.store.db import Store  # noqa: E402


def wall(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=31, help="runs of each (default 31)")
    runs = ap.parse_args().runs
    d = tempfile.mkdtemp()
    populate_demo(Store(d), n_experiments=50, n_samples=10000)
    env = dict(os.environ, KINV_STATE_DIR=d, PYTHONPATH=str(ROOT))
    status, bare = [], []
    for _ in range(runs):
        status.append(wall([sys.executable, "-m", "kinv.agent.cli.app", "status"], env))
        bare.append(wall([sys.executable, "-c", "pass"], env))
    s, b = statistics.median(status), statistics.median(bare)
    print(f"kinv status, 50 experiments / 10,000 samples: median {s * 1e3:.0f} ms, min {min(status) * 1e3:.0f} ms; "
          f"python -c pass: median {b * 1e3:.0f} ms, min {min(bare) * 1e3:.0f} ms; "
          f"ratio of medians {s / b:.1f}x over {runs} runs each (whole process, python start included)")


if __name__ == "__main__":
    main()
