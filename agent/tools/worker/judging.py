"""The judge's requests, served by a worker process that never set up, checked or imported a kernel under test
(agent/tools/worker/judge.py keeps one per run).

``judge`` compares a worker's outputs with the reference of the inputs they were computed from: each input set
is made once per level from its seed and kept (a check then costs the reference and the comparison, on the
device), and where the outputs were written by timed launches, the inputs those launches read are made again
exactly (:func:`kinv.agent.tools.worker.refresh.refill`).  ``ceilings`` measures the card (copy bandwidth, the
yardstick, the matrix peak), ``settle`` judges a deferred correctness check.

Imports: the standard library, torch, triton and kinv's kernels and correctness gate (the worker's rule).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict

from kinv.agent.tools.worker import refresh
from kinv.agent.tools.worker.shared import load, to, yardstick

KEPT_INPUT_BYTES = 8 * 2**30
"""The judge keeps the input sets it made, per level and seed, up to this many bytes (oldest dropped first)."""


def _nbytes(inputs: dict) -> int:
    return sum(t.numel() * t.element_size() for t in inputs.values() if hasattr(t, "element_size"))


class JudgeOps:
    """The requests a judge serves (mixed into the worker: one process type, two roles)."""

    kept_inputs: OrderedDict

    def _inputs(self, adapter, level, spec: dict, device: str) -> dict:
        """The input set of ``spec`` as the launch that wrote the output read it: made from its seed (kept for
        the level's later checks when timed launches wrote it), then its fresh inputs refilled as that launch's
        counter left them."""
        kw = {"vary_lengths": True} if spec.get("vary_lengths") else {}
        fill = spec.get("fill")
        if not fill:  # a set-up's or a gate's own launch: made once, used once
            return adapter.make_inputs(level, seed=int(spec["seed"]), device=device, **kw)
        if not hasattr(self, "kept_inputs"):
            self.kept_inputs = OrderedDict()
        key = (adapter.name, level.key, int(spec["seed"]), bool(kw), device)
        inputs = self.kept_inputs.get(key)
        if inputs is None:
            inputs = adapter.make_inputs(level, seed=int(spec["seed"]), device=device, **kw)
            self.kept_inputs[key] = inputs
            while sum(_nbytes(v) for v in self.kept_inputs.values()) > KEPT_INPUT_BYTES and len(self.kept_inputs) > 1:
                self.kept_inputs.popitem(last=False)
        self.kept_inputs.move_to_end(key)
        # every element of a fresh input is overwritten: the kept set needs no restoring between checks
        return refresh.refill(inputs, fill["names"], fill)

    def judge(self, req: dict) -> dict:
        """A worker's outputs against the reference of each input set it ran: ``{ok_all, sets, reason}``."""
        import time

        import torch

        from kinv.agent.tools.worker.compare import judge
        from kinv.kernels.adapter import get_adapter

        t0 = time.perf_counter()
        adapter = get_adapter(req["kernel"])
        level = adapter.level(req["level"])
        saved = req["saved"]
        device = req.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        outs = load(saved)
        for i, (out, spec) in enumerate(zip(outs, saved["sets"], strict=True)):
            ref = adapter.reference(self._inputs(adapter, level, spec, device))
            v = judge(adapter, level, to(out, device), ref)
            if not v["ok"]:
                return {"ok_all": False, "sets": len(outs), "bad_set": i,
                        "reason": f"input set {i + 1} of {len(outs)}: {v['reason']}"}  # fmt: skip
        del outs
        if device == "cuda":
            torch.cuda.synchronize()
        return {"ok_all": True, "sets": len(saved["sets"]), "reason": "",
                "judge_s": round(time.perf_counter() - t0, 4)}  # fmt: skip

    def settle(self, req: dict) -> dict:
        """A deferred check judged here (the judge: this process never imported the kernel under test)."""
        from kinv.agent.tools.worker.compare import settle
        from kinv.kernels.adapter import get_adapter

        return {"result": settle(get_adapter(req["kernel"]), req["result"])}

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

        from kinv.agent.tools.worker.shared import YARD_MIB

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


__all__ = ["KEPT_INPUT_BYTES", "JudgeOps"]
