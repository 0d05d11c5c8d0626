"""Benchmark worker: one process per variant, crash-isolated.

The parent (``agent/tools/runners/bench.py``) starts ``python -m agent.tools.bench_worker``
with the variant's environment, then talks JSON lines: one request per line on
stdin, one reply per line on stdout.  If the variant crashes, hits an illegal
address or runs out of memory, only this process dies; the parent reports the
failure as the variant's.

Imports: standard library, torch, triton, ``kernels`` and the correctness gate
(``agent/tools/worker/gate.py``, ``compare.py`` and ``tamper.py``, which import no more) only, so the worker runs
on a GPU machine that has none of kinv's other dependencies.

Requests
--------
``{"op": "hello", "env_keys": [...]}``         fingerprint, hashes, env seen
``{"op": "setup", "kernel", "config", "level", "reset"}``  correctness, graph sizing
``{"op": "sample", "key", "seed"}``              re-set (inputs from seed), one sample: median of >= 20 replays, >= 25 ms
``{"op": "check", "kernel", "config", "levels", "seed", "device"}``  the correctness gate, in this process
``{"op": "compile", "kernel", "config", "level"}``  compile and launch once (no timing): the compiler's resources
``{"op": "rehand"}``                            the outputs handed last, again, through a file (no IPC there)
``{"op": "collect", "key"}``                    the outputs the last sample's timed replays left, handed to the
                                                judge with the inputs those replays read (nothing is replayed)
``{"op": "copy_bandwidth", "mib": 2048}``       device-to-device copy GB/s
The judge's requests (a worker that never set up or checked a kernel; agent/tools/worker/judge.py):
``{"op": "settle", "kernel", "result"}``        a deferred check judged here
``{"op": "judge", "kernel", "level", "saved"}``  saved outputs against the reference of each input set
``{"op": "ceilings"}``                          copy bandwidth, the yardstick's, matrix peak per dtype
``{"op": "exit"}``

Nothing in this process judges a kernel it launched: outputs are handed over (CUDA IPC handles on a GPU) and judged
by the judge, a process that never imported the kernel under test (:mod:`.judging`).  What this process does time, it checks: every function it
relies on (its timer, torch's and the standard library's functions it calls, its own handlers) is fingerprinted
before any kernel module is imported and compared after every set-up and sample (a kernel that rebinds one, or
changes its code in place, is caught and named), and every sample also times a yardstick, a device copy of a
fixed size, with the same events: a yardstick faster than the card can move bytes says the timer is not to be
believed.

Timing (docs/gpu.md, "Timing"): each level's launches are captured in one CUDA
graph; the graph cycles through enough input sets that their KV exceeds 3x
the L2, so no launch reads its KV from L2 (stated as ``l2`` in the setup
reply).  Before each launch the graph writes new values into the adapter's fresh
inputs (:mod:`.refresh`), so no timed launch reads what an earlier one read; the
fills' own time is measured in every sample by a graph of the fills alone and taken
out (``refresh_us``).  The outputs the timed replays leave are what the judge checks
(``collect``): nothing is refilled or poisoned right before a timed replay.  A sample is the median over ``replays`` event-timed replays of
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

import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

from kinv.agent.tools.worker import (
    gate,  # noqa: F401 - imported before any kernel: its check is fingerprinted
    refresh,
)
from kinv.agent.tools.worker.compare import _clone, _poison
from kinv.agent.tools.worker.hashes import harness_hash, kernel_source_hash, reference_hash
from kinv.agent.tools.worker.judging import JudgeOps
from kinv.agent.tools.worker.shared import empty_like, save, share, yardstick
from kinv.agent.tools.worker.tamper import code_changed, code_snapshot

MIN_REPLAYS = 20
TARGET_REPLAY_US = 400.0  # a replay should run long enough to dwarf event jitter
MIN_SAMPLE_MS = 25.0  # a sample's replays should dwarf the fixed cost of a request (pipe, events, sync)
MAX_LAUNCHES = 512
REFRESH_REPLAYS = 10  # replays of the fills-only graph timed in each sample


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


class Worker(JudgeOps):
    def __init__(self):
        from kinv.agent.tools.worker import tamper

        self.code = code_snapshot()  # before any kernel module is imported: a kernel that changes these is caught
        tamper._FIRST_SNAPSHOT = self.code  # the gate's check in this process compares with the same
        self.yard_bufs: list = []
        self.levels: dict[str, dict] = {}
        self.adapter = None
        self.imported: dict[str, str] = {}  # kernel -> hash of its source when this process first imported it
        self.handed = None  # the outputs handed to the judge, alive until the next request

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
        saved = self._hand([_clone(out)], [{"seed": check_seed, "vary_lengths": True}], req.get("via", "ipc"))
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
        The input sets are the level's (made from its seed, the same for both arms); ``seed``, the round's, which
        the caller gives both arms of a round alike, seeds the values the graph writes into the fresh inputs
        before each launch (:mod:`.refresh`).  Outputs start as NaN: a launch that writes nothing is seen.
        """
        import random

        import torch

        for k in ("graph", "fill_graph", "sets", "outs", "scratch", "pad", "ctr", "fill_ctr"):
            st.pop(k, None)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        adapter, params, level = st["adapter"], st["params"], st["level"]
        rng = random.Random(f"{os.getpid()}:{st['seed']}:{round_index}")
        st["pad"] = torch.empty(rng.randrange(0, 64 * 2**20, 4096), dtype=torch.uint8, device="cuda")
        sets = [adapter.make_inputs(level, seed=st["seed"] + i) for i in range(st["n_sets"])]
        st["fresh"] = adapter.fresh_names(sets[0])
        st["moments"] = [{n: refresh.moments(s[n]) for n in st["fresh"]} for s in sets]
        st["fill_seed"] = int(st["seed"] + round_index if seed is None else seed)
        first_out, _ = adapter.launch(sets[0], params)
        outs = [first_out] + [empty_like(first_out) for _ in sets[1:]]
        for o in outs:
            _poison(o)
        scratch = [adapter.make_scratch(s, params) for s in sets]
        st.update(sets=sets, outs=outs, scratch=scratch, ctr=refresh.counter("cuda"), fill_ctr=refresh.counter("cuda"))

    def _fill(self, st: dict, j: int, step: int, ctr) -> None:
        for name in st["fresh"]:
            mean, sd = st["moments"][j][name]
            refresh.fill(st["sets"][j][name], ctr, st["fill_seed"], step, mean, sd)

    def _capture(self, st: dict, timed: bool = True) -> float | None:
        """Capture ``launches`` launches cycling through the input sets, each after the fill of its set's fresh
        inputs, and the counter's increment at the end; and a graph of the same fills alone (its time is taken
        out of every sample).  Return ms per replay (``timed``), else replay once so the upload and first-launch
        cost stay out of the sample's timed replays."""
        import torch

        adapter, params, sets, outs, scratch = st["adapter"], st["params"], st["sets"], st["outs"], st["scratch"]
        for j, (s, o, sc) in enumerate(zip(sets, outs, scratch)):  # warm every set once outside the capture
            self._fill(st, j, st["launches"] + j, st["fill_ctr"])
            self._launch(adapter, s, params, o, sc)
        st["ctr"].zero_()  # a graph captured again counts its replays from zero (``played``)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        st.pop("graph", None)
        graph, fills = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for i in range(st["launches"]):
                    j = i % len(sets)
                    self._fill(st, j, i, st["ctr"])
                    self._launch(adapter, sets[j], params, outs[j], scratch[j])
                st["ctr"].add_(1)
            with torch.cuda.graph(fills, stream=stream):
                for i in range(st["launches"]):
                    self._fill(st, i % len(sets), i, st["fill_ctr"])
                st["fill_ctr"].add_(1)
        torch.cuda.current_stream().wait_stream(stream)
        st["graph"], st["fill_graph"], st["played"] = graph, fills, 0
        st["token"] = _graph_token(graph)
        if not timed:
            self._replay(st, 1)
            return None
        self._replay(st, 3)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self._replay(st, 5)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 5

    @staticmethod
    def _replay(st: dict, n: int, events: list | None = None) -> None:
        """Replay the level's graph ``n`` times (each between a pair of ``events`` where given), counting them:
        the counter the graph increments says which values the last replay's fills wrote."""
        graph = st["graph"]
        if _graph_token(graph) != st["token"]:
            raise RuntimeError("the graph about to be replayed is not the one this worker captured")
        for k in range(n):
            if events:
                events[k][0].record()
            graph.replay()
            if events:
                events[k][1].record()
        st["played"] += n

    def collect(self, req: dict) -> dict:
        """The outputs the last replay of the level's graph left (the last sample's timed replays: nothing is
        replayed, refilled or poisoned here), handed to the judge with what each output's last writer read: its
        input set's seed, and the fill of that launch (the round's seed, the counter of the last replay, the
        launch's step and the fresh inputs' moments)."""
        st = self.levels.get(req["key"])
        if st is None:
            raise KeyError(f"{req['key']!r} was not set up; set up: {sorted(self.levels)}")
        n, launches = len(st["sets"]), st["launches"]
        specs = []
        for j in range(n):
            step = j + ((launches - 1 - j) // n) * n  # the last launch of the graph that wrote output j
            specs.append({"seed": st["seed"] + j,
                          "fill": {"names": st["fresh"], "seed": st["fill_seed"], "counter": st["played"] - 1,
                                   "step": step, "moments": st["moments"][j]}})  # fmt: skip
        saved = self._hand([_clone(o) for o in st["outs"]], specs, req.get("via", "ipc"))
        replaced = code_changed(self.code)
        return {"key": req["key"], "check": saved, "tampered": replaced, "replays_since_capture": st["played"]}

    def _hand(self, outs: list, specs: list[dict], via: str) -> dict:
        """Hand ``outs`` to the judge (over IPC unless ``via`` is "file"), kept alive until the next request."""
        self.handed = (outs, specs)
        return share(outs, specs) if via == "ipc" else save(outs, specs)

    def rehand(self, req: dict) -> dict:
        """The outputs handed last, again, through a file (where the judge could not map them over IPC)."""
        if not self.handed:
            raise ValueError("nothing was handed to the judge since the last sample")
        return {"check": save(*self.handed)}

    def sample(self, req: dict) -> dict:
        import torch

        st = self.levels.get(req["key"])
        if st is None:
            raise KeyError(f"{req['key']!r} was not set up; set up: {sorted(self.levels)}")
        self.handed = None
        replays = max(st["replays"], int(req.get("replays") or 0))
        t_wall = time.perf_counter()
        reset_s = 0.0
        if st["reset"]:
            st["rounds"] += 1
            self._allocate(st, st["rounds"], req.get("seed"))
            self._capture(st, timed=False)
            reset_s = time.perf_counter() - t_wall
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
        self._replay(st, replays, events)
        torch.cuda.synchronize()
        per_launch = [s.elapsed_time(e) * 1000 / st["launches"] for s, e in events]
        gpu_s = sum(per_launch) * st["launches"] / 1e6
        fills = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(REFRESH_REPLAYS)]  # fmt: skip
        for s, e in fills:  # the fills alone, with the same events: their time is taken out of the sample's
            s.record()
            st["fill_graph"].replay()
            e.record()
        torch.cuda.synchronize()
        refresh_us = statistics.median(s.elapsed_time(e) * 1000 / st["launches"] for s, e in fills)
        yard = yardstick(bufs=self.yard_bufs)  # the same events, a known amount of bytes
        replaced = code_changed(self.code)
        raw = statistics.median(per_launch)
        return {
            "yard_gbps": statistics.median(yard),
            "tampered": replaced,
            "key": req["key"],
            "us": max(raw - refresh_us, 1e-3),
            "us_raw": raw,
            "refresh_us": refresh_us,
            "us_min": min(per_launch) - refresh_us,
            "us_max": max(per_launch) - refresh_us,
            "replays": replays,
            "launches": st["launches"],
            "gpu_s": gpu_s,
            "reset_s": reset_s,
            "worker_wall_s": time.perf_counter() - t_wall,
            "t": time.time(),
        }

    def check(self, req: dict) -> dict:
        """The correctness gate (:func:`kinv.agent.tools.worker.gate.check`) in this process: a worker kept for the
        arms that follow has compiled the config by then.  A crash ends this process, as in a check of its own."""
        from kinv.agent.tools.worker.gate import check
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


def _graph_token(graph) -> tuple:
    """What identifies a captured graph: the object, and its executable's handle where torch exposes it."""
    exe = getattr(graph, "raw_cuda_graph_exec", None)
    try:
        handle = exe() if exe is not None else None
    except RuntimeError:
        handle = None
    return (id(graph), handle)


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
                       "compile": worker.compile, "collect": worker.collect, "rehand": worker.rehand, "settle": worker.settle,
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
