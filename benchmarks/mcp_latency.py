"""Tool-call latency of `kinv mcp` through the MCP SDK's own client (target: median < 300 ms).

    python benchmarks/mcp_latency.py [--state-dir DIR] [--calls 50]

Starts `kinv mcp` as a real stdio subprocess, with a state dir that holds a closed #3a (a replay run of
plans/3a-attention-occupancy.yaml is made first when DIR has none), and times `status` and `todos 3a` calls
end to end at the client: request out, JSON-RPC over the pipe, the server's store reads, structured result back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def measure(state: Path, calls: int) -> dict:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(os.environ, KINV_FORCE_NO_GPU="1")
    params = StdioServerParameters(command=sys.executable, args=["-m", "kinv.agent.cli.app", "mcp", "--state-dir", str(state)],
                                   env=env, cwd=str(ROOT))  # fmt: skip
    out = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            t0 = time.perf_counter()
            await s.initialize()
            out["initialize_ms"] = (time.perf_counter() - t0) * 1e3
            for name, args in (("status", {}), ("todos", {"ws": "3a"})):
                await s.call_tool(name, args)  # first call: imports
                ms = []
                for _ in range(calls):
                    t = time.perf_counter()
                    r = await s.call_tool(name, args)
                    ms.append((time.perf_counter() - t) * 1e3)
                    assert not r.isError, r.content
                ms.sort()
                out[name] = {"median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * len(ms)) - 1],
                             "max_ms": ms[-1], "calls": calls}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="kinv-mcp-"))
    if not (state / "kinv.db").exists():
        cfg = Path(tempfile.mkdtemp(prefix="kinv-cfg-"))
        (cfg / "mla_decode.json").write_bytes((ROOT / "kernels" / "configs" / "mla_decode.json").read_bytes())
        subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "run", "plans/3a-attention-occupancy.yaml", "--backend",
                        "replay", "--approval", "auto", "--state-dir", str(state)], cwd=ROOT, check=True,
                       env=dict(os.environ, KINV_FORCE_NO_GPU="1", TRITON_INTERPRET="1", KINV_CONFIG_DIR=str(cfg)),
                       stdout=subprocess.DEVNULL)  # fmt: skip
    res = asyncio.run(measure(state, args.calls))
    res["cores"] = os.cpu_count()
    print(json.dumps(res, indent=2))
    ok = all(res[k]["median_ms"] < 300 for k in ("status", "todos"))
    print(f"status median {res['status']['median_ms']:.1f} ms, todos median {res['todos']['median_ms']:.1f} ms "
          f"(target < 300 ms): {'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
