"""Benchmark worker: one process per variant, crash-isolated.

The parent (``agent/tools/measure/bench.py``) starts ``python -m agent.tools.bench_worker``
with the variant's environment, then talks JSON lines: one request per line on
stdin, one reply per line on stdout.  If the variant crashes, hits an illegal
address or runs out of memory, only this process dies; the parent reports the
failure as the variant's.

Imports: standard library, torch, triton, ``kernels`` and the correctness gate
(``agent/tools/measure/correctness.py``, which imports no more) only, so the worker runs
on a GPU machine that has none of kinv's other dependencies.

Requests
--------
``{"op": "hello", "env_keys": [...]}``         fingerprint, hashes, env seen
``{"op": "setup", "kernel", "config", "level", "reset"}``  correctness, graph sizing
``{"op": "sample", "key", "seed"}``              re-set (inputs from seed), one sample: median of >= 20 replays, >= 25 ms
``{"op": "check", "kernel", "config", "levels", "seed", "device"}``  the correctness gate, in this process
``{"op": "compile", "kernel", "config", "level"}``  compile and launch once (no timing): the compiler's resources
``{"op": "verify", "key", "seed"}``             the timed graph replayed on new inputs written into its own
                                                buffers, its outputs saved for the judge
``{"op": "copy_bandwidth", "mib": 2048}``       device-to-device copy GB/s
The judge's requests (a worker that never set up or checked a kernel; agent/tools/measure/judge.py):
``{"op": "settle", "kernel", "result"}``        a deferred check judged here
``{"op": "judge", "kernel", "level", "saved"}``  saved outputs against the reference of each input set
``{"op": "ceilings"}``                          copy bandwidth, the yardstick's, matrix peak per dtype
``{"op": "exit"}``

Nothing in this process judges a kernel it launched: outputs are saved to a file and judged by the judge, a
process that never imported the kernel under test.  What this process does time, it checks: every function it
relies on (its timer, torch's and the standard library's functions it calls, its own handlers) is fingerprinted
before any kernel module is imported and compared after every set-up and sample (a kernel that rebinds one, or
changes its code in place, is caught and named), and every sample also times a yardstick, a device copy of a
fixed size, with the same events: a yardstick faster than the card can move bytes says the timer is not to be
believed.

Timing (docs/gpu.md, "Timing"): each level's launches are captured in one CUDA
graph; the graph cycles through enough input sets that their KV exceeds 3x
the L2, so no launch reads its KV from L2 (stated as ``l2`` in the setup
reply).  A sample is the median over ``replays`` event-timed replays of
the graph (at least 20, and enough for 25 ms of GPU time so that a request's
fixed cost stays under 5%), divided by the launches in it.

Every sample re-sets the arm first (``reset``, the default): the previous
inputs, outputs, scratch buffers and graph are freed, new ones are allocated
behind a pad of random size, and the graph is captured again.  One fixed
allocation shifts an arm's times by a constant placement offset of up to
~1% (docs/gpu.md, "memory placement"); re-drawing it every sample makes rounds
independent replicates.  ``reset: false`` keeps one allocation for the
whole run (the old protocol, kept to measure the difference).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from kinv.agent.tools.measure.correctness import _clone, _poison, code_changed, code_snapshot, judge

MIN_REPLAYS = 20
TARGET_REPLAY_US = 400.0  # a replay should run long enough to dwarf event jitter
MIN_SAMPLE_MS = 25.0  # a sample's replays should dwarf the fixed cost of a request (pipe, events, sync)
MAX_LAUNCHES = 512
YARD_MIB = 256  # the yardstick: a device copy of this size, timed in every sample with the sample's own events
YARD_REPS = 3


def code_text(text: str) -> str:
    """A Python file's code without what never runs: comments, docstrings, blank lines and trailing spaces.

    Rewording a docstring or a comment leaves a file's hash, and so the recordings keyed by it, as they were;
    any change to code changes it.  Positions come from ``tokenize`` (comments) and ``ast`` (docstrings),
    which agree across Python versions, so a GPU worker and a CPU machine hash the same file alike.  Text
    that does not parse is returned whole (hashed byte for byte)."""
    import ast
    import io
    import tokenize

    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, tokenize.TokenError, ValueError):
        return text
    cuts = [(t.start, t.end) for t in tokens if t.type == tokenize.COMMENT]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                cuts.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
    lines = text.splitlines()
    for (r0, c0), (r1, c1) in sorted(cuts, reverse=True):
        head, tail = lines[r0 - 1][:c0], lines[r1 - 1][c1:]
        lines[r0 - 1 : r1] = [head + tail]
    return "\n".join(line.rstrip() for line in lines if line.strip())


_PARSE_LOCK = threading.Lock()  # CPython 3.11's ast.parse is not safe in threads at once (arms open in threads)
_CODE_HASHES: dict[bytes, str] = {}  # a file's bytes digest -> its code hash (a file is parsed once per content)


def file_hash(path: Path) -> str:
    """Hash of a file as it runs: a Python file's code (:func:`code_text`), any other file's bytes."""
    data = path.read_bytes()
    if path.suffix != ".py":
        return hashlib.sha256(data).hexdigest()[:12]
    digest = hashlib.sha256(data).digest()
    with _PARSE_LOCK:
        if digest not in _CODE_HASHES:
            code = code_text(data.decode("utf-8", errors="surrogateescape"))
            _CODE_HASHES[digest] = hashlib.sha256(code.encode("utf-8", errors="surrogateescape")).hexdigest()[:12]
        return _CODE_HASHES[digest]


def harness_hash() -> str:
    """Hash of the timing harness itself (this file's code)."""
    return file_hash(Path(__file__))


def source_on_disk(path: Path, qualname: str) -> str:
    """The source of a function or method as its file says NOW (not what was imported)."""
    import ast

    try:
        text = path.read_text()
        with _PARSE_LOCK:
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
    root = root or adapter.root()
    src = "".join(source_on_disk(root / f, q) for f, q in adapter.reference_parts)
    return hashlib.sha256(src.encode()).hexdigest()[:12]


def kernel_source_hash(adapter, root: Path | None = None) -> str:
    """Hash of the kernel's source files' code as it is on disk (what a source patch changes; a comment or a
    docstring does not: :func:`code_text`)."""
    root = root or adapter.root()
    h = hashlib.sha256()
    for f in adapter.kernel_files:
        h.update(file_hash(root / f).encode())
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


def yardstick(reps: int = YARD_REPS, mib: int = YARD_MIB, bufs: list | None = None) -> list[float]:
    """GB/s of ``reps`` device copies of ``mib`` MiB, each timed by its own pair of events (the timer under test)."""
    import torch

    bufs = [] if bufs is None else bufs
    if not bufs:  # kept by the caller between samples: the yardstick allocates nothing in a timed sample
        src = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda").random_(0, 255)
        bufs.extend([src, torch.empty_like(src)])
    src, dst = bufs[0], bufs[1]
    dst.copy_(src)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        dst.copy_(src)
        e.record()
    torch.cuda.synchronize()
    return [2 * src.numel() / (s.elapsed_time(e) / 1000) / 1e9 for s, e in events]


def _refill(inputs: dict, fresh: dict) -> None:
    """Write ``fresh``'s tensors into ``inputs``' own buffers (the same addresses, new values)."""
    for k, t in fresh.items():
        old = inputs.get(k)
        if hasattr(t, "copy_") and hasattr(old, "copy_"):
            if tuple(old.shape) != tuple(t.shape):
                raise ValueError(f"input {k!r} of shape {tuple(old.shape)} cannot take new values of {tuple(t.shape)}")
            old.copy_(t)


class Worker:
    def __init__(self):
        from kinv.agent.tools.measure import correctness

        self.code = code_snapshot()  # before any kernel module is imported: a kernel that changes these is caught
        correctness._FIRST_SNAPSHOT = self.code  # the gate's check in this process compares with the same
        self.yard_bufs: list = []
        self.levels: dict[str, dict] = {}
        self.adapter = None
        self.imported: dict[str, str] = {}  # kernel -> hash of its source when this process first imported it

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

        from kinv.kernels.adapter import get_adapter
        from kinv.kernels.devices import detect
        from kinv.kernels.launch_config import config_hash

        adapter = get_adapter(req["kernel"])
        self.adapter = adapter
        # the source this process imported: a worker kept for a later arm reports that, not what is on disk now
        imported = self.imported.setdefault(req["kernel"], kernel_source_hash(adapter))
        config = adapter.validate_config(req["config"])  # the adapter's own rules, as everywhere else
        level = adapter.level(req["level"])
        params = adapter.params_for(config, level)
        device = detect()
        env = adapter.derived_env(level, params, dict(os.environ))
        seed = int(req.get("seed", 0))

        t0 = time.perf_counter()
        # ---- the level's own (fresh, random) inputs, output poisoned: saved for the judge ----------------
        check_seed = seed + 7919
        check_inputs = adapter.make_inputs(level, seed=check_seed, vary_lengths=True)
        out, compiled = adapter.launch(check_inputs, params)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        _poison(out)  # a launch that writes nothing leaves NaN, never an earlier result (every output of a tuple)
        out, compiled2 = adapter.launch(check_inputs, params, out=out)
        compiled = compiled or compiled2
        torch.cuda.synchronize()
        saved = _save([out], [{"seed": check_seed, "vary_lengths": True}])
        replaced = code_changed(self.code)
        resources = adapter.resources(params, level, device, compiled).to_dict()
        del check_inputs, out
        reply = {
            "level": level.key,
            "config_hash": config_hash(config),
            "params": dict(params),
            "derived_env": env,
            "correct": not replaced,
            "check": saved,
            "reason": (f"the kernel changed the harness's code in memory ({', '.join(replaced)})" if replaced
                       else ""),
            "tampered": replaced,
            "resources": resources,
            "compile_s": round(compile_s, 3),
            "reference_hash": reference_hash(adapter),
            "kernel_hash": imported,
        }
        if replaced:
            return reply

        # ---- timing set-up: size the graph once; every sample re-sets the arm (see _reset) ----
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or 60 * 2**20
        per_set = adapter.bytes_moved(level)
        n_sets = max(1, math.ceil(3 * l2 / per_set))
        st = {"adapter": adapter, "params": params, "level": level, "seed": seed, "n_sets": n_sets,
              "reset": bool(req.get("reset", True)), "rounds": 0, "launches": n_sets}  # fmt: skip
        self._allocate(st, 0)
        sets, outs, scratch = st["sets"], st["outs"], st["scratch"]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for s, o, sc in zip(sets, outs, scratch):
            self._launch(adapter, s, params, o, sc)
        end.record()
        torch.cuda.synchronize()
        eager_us = start.elapsed_time(end) * 1000 / n_sets
        launches = min(MAX_LAUNCHES, max(n_sets, math.ceil(TARGET_REPLAY_US / max(eager_us, 1.0))))
        st["launches"] = math.ceil(launches / n_sets) * n_sets
        replay_ms = self._capture(st)
        if replay_ms * MIN_REPLAYS < MIN_SAMPLE_MS and st["launches"] < MAX_LAUNCHES:
            # eager timing overstates small launches (Python launch cost): size the graph on its own replay
            want = math.ceil(st["launches"] * MIN_SAMPLE_MS / (MIN_REPLAYS * max(replay_ms, 1e-3)))
            st["launches"] = min(MAX_LAUNCHES, math.ceil(want / n_sets) * n_sets)
            replay_ms = self._capture(st)
        st["replays"] = max(MIN_REPLAYS, math.ceil(MIN_SAMPLE_MS / max(replay_ms, 1e-3)))
        key = f"{config_hash(config)}:{level.key}"
        self.levels[key] = st
        reply.update(
            key=key,
            l2=f"{n_sets} input sets x {per_set / 2**20:.1f} MiB rotated (L2 {l2 / 2**20:.0f} MiB)",
            protocol="re-set every sample" if st["reset"] else "one allocation for the whole run",
            launches_per_replay=st["launches"],
            replays_per_sample=st["replays"],
            eager_us=round(eager_us, 2),
            bytes=per_set,
            working_set=per_set * n_sets,
            l2_bytes=l2,
            flops=adapter.flops(level),
            setup_s=round(time.perf_counter() - t0, 3),
        )
        return reply

    @staticmethod
    def _launch(adapter, inputs, params, out, scratch):
        if scratch is None:
            return adapter.launch(inputs, params, out=out)
        return adapter.launch(inputs, params, out=out, scratch=scratch)

    def _allocate(self, st: dict, round_index: int, seed: int | None = None) -> None:
        """Fresh inputs, outputs and scratch for a round, at a placement of their own.

        The previous round's buffers and graph are freed and the allocator's cache is emptied first, and
        a pad of random size is held for the round, so the new buffers land at new addresses: a fixed
        placement shifts an arm's times by a constant offset (docs/gpu.md, "memory placement"), and a new one
        every round turns that offset into round-to-round noise that the paired statistics can see.
        The input data come from ``seed``: the caller gives both arms of a round the same seed, so what
        the data do to the time (the page order of the block table, say) is common to the pair and
        cancels in its log-ratio, while the placement is the arm's own.
        """
        import random

        import torch

        for k in ("graph", "sets", "outs", "scratch", "pad"):
            st.pop(k, None)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        adapter, params, level = st["adapter"], st["params"], st["level"]
        rng = random.Random(f"{os.getpid()}:{st['seed']}:{round_index}")
        st["pad"] = torch.empty(rng.randrange(0, 64 * 2**20, 4096), dtype=torch.uint8, device="cuda")
        base = st["seed"] if seed is None else int(seed)
        sets = [adapter.make_inputs(level, seed=base + i) for i in range(st["n_sets"])]
        first_out, _ = adapter.launch(sets[0], params)
        outs = [first_out] + [_empty_like(first_out) for _ in sets[1:]]
        scratch = [adapter.make_scratch(s, params) for s in sets]
        st.update(sets=sets, outs=outs, scratch=scratch)

    def _capture(self, st: dict, timed: bool = True) -> float | None:
        """Capture ``launches`` launches cycling through the input sets; return ms per replay.

        A sample's re-set (``timed`` false) only needs the graph uploaded before its timed replays: one
        untimed replay does that, and the set-up's warm-up and sizing replays (eight) are not repeated."""
        import torch

        adapter, params, sets, outs, scratch = st["adapter"], st["params"], st["sets"], st["outs"], st["scratch"]
        for s, o, sc in zip(sets, outs, scratch):  # warm every set once outside the capture
            self._launch(adapter, s, params, o, sc)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        st.pop("graph", None)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for i in range(st["launches"]):
                    j = i % len(sets)
                    self._launch(adapter, sets[j], params, outs[j], scratch[j])
        torch.cuda.current_stream().wait_stream(stream)
        st["graph"] = graph
        if not timed:
            graph.replay()  # the upload and first-launch cost stay out of the sample's timed replays
            return None
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 5

    def verify(self, req: dict) -> dict:
        """The graph as it will be (or was last) timed, replayed once on new inputs: every input set's buffers get
        the values of seed ``seed + i`` in place, every output is poisoned, the graph replays on its stream, and
        the outputs are saved for the judge.  A graph that copies in an answer it computed before, or that is
        right only for some input sets, or lazy in this capture, leaves outputs the judge refuses."""
        import torch

        st = self.levels.get(req["key"])
        if st is None:
            raise KeyError(f"{req['key']!r} was not set up; set up: {sorted(self.levels)}")
        adapter, level, sets, outs = st["adapter"], st["level"], st["sets"], st["outs"]
        base = int(req["seed"])
        for i, s in enumerate(sets):
            _refill(s, adapter.make_inputs(level, seed=base + i))
        for o in outs:
            _poison(o)
        torch.cuda.synchronize()
        st["graph"].replay()
        seen = [_clone(o) for o in outs]  # ordered after the replay on this stream, and only after it
        torch.cuda.synchronize()
        saved = _save(seen, [{"seed": base + i} for i in range(len(sets))])
        replaced = code_changed(self.code)
        return {"key": req["key"], "check": saved, "tampered": replaced}

    def sample(self, req: dict) -> dict:
        import torch

        st = self.levels.get(req["key"])
        if st is None:
            raise KeyError(f"{req['key']!r} was not set up; set up: {sorted(self.levels)}")
        replays = max(st["replays"], int(req.get("replays") or 0))
        t_wall = time.perf_counter()
        reset_s = 0.0
        if st["reset"]:
            st["rounds"] += 1
            self._allocate(st, st["rounds"], req.get("seed"))
            self._capture(st, timed=False)
            reset_s = time.perf_counter() - t_wall
        graph = st["graph"]
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
        for s, e in events:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        per_launch = [s.elapsed_time(e) * 1000 / st["launches"] for s, e in events]
        gpu_s = sum(per_launch) * st["launches"] / 1e6
        yard = yardstick(bufs=self.yard_bufs)  # the same events, a known amount of bytes
        replaced = code_changed(self.code)
        return {
            "yard_gbps": statistics.median(yard),
            "tampered": replaced,
            "key": req["key"],
            "us": statistics.median(per_launch),
            "us_min": min(per_launch),
            "us_max": max(per_launch),
            "replays": replays,
            "gpu_s": gpu_s,
            "reset_s": reset_s,
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

    def ceilings(self, req: dict) -> dict:
        """The card's ceilings, in a process no variant was imported into: device-to-device copy GB/s (2 GiB, as
        the roofline uses), the yardstick's GB/s (the copy every sample also times), and the dense matrix peak
        per dtype (the best of torch.matmul at 4096^3 and 8192^3)."""
        import torch

        copy = self.copy_bandwidth({"mib": 2048})
        bufs: list = []
        for _ in range(5):  # warm: the clocks up and the buffers touched, as a worker's are by its timed replays
            yardstick(bufs=bufs)
        yard = max(statistics.median(yardstick(bufs=bufs)) for _ in range(9))  # a sample's yardstick, at its best
        del bufs
        peaks = {}
        for dtype in (torch.bfloat16, torch.float16):
            best = 0.0
            for n in (4096, 8192):
                a = torch.randn(n, n, device="cuda", dtype=dtype)
                b = torch.randn(n, n, device="cuda", dtype=dtype)
                for _ in range(3):
                    a @ b
                times = []
                for _ in range(10):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    a @ b
                    e.record()
                    torch.cuda.synchronize()
                    times.append(s.elapsed_time(e) / 1000)
                best = max(best, 2 * n**3 / statistics.median(times) / 1e12)
                del a, b
            peaks[str(dtype).removeprefix("torch.")] = round(best, 1)
        torch.cuda.empty_cache()
        return {"copy_gbps": copy["gbps"], "yard_gbps": yard, "yard_mib": YARD_MIB, "matrix_tflops": peaks,
                "gpu": torch.cuda.get_device_properties(0).name}  # fmt: skip

    def settle(self, req: dict) -> dict:
        """A deferred check judged here (the judge: this process never imported the kernel under test)."""
        from kinv.agent.tools.measure.correctness import settle
        from kinv.kernels.adapter import get_adapter

        return {"result": settle(get_adapter(req["kernel"]), req["result"])}

    def judge(self, req: dict) -> dict:
        """A worker's saved outputs against the reference of each input set it ran (made again from its seed)."""
        import torch

        from kinv.kernels.adapter import get_adapter

        adapter = get_adapter(req["kernel"])
        level = adapter.level(req["level"])
        saved = req["saved"]
        try:
            outs = torch.load(saved["file"], weights_only=True)
        finally:
            try:
                os.unlink(saved["file"])
            except OSError:
                pass
        per = []
        for i, (out, spec) in enumerate(zip(outs, saved["sets"], strict=True)):
            kw = {"vary_lengths": True} if spec.get("vary_lengths") else {}
            ref = adapter.reference(adapter.make_inputs(level, seed=int(spec["seed"]), **kw))
            v = judge(adapter, level, _to(out, "cuda"), ref)
            per.append(v["ok"])
            if not v["ok"]:
                return {"ok_all": False, "sets": len(outs), "bad_set": i,
                        "reason": f"input set {i + 1} of {len(outs)}: {v['reason']}"}  # fmt: skip
        return {"ok_all": True, "sets": len(outs), "reason": ""}

    def check(self, req: dict) -> dict:
        """The correctness gate (:func:`kinv.agent.tools.measure.correctness.check`) in this process: a worker kept for the
        arms that follow has compiled the config by then.  A crash ends this process, as in a check of its own."""
        from kinv.agent.tools.measure.correctness import check
        from kinv.kernels.adapter import get_adapter

        adapter = get_adapter(req["kernel"])
        self.imported.setdefault(req["kernel"], kernel_source_hash(adapter))  # the source this process imported
        levels = [adapter.level(lv) for lv in req["levels"]]
        # deferred: the outputs are judged by the judge, never by this process (it imported the kernel)
        return {"result": check(adapter, req["config"], levels, seed=req["seed"], device=req["device"], defer=True)}

    def compile(self, req: dict) -> dict:
        """Compile ``config`` and launch it once at ``level`` (no check, no timing): the compiler's resources."""
        import torch

        from kinv.kernels.adapter import get_adapter
        from kinv.kernels.devices import detect

        adapter = get_adapter(req["kernel"])
        config = adapter.validate_config(req["config"])  # the adapter's own rules, as everywhere else
        level = adapter.level(req["level"])
        params = adapter.params_for(config, level)
        inputs = adapter.make_inputs(level, seed=0)
        _, compiled = adapter.launch(inputs, params)
        torch.cuda.synchronize()
        del inputs
        return {"level": level.key, "resources": adapter.resources(params, level, detect(), compiled).to_dict()}

    def drop(self, req: dict) -> dict:
        import torch

        self.levels.pop(req["key"], None)
        torch.cuda.empty_cache()
        return {"dropped": req["key"]}


def _save(outs: list, sets: list[dict]) -> dict:
    """Save launch outputs (on the CPU) for the judge: ``{"file", "sets"}``, one input-set spec per output."""
    import tempfile

    import torch

    fd, path = tempfile.mkstemp(prefix="kinv-outputs-", suffix=".pt")
    os.close(fd)
    torch.save([_to(o, "cpu") for o in outs], path)
    return {"file": path, "sets": sets}


def _to(out, device: str):
    if isinstance(out, list | tuple):
        return type(out)(_to(o, device) for o in out)
    return out.to(device) if hasattr(out, "to") else out


def _empty_like(out):
    """An empty output shaped like one launch's (a tensor, or a list/tuple of them: every output is timed and checked)."""
    import torch

    if isinstance(out, list | tuple):
        return type(out)(_empty_like(o) for o in out)
    return torch.empty_like(out)


def main() -> int:
    from kinv.agent.tools.worker.client import watch_parent

    watch_parent()  # a worker whose run died exits (its stdin may stay open in a grandchild)
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
                       "copy_bandwidth": worker.copy_bandwidth, "drop": worker.drop, "check": worker.check,
                       "compile": worker.compile, "verify": worker.verify, "settle": worker.settle,
                       "judge": worker.judge, "ceilings": worker.ceilings}.get(op)  # fmt: skip
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
