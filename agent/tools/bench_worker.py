"""Benchmark worker: one process per variant, crash-isolated.

The parent (``agent/tools/bench.py``) starts ``python -m agent.tools.bench_worker``
with the variant's environment, then talks JSON lines: one request per line on
stdin, one reply per line on stdout.  If the variant crashes, hits an illegal
address or runs out of memory, only this process dies; the parent reports the
failure as the variant's.

Imports: standard library, torch, triton and ``kernels`` only, so the worker
runs on a GPU machine that has none of kinv's other dependencies.

Requests
--------
``{"op": "hello", "env_keys": [...]}``         fingerprint, hashes, env seen
``{"op": "setup", "kernel", "config", "level"}``  inputs, correctness, graph
``{"op": "sample", "key": key}``                 one sample: median of >= 20 replays lasting >= 25 ms
``{"op": "copy_bandwidth", "mib": 2048}``       device-to-device copy GB/s
``{"op": "exit"}``

Timing (GPU.md "Timing"): each level's launches are captured in one CUDA
graph; the graph cycles through enough input sets that their KV exceeds 3x
the L2, so no launch reads its KV from L2 (stated as ``l2`` in the setup
reply).  A sample is the median over ``replays`` event-timed replays of
the graph (at least 20, and enough for 25 ms of GPU time so that a request's
fixed cost stays under 5%), divided by the launches in it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

MIN_REPLAYS = 20
TARGET_REPLAY_US = 400.0  # a replay should run long enough to dwarf event jitter
MIN_SAMPLE_MS = 25.0  # a sample's replays should dwarf the fixed cost of a request (pipe, events, sync)
MAX_LAUNCHES = 512


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def harness_hash() -> str:
    """Hash of the timing harness itself (this file)."""
    return file_hash(Path(__file__))


def source_on_disk(path: Path, qualname: str) -> str:
    """The source of a function or method as its file says NOW (not what was imported)."""
    import ast

    try:
        text = path.read_text()
        nodes = ast.parse(text).body
    except (OSError, SyntaxError) as exc:
        return f"<{path.name} unreadable: {type(exc).__name__}>"
    node = None
    for part in qualname.split("."):
        node = next((n for n in nodes if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
                     and n.name == part), None)  # fmt: skip
        if node is None:
            return f"<{qualname} missing from {path.name}>"
        nodes = node.body
    return ast.get_source_segment(text, node) or ""


def reference_hash(adapter, root: Path | None = None) -> str:
    """Hash of the adapter's reference and metric definitions, read from disk at each call."""
    from kernels.adapter import project_root

    root = root or project_root()
    src = "".join(source_on_disk(root / f, q) for f, q in adapter.reference_parts)
    return hashlib.sha256(src.encode()).hexdigest()[:12]


def kernel_source_hash(adapter, root: Path | None = None) -> str:
    """Hash of the kernel's source files as they are on disk (what a source patch changes)."""
    from kernels.adapter import project_root

    root = root or project_root()
    h = hashlib.sha256()
    for f in adapter.kernel_files:
        h.update((root / f).read_bytes())
    return h.hexdigest()[:12]


