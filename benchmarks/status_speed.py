"""`kinv status` wall time on a store with 50 experiments and 10,000 samples.

    python benchmarks/status_speed.py
"""

from __future__ import annotations

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

d = tempfile.mkdtemp()
populate_demo(Store(d), n_experiments=50, n_samples=10000)
env = dict(os.environ, KINV_STATE_DIR=d, PYTHONPATH=str(ROOT))
times = []
for _ in range(7):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "status"], env=env, capture_output=True, check=True)
    times.append(time.perf_counter() - t0)
print(f"kinv status, 50 experiments / 10,000 samples: median {statistics.median(times):.3f} s, "
      f"min {min(times):.3f} s over {len(times)} runs (whole process, python start included)")
