"""Nsight Compute on a config at a level (the cuda backend's profiler; the profile step that records it is
agent/tools/runners/profiling.py), parsed into the figures that explain a verdict
(the close-out puts them in words: agent/report/resources.py).

``ncu --csv --page raw`` prints, after the profiled program's own output, a header row (``"ID",...``), a units row
and one row per profiled launch.  :func:`parse_raw` reads that; :func:`summarize` keeps, as the mean over the
launches, DRAM and memory throughput, achieved and theoretical occupancy, the block limits, waves per SM, issued
and eligible warps per cycle, the duration, the DRAM bytes moved and the three largest stall reasons.  :func:`run` profiles one config
at one level (agent/tools/worker/profile_target.py is the process profiled: checked, warmed, L2-rotated) and never
raises: where ncu is missing or fails it returns the one line that says so.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

#: raw metric -> the name kinv stores it under
METRICS = {
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__occupancy_limit_registers": "limit_registers",
    "launch__occupancy_limit_shared_mem": "limit_shared_mem",
    "launch__occupancy_limit_warps": "limit_warps",
    "launch__occupancy_limit_blocks": "limit_blocks",
    "launch__waves_per_multiprocessor": "waves",
    "launch__registers_per_thread": "registers",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "smsp__issue_active.avg.per_cycle_active": "issued_per_cycle",
    "smsp__warps_eligible.avg.per_cycle_active": "eligible_per_cycle",
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes.sum": "dram_bytes",
}
#: metrics asked for beside the sections (the sections do not report them in the raw page)
EXTRA_METRICS = ("dram__bytes.sum",)
#: a byte count's unit as ncu prints it -> bytes
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats", "MemoryWorkloadAnalysis")
TIMEOUT_S = 300.0
#: how a reason that skips the whole step ends (no profiler, or the profiler failed)
SKIPPED = "the profile step was skipped"


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw(text: str) -> list[dict]:
    """One dict per profiled launch: ``{kernel, <METRICS names>, stalls: {reason: warps per issue}}``."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    head, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    col = {name: i for i, name in enumerate(head)}
    units = rows[1] if len(rows) > 1 and len(rows[1]) == len(head) else [""] * len(head)
    out = []
    for r in data:
        got = {"kernel": r[col["Kernel Name"]] if "Kernel Name" in col else ""}
        for raw, name in METRICS.items():
            if raw in col:
                got[name] = _num(r[col[raw]])
                if name == "dram_bytes" and got[name] is not None:  # ncu scales a byte count (Kbyte, Mbyte, ...)
                    got[name] *= BYTE_UNITS.get(units[col[raw]].strip(), 1)
        got["stalls"] = {k[len(STALL[0]):-len(STALL[1])]: v for k, i in col.items()
                         if k.startswith(STALL[0]) and k.endswith(STALL[1]) and "not_issued" not in k
                         and (v := _num(r[i])) is not None}  # fmt: skip
        out.append(got)
    return out


def summarize(launches: list[dict]) -> dict | None:
    """The mean of each figure over the profiled launches, the block limit that binds, and the top three stalls."""
    if not launches:
        return None
    out: dict = {"launches": len(launches)}
    for name in METRICS.values():
        vals = [x[name] for x in launches if x.get(name) is not None]
        if vals:
            out[name] = round(sum(vals) / len(vals), 3)
    limits = {k.removeprefix("limit_"): out[k] for k in ("limit_registers", "limit_shared_mem", "limit_warps",
                                                          "limit_blocks") if k in out}  # fmt: skip
    if limits:
        out["ctas_per_sm"] = int(min(limits.values()))
        out["limited_by"] = min(limits, key=lambda k: limits[k]).replace("shared_mem", "shared memory").replace(
            "blocks", "CTA slots").replace("warps", "threads")
    stalls: dict[str, float] = {}
    for x in launches:
        for k, v in x.get("stalls", {}).items():
            stalls[k] = stalls.get(k, 0.0) + v / len(launches)
    out["top_stalls"] = [[k.replace("_", " "), round(v, 2)] for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:3]]
    return out


def available() -> str | None:
    """The ncu executable (``KINV_NCU`` or on PATH), or None."""
    return os.environ.get("KINV_NCU") or shutil.which("ncu")


def run(adapter, config: dict, level, env: dict, pythonpath: list[str] | None = None,
        launches: int = 3) -> tuple[dict | None, str, float]:  # fmt: skip
    """Profile ``config`` at ``level``: ``(summary or None, why not, wall seconds on the GPU machine)``."""
    ncu = available()
    if ncu is None:
        return None, "Nsight Compute (ncu) is not installed here; the profile step was skipped", 0.0
    pattern = getattr(adapter, "profile_kernels", None) or ".*"
    job = json.dumps({"kernel": adapter.name, "config": config, "level": level.to_dict(), "launches": launches})
    from kinv import IMPORT_ROOT

    run_env = {**os.environ, **{k: str(v) for k, v in env.items()}}
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in [*(pythonpath or []), IMPORT_ROOT, run_env.get("PYTHONPATH", "")] if p)
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--kernel-name", f"regex:{pattern}",
           *[a for s in SECTIONS for a in ("--section", s)], "--metrics", ",".join(EXTRA_METRICS),
           "--csv", "--page", "raw",
           sys.executable, "-m", "kinv.agent.tools.worker.profile_target", job]  # fmt: skip
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"ncu did not finish ({type(exc).__name__}); the profile step was skipped", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    summary = summarize(parse_raw(proc.stdout))
    if proc.returncode != 0 or summary is None:
        tail = next((ln for ln in reversed((proc.stderr or proc.stdout).splitlines()) if ln.strip()), "")
        return None, f"ncu failed (exit {proc.returncode}: {tail[:200]}); the profile step was skipped", wall
    return summary, "", wall


__all__ = ["METRICS", "available", "parse_raw", "run", "summarize"]