def fingerprint() -> dict:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    fp = {
        "gpu": props.name,
        "arch": f"sm_{props.major}{props.minor}",
        "sms": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or 60 * 2**20,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    try:
        q = "clocks.sm,clocks.mem,clocks.max.sm,driver_version,power.draw,temperature.gpu"
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip().splitlines()[0]  # fmt: skip
        sm, mem, max_sm, driver, power, temp = [x.strip() for x in line.split(",")]
        fp.update(sm_clock_mhz=sm, mem_clock_mhz=mem, max_sm_clock_mhz=max_sm, driver=driver,
                  power_w=power, temp_c=temp)  # fmt: skip
    except Exception as exc:  # nvidia-smi missing: say so, do not guess
        fp["clocks_error"] = str(exc)[:100]
    return fp


class Worker:
    def __init__(self):
        self.levels: dict[str, dict] = {}
        self.adapter = None

    # ---- requests ------------------------------------------------------------
    def hello(self, req: dict) -> dict:
        keys = req.get("env_keys", [])
        return {
            "fingerprint": fingerprint(),
            "pid": os.getpid(),
            "harness_hash": harness_hash(),
            "env": {k: os.environ.get(k) for k in keys},
        }

    def setup(self, req: dict) -> dict:
        import torch

        from kernels.adapter import Level, get_adapter
        from kernels.devices import detect
        from kernels.launch_config import config_hash, validate_config

        adapter = get_adapter(req["kernel"])
        self.adapter = adapter
        config = validate_config(req["config"], adapter.name)
        level = Level(**req["level"])
        params = adapter.params_for(config, level)
        device = detect()
        env = adapter.derived_env(level, params, dict(os.environ))

        t0 = time.perf_counter()
        # ---- correctness on this level's own (fresh, random) inputs ----------
        check_inputs = adapter.make_inputs(level, seed=req.get("seed", 0) + 7919, vary_lengths=True)
        out, compiled = adapter.launch(check_inputs, params)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        ref = adapter.reference(check_inputs)
        err = (out.float() - ref).abs()
        atol, rtol = adapter.tolerance(out.dtype)
        bad = int((err > atol + rtol * ref.abs()).sum())
        rel = float((out.float() - ref).norm() / ref.norm())
        max_abs = float(err.max())
        correct = bad == 0 and math.isfinite(rel)
        resources = adapter.resources(params, level, device, compiled).to_dict()
        del check_inputs, out, ref, err
        reply = {
            "level": level.key,
            "config_hash": config_hash(config),
            "params": params.__dict__,
            "derived_env": env,
            "correct": correct,
            "max_abs_err": max_abs,
            "rel_err": rel,
            "mismatched": bad,
            "resources": resources,
            "compile_s": round(compile_s, 3),
            "reference_hash": reference_hash(adapter),
            "kernel_hash": kernel_source_hash(adapter),
        }
        if not correct:
            return reply

        # ---- timing set-up: rotate input sets past the L2, capture a graph --
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or 60 * 2**20
        per_set = adapter.bytes_moved(level)
        n_sets = max(1, math.ceil(3 * l2 / per_set))
        sets = [adapter.make_inputs(level, seed=req.get("seed", 0) + i) for i in range(n_sets)]
        outs = [adapter.launch(s, params)[0] for s in sets]  # warm: every set once
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for s, o in zip(sets, outs):
            adapter.launch(s, params, out=o)
        end.record()
        torch.cuda.synchronize()
        eager_us = start.elapsed_time(end) * 1000 / n_sets
        launches = min(MAX_LAUNCHES, max(n_sets, math.ceil(TARGET_REPLAY_US / max(eager_us, 1.0))))
        launches = math.ceil(launches / n_sets) * n_sets

        graph, replay_ms = self._capture(adapter, params, sets, outs, launches)
        if replay_ms * MIN_REPLAYS < MIN_SAMPLE_MS and launches < MAX_LAUNCHES:
            # eager timing overstates small launches (Python launch cost): size the graph on its own replay
            want = math.ceil(launches * MIN_SAMPLE_MS / (MIN_REPLAYS * max(replay_ms, 1e-3)))
            launches = min(MAX_LAUNCHES, math.ceil(want / n_sets) * n_sets)
            graph, replay_ms = self._capture(adapter, params, sets, outs, launches)
        replays = max(MIN_REPLAYS, math.ceil(MIN_SAMPLE_MS / max(replay_ms, 1e-3)))
        key = f"{config_hash(config)}:{level.key}"
        self.levels[key] = {"graph": graph, "sets": sets, "outs": outs, "launches": launches, "replays": replays}
        reply.update(
            key=key,
            l2=f"{n_sets} input sets x {per_set / 2**20:.1f} MiB rotated (L2 {l2 / 2**20:.0f} MiB)",
            launches_per_replay=launches,
            replays_per_sample=replays,
            eager_us=round(eager_us, 2),
            bytes=per_set,
            flops=adapter.flops(level),
            setup_s=round(time.perf_counter() - t0, 3),
        )
        return reply

    @staticmethod
    def _capture(adapter, params, sets, outs, launches):
        """Capture ``launches`` launches cycling through the input sets; return (graph, ms per replay)."""
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for i in range(launches):
                    adapter.launch(sets[i % len(sets)], params, out=outs[i % len(sets)])
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return graph, start.elapsed_time(end) / 5

    def sample(self, req: dict) -> dict:
        import torch

        state = self.levels.get(req["key"])
        if state is None:
            raise KeyError(f"{req['key']!r} was not set up; set up: {sorted(self.levels)}")
        replays = max(state["replays"], int(req.get("replays") or 0))
        t_wall = time.perf_counter()
        graph = state["graph"]
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
        for s, e in events:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        per_launch = [s.elapsed_time(e) * 1000 / state["launches"] for s, e in events]
        gpu_s = sum(per_launch) * state["launches"] / 1e6
        return {
            "key": req["key"],
            "us": statistics.median(per_launch),
            "us_min": min(per_launch),
            "us_max": max(per_launch),
            "replays": replays,
            "gpu_s": gpu_s,
            "worker_wall_s": time.perf_counter() - t_wall,
            "t": time.time(),
        }

    def copy_bandwidth(self, req: dict) -> dict:
        import torch

        n = int(req.get("mib", 2048)) * 2**20
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(int(req.get("reps", 20))):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1000)
        t = statistics.median(times)
        del src, dst
        torch.cuda.empty_cache()
        return {"gbps": 2 * n / t / 1e9, "bytes": 2 * n, "median_s": t}

    def drop(self, req: dict) -> dict:
        import torch

        self.levels.pop(req["key"], None)
        torch.cuda.empty_cache()
        return {"dropped": req["key"]}


def main() -> int:
    worker = Worker()
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "exit":
                out.write(json.dumps({"ok": True, "op": "exit"}) + "\n")
                out.flush()
                return 0
            handler = {"hello": worker.hello, "setup": worker.setup, "sample": worker.sample,
                       "copy_bandwidth": worker.copy_bandwidth, "drop": worker.drop}.get(op)  # fmt: skip
            if handler is None:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "op": op, **handler(req)}
        except Exception as exc:  # reported as the variant's failure; fatal CUDA errors end the process
            msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            reply = {"ok": False, "op": req.get("op") if isinstance(req, dict) else None, "error": msg,
                     "trace": traceback.format_exc()[-2000:]}  # fmt: skip
            if "illegal memory access" in msg or "CUDA error" in msg:
                out.write(json.dumps(reply) + "\n")
                out.flush()
                return 70
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
