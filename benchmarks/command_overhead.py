"""What the command backend adds per sample: a sample of a trivial command (``python -c 'print({"x": 1})'``)
against the same command run bare with subprocess, N times each, interleaved.

    python benchmarks/command_overhead.py [--n 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinv.agent.tools.backends.command import CommandBackend  # noqa: E402
from kinv.kernels.adapter import get_adapter  # noqa: E402

CMD = ["{python}", "-c", "print('{{\"x\": 1}}')"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    a = ap.parse_args()
    adapter = get_adapter("command")
    level = adapter.level({"k": 1, "_run": {"command": CMD, "metric": {"json_key": "x"}, "timeout_s": 30, "warmup": 0}})
    be = CommandBackend()
    be.log_dir = Path(tempfile.mkdtemp()) / "commands"
    arm = be.open("A", "command", {"kernel": "command"}, {})
    argv = adapter.argv(level)
    bare, kinv = [], []
    for r in range(a.n):
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, text=True, check=True)
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        arm.sample(level, r)
        kinv.append(time.perf_counter() - t0)
    mb, mk = statistics.median(bare), statistics.median(kinv)
    print(f"median of {a.n}: bare run {mb * 1e3:.1f} ms, kinv sample {mk * 1e3:.1f} ms, overhead {(mk - mb) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
