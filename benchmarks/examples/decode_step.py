"""One decode step of a DeepSeek-V4-Flash-like layer on kinv's own kernels, as a serving process runs it: tokens/s.

The layer (per concurrency level C: C requests, each decoding one token over ``--context`` tokens of KV):

* attention: RMSNorm, the low-rank query path (hidden -> 1536 -> heads x (128 nope + 64 rope)), the nope part
  absorbed into the 448-wide latent, the new token's latent (448 + 64 rope) written into the paged KV cache, MLA
  decode over the cache through kinv's Triton kernel (``kernels/mla_decode.py``, V4-Flash's 512/512 head dims,
  16 local heads: 64 heads at attention TP 4), the latent output absorbed back to 128 per head and ``o_proj``;
* MoE: RMSNorm, a router over the 32 local experts (top-8, expert parallelism 8 of DeepSeek-V3's 256, as
  plans/4a-expert-gemm-tiles.yaml), the routed experts' gate+up projection (hidden 7168 -> 2 x 2048) and their
  down projection (2048 -> 7168, each (token, expert) pair as its own row with one route) through kinv's Triton
  grouped GEMM (``kernels/moe_expert_gemm.py``), SiLU-and-multiply and a shared expert in torch; residuals.

It reads what a serving process reads: TARGET_CTAS from its environment (the attention kernel's split rule), the
attention config from ``KINV_MLA_CONFIG`` (default ``kernels/configs/mla_decode.json``) and the MoE config from
``KINV_MOE_CONFIG`` (default ``kernels/configs/moe_expert_gemm.json``), each resolved at the level.

Timing on CUDA: the step is one CUDA graph per KV input set, the sets rotated so that attention's KV is read past
L2 (the weights are read past it at every level anyway); the attention alone is its own graphs on the same
inputs, timed in the same process, which gives its share of the step.  Each time is the median of batches of
replays over about ``--seconds``.  On CPU (the Triton interpreter, ``--tiny``) the step runs eagerly.

Modes: ``run`` (time one level, print one JSON line), ``serve`` (a long-lived server: builds, checks and captures
every level of ``--levels`` before ``/ready`` answers 200; ``GET /step?C=8&seconds=0.5`` times a level now) and
``client`` (standard library only: fetch ``/step`` and print its JSON line).  Bad input: one line, exit 2; a
kernel that disagrees with its reference: one line, exit 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FULL = {"hidden": 7168, "q_lora": 1536, "heads": 16, "nope": 128, "rope": 64, "latent": 448, "v_head": 128,
        "experts": 32, "top_k": 8, "inter": 2048, "shared": 2048, "page": 64}  # fmt: skip
TINY = {"hidden": 64, "q_lora": 32, "heads": 4, "nope": 16, "rope": 16, "latent": 48, "v_head": 16,
        "experts": 4, "top_k": 2, "inter": 32, "shared": 32, "page": 16}  # fmt: skip


class Refused(Exception):
    """Bad input (exit 2) or a wrong result (exit 3): one line."""

    def __init__(self, line: str, code: int = 2):
        super().__init__(line)
        self.code = code


# --------------------------------------------------------------------------- #
# the layer
# --------------------------------------------------------------------------- #
def _configs():
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.launch_config import ConfigError, load_config
    from kinv.kernels.mla_decode import target_ctas_from_env

    try:
        target = target_ctas_from_env()
    except ValueError as exc:
        raise Refused(str(exc)) from None
    out = {"target_ctas": target}
    for kernel, var in (("mla_decode", "KINV_MLA_CONFIG"), ("moe_expert_gemm", "KINV_MOE_CONFIG")):
        path = Path(os.environ.get(var) or ROOT / "kernels" / "configs" / f"{kernel}.json")
        if not path.is_absolute() and not path.exists():  # a plan's path, relative to the project
            path = ROOT / path
        try:
            out[kernel] = (get_adapter(kernel), load_config(path, kernel))
        except (ConfigError, OSError) as exc:
            raise Refused(f"{var}={path}: {exc}") from None
    return out


class Layer:
    """The weights, the inputs of one level (``sets`` KV caches), and the step and attention launches."""

    def __init__(self, d: dict, context: int, device: str, dtype, seed: int = 0):
        import torch

        self.d, self.context, self.device, self.dtype = d, context, device, dtype
        g = torch.Generator(device="cpu").manual_seed(seed)

        def w(*shape):
            return (torch.randn(shape, generator=g) * shape[-1] ** -0.5).to(device=device, dtype=dtype)

        h, hq = d["hidden"], d["heads"]
        self.w = {
            "q_a": w(d["q_lora"], h), "q_b": w(hq * (d["nope"] + d["rope"]), d["q_lora"]),
            "uk": w(hq, d["latent"], d["nope"]), "kv_a": w(d["latent"] + d["rope"], h),
            "uv": w(hq, d["v_head"], d["latent"] + d["rope"]), "o": w(h, hq * d["v_head"]),
            "router": w(d["experts"], h), "gate_up": w(d["experts"], 2 * d["inter"], h),
            "down": w(d["experts"], h, d["inter"]), "sh_gate_up": w(2 * d["shared"], h), "sh_down": w(h, d["shared"]),
        }  # fmt: skip
        self.cfg = _configs()

    def level(self, batch: int) -> dict:
        """Inputs and launch parameters of concurrency ``batch``: KV input sets past 3x L2 where memory allows."""
        import math

        import torch

        from kinv.kernels.moe_expert_gemm import max_aligned_blocks

        d = self.d
        mla, mla_cfg = self.cfg["mla_decode"]
        moe, moe_cfg = self.cfg["moe_expert_gemm"]
        dq = d["latent"] + d["rope"]
        lv = mla.level({"shape": "v4flash", "heads": d["heads"], "page_size": d["page"], "context": self.context,
                        "batch": batch})  # fmt: skip
        mp = mla.params_for(mla_cfg, lv)
        # the grouped GEMM's level: tokens = C for gate+up; the down projection is C x top_k pairs of one route
        up_lv = moe.level({"tokens": batch, "experts": d["experts"], "top_k": d["top_k"], "hidden": d["hidden"],
                           "n": 2 * d["inter"]})  # fmt: skip
        up_p = moe.params_for(moe_cfg, up_lv)
        pages = math.ceil(self.context / d["page"])
        kv_bytes = batch * pages * d["page"] * dq * 2
        l2 = torch.cuda.get_device_properties(0).L2_cache_size if self.device == "cuda" else 0
        sets = max(1, min(16, math.ceil(3 * l2 / kv_bytes))) if l2 else 1
        g = torch.Generator(device="cpu").manual_seed(batch)
        kv = [torch.randn((batch * pages, d["page"], dq), generator=g).to(self.device, self.dtype) for _ in range(sets)]
        table = torch.randperm(batch * pages, generator=g).view(batch, pages).to(self.device, torch.int32)
        lens = torch.full((batch,), self.context, dtype=torch.int32, device=self.device)
        x = torch.randn((batch, d["hidden"]), generator=g).to(self.device, self.dtype)
        from kinv.kernels.mla_decode import mla_decode_scratch

        # the split count as the kernel's adapter derives it (TARGET_CTAS, or whole waves where the config says)
        splits = mla.derived_env(lv, mp, {**os.environ, "TARGET_CTAS": str(self.cfg["target_ctas"])})["num_splits"]
        scratch = mla_decode_scratch(batch, d["heads"], splits, d["latent"] + d["rope"], self.device)
        return {"batch": batch, "kv": kv, "table": table, "lens": lens, "x": x, "mla_params": mp, "up_params": up_p,
                "splits": splits, "scratch": scratch, "sets": sets,
                "max_blocks": max_aligned_blocks(batch * d["top_k"], d["experts"], up_p.BLOCK_M),
                "label": f"{mp.short()} / {up_p.short()}"}  # fmt: skip

    # ---- the parts ------------------------------------------------------------------
    def attention_in(self, L: dict, x, kv):
        """RMSNorm, the query path and the new token's latent written into ``kv`` (its last position)."""
        import torch

        d = self.d
        h = torch.nn.functional.rms_norm(x.float(), (d["hidden"],)).to(self.dtype)
        q = (torch.nn.functional.rms_norm((h @ self.w["q_a"].T).float(), (d["q_lora"],)).to(self.dtype)
             @ self.w["q_b"].T).view(-1, d["heads"], d["nope"] + d["rope"])  # fmt: skip
        q_lat = torch.einsum("bhn,hln->bhl", q[..., : d["nope"]], self.w["uk"])
        q = torch.cat([q_lat, q[..., d["nope"]:]], dim=-1).contiguous()
        new = h @ self.w["kv_a"].T  # [C, latent + rope]
        last = self.context - 1
        page = L["table"][:, last // d["page"]].long()
        kv[page, last % d["page"]] = new
        return q

    def attention(self, L: dict, q, kv, out=None):
        from kinv.kernels.mla_decode import mla_decode_launch

        o, _ = mla_decode_launch(q, kv, L["table"], L["lens"], L["mla_params"], d_v=self.d["latent"] + self.d["rope"],
                                 max_seq_len=self.context, num_splits=L["splits"], scratch=L["scratch"], out=out)  # fmt: skip
        return o

    def rest(self, L: dict, x, o):
        """o_proj and the MoE block (grouped GEMMs for the routed experts), with residuals."""
        import torch

        from kinv.kernels.moe_expert_gemm import moe_align, moe_expert_gemm_launch

        d = self.d
        o = torch.einsum("bhl,hvl->bhv", o.to(self.dtype), self.w["uv"]).reshape(x.shape[0], -1)
        x = x + o @ self.w["o"].T
        h = torch.nn.functional.rms_norm(x.float(), (d["hidden"],)).to(self.dtype)
        probs = torch.softmax((h @ self.w["router"].T).float(), dim=-1)
        weights, ids = probs.topk(d["top_k"], dim=-1)
        ids = ids.to(torch.int32)
        p = L["up_params"]
        up, _ = moe_expert_gemm_launch(h, self.w["gate_up"], ids, p,
                                       align=moe_align(ids, d["experts"], p.BLOCK_M, static_shape=True))  # fmt: skip
        act = torch.nn.functional.silu(up[..., : d["inter"]]) * up[..., d["inter"]:]  # [C, k, inter]
        pairs = act.reshape(-1, d["inter"]).contiguous()
        pair_ids = ids.reshape(-1, 1)
        down, _ = moe_expert_gemm_launch(pairs, self.w["down"], pair_ids, p,
                                         align=moe_align(pair_ids, d["experts"], p.BLOCK_M, static_shape=True))  # fmt: skip
        routed = (down.view(x.shape[0], d["top_k"], -1).float() * weights[..., None]).sum(1).to(self.dtype)
        sh = h @ self.w["sh_gate_up"].T
        shared = (torch.nn.functional.silu(sh[:, : d["shared"]]) * sh[:, d["shared"]:]) @ self.w["sh_down"].T
        return x + routed + shared, (h, up, ids)

    def step(self, L: dict, i: int):
        q = self.attention_in(L, L["x"], L["kv"][i])
        return self.rest(L, L["x"], self.attention(L, q, L["kv"][i]))[0]

    # ---- correctness ------------------------------------------------------------------
    def check(self, L: dict) -> None:
        """Attention against kinv's float32 reference, and the gate+up GEMM against its reference, on set 0."""
        import torch

        from kinv.kernels.mla_decode_ref import mla_decode_reference
        from kinv.kernels.moe_expert_gemm_ref import moe_expert_gemm_reference

        kv = L["kv"][0]
        q = self.attention_in(L, L["x"], kv)
        o = self.attention(L, q, kv)
        ref = mla_decode_reference(q, kv, L["table"], L["lens"], d_v=self.d["latent"] + self.d["rope"])
        _close("attention", o.float(), ref, self.dtype)
        _, (h, up, ids) = self.rest(L, L["x"], o)
        _close("routed experts' gate+up", up.float(), moe_expert_gemm_reference(h, self.w["gate_up"], ids), self.dtype)
        if self.device == "cuda":
            torch.cuda.synchronize()


def _close(what: str, got, ref, dtype) -> None:
    import torch

    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-12)).item()
    if not err <= tol:
        raise Refused(f"{what} disagrees with its reference: relative error {err:.2e} > {tol:g}", code=3)


# --------------------------------------------------------------------------- #
# timing
# --------------------------------------------------------------------------- #
class Timed:
    """A level ready to time: CUDA graphs of the step and of the attention, one per KV input set."""

    def __init__(self, layer: Layer, batch: int):
        import torch

        self.layer, self.L = layer, layer.level(batch)
        layer.check(self.L)
        self.steps, self.atts = [], []
        if layer.device != "cuda":
            return
        L = self.L
        self.q = [layer.attention_in(L, L["x"], kv) for kv in L["kv"]]
        self.o = torch.empty((batch, layer.d["heads"], layer.d["latent"] + layer.d["rope"]), device="cuda",
                             dtype=layer.dtype)  # fmt: skip
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(L["sets"]):  # warm (compile) outside the graphs
                layer.step(L, i)
                layer.attention(L, self.q[i], L["kv"][i], out=self.o)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        for i in range(L["sets"]):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                layer.step(L, i)
            self.steps.append(g)
            a = torch.cuda.CUDAGraph()
            with torch.cuda.graph(a):
                layer.attention(L, self.q[i], L["kv"][i], out=self.o)
            self.atts.append(a)
        torch.cuda.synchronize()

    def _median_us(self, graphs, seconds: float) -> float:
        import statistics

        import torch

        per, times, t_end = max(4, 2 * len(graphs)), [], time.perf_counter() + seconds
        for g in graphs * 2:  # warm-up
            g.replay()
        while len(times) < 3 or time.perf_counter() < t_end:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for k in range(per):
                graphs[k % len(graphs)].replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / per)
        return statistics.median(times)

    def measure(self, seconds: float) -> dict:
        L, layer = self.L, self.layer
        if layer.device == "cuda":
            step_us = self._median_us(self.steps, seconds * 0.7)
            att_us = self._median_us(self.atts, seconds * 0.3)
        else:  # eager on CPU: the interpreter's times, for the plumbing only
            t0 = time.perf_counter()
            layer.step(L, 0)
            step_us = (time.perf_counter() - t0) * 1e6
            q = layer.attention_in(L, L["x"], L["kv"][0])
            t0 = time.perf_counter()
            layer.attention(L, q, L["kv"][0])
            att_us = (time.perf_counter() - t0) * 1e6
        return {"tokens_per_s": L["batch"] / (step_us * 1e-6), "step_us": round(step_us, 2),
                "attention_us": round(att_us, 2), "attention_share": round(att_us / step_us, 4),
                "C": L["batch"], "context": layer.context, "TARGET_CTAS": layer.cfg["target_ctas"],
                "num_splits": L["splits"], "mla_config": L["mla_params"].short(),
                "moe_config": L["up_params"].short(), "input_sets": L["sets"], "device": _device_name()}  # fmt: skip


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (Triton interpreter)"


def _layer(args) -> Layer:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise Refused("no GPU here: run on CUDA, or set TRITON_INTERPRET=1 with --tiny for the CPU interpreter")
    if not cuda and not args.tiny:
        raise Refused("the full layer on the CPU interpreter would take hours: add --tiny")
    if args.context < 1 or args.context > 131072:
        raise Refused(f"--context {args.context} must be from 1 to 131072")
    return Layer(TINY if args.tiny else FULL, args.context, "cuda" if cuda else "cpu",
                 torch.bfloat16 if cuda else torch.float32)  # fmt: skip


# --------------------------------------------------------------------------- #
# modes
# --------------------------------------------------------------------------- #
def run(args) -> None:
    print(json.dumps(Timed(_layer(args), args.concurrency).measure(args.seconds)), flush=True)


def serve(args) -> None:
    import http.server
    import signal
    import urllib.parse

    layer = _layer(args)
    try:
        levels = [int(c) for c in args.levels.split(",")]
    except ValueError:
        raise Refused(f"--levels {args.levels!r} must be comma-separated integers such as 1,8,32") from None
    ready = {c: Timed(layer, c) for c in levels}  # built, checked and captured before the port opens

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if url.path == "/ready":
                return self._send(200, {"ready": sorted(ready)})
            if url.path != "/step":
                return self._send(404, {"error": f"no {url.path}: /ready or /step?C=..&seconds=.."})
            qs = urllib.parse.parse_qs(url.query)
            try:
                c, secs = int(qs["C"][0]), float(qs.get("seconds", [args.seconds])[0])
            except (KeyError, ValueError):
                return self._send(400, {"error": "give C (an integer) and optionally seconds"})
            if c not in ready:
                return self._send(400, {"error": f"C={c} is not served; served: {sorted(ready)}"})
            return self._send(200, ready[c].measure(secs))

    srv = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(json.dumps({"serving": sorted(ready), "port": args.port, "pid": os.getpid()}), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


def client(args) -> None:
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{args.port}/step?C={args.concurrency}&seconds={args.seconds}"
    try:
        with urllib.request.urlopen(url, timeout=600) as r:  # noqa: S310 - the local server of this arm
            print(r.read().decode(), flush=True)
    except urllib.error.HTTPError as exc:
        raise Refused(f"the server refused C={args.concurrency}: {exc.read().decode()[:200]}", code=1) from None
    except OSError as exc:
        raise Refused(f"no server at {url}: {exc}", code=1) from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("run", "serve", "client"):
        p = sub.add_parser(name)
        p.add_argument("--seconds", type=float, default=1.0)
        if name != "client":
            p.add_argument("--context", type=int, default=4096)
            p.add_argument("--tiny", action="store_true", help="every dimension small: the CPU interpreter")
        if name != "serve":
            p.add_argument("--concurrency", type=int, required=True)
        if name != "run":
            p.add_argument("--port", type=int, required=True)
        if name == "serve":
            p.add_argument("--levels", default="1,8,32,64,96")
    args = ap.parse_args(argv)
    if getattr(args, "concurrency", 1) < 1:
        print(f"decode_step: --concurrency {args.concurrency} must be a positive integer", file=sys.stderr)
        return 2
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        {"run": run, "serve": serve, "client": client}[args.mode](args)
    except Refused as exc:
        print(f"decode_step: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
