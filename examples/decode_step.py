"""One decode step of a DeepSeek-V4-Flash-like layer on kinv's own kernels, as a serving process runs it: tokens/s.

The layer (per concurrency level C: C requests, each decoding one token over ``--context`` tokens of KV):

* attention: RMSNorm; the low-rank query path (hidden 7168 -> q_lora 1536 -> RMSNorm -> 16 heads x (128 nope +
  64 rope)), the nope part absorbed into the 448-wide latent, rotary on the rope part; the new token's kv_a
  projection (7168 -> 448 latent + 64 rope, RMSNorm on the latent, rotary on the rope) written into the paged
  latent KV cache at its position; absorbed-MLA decode over each request's cache through kinv's Triton kernel
  (``kernels/mla_decode.py``: the adapter's "v4flash" shape, a 512-wide row = 448 latent + 64 rope, values 512;
  16 local heads = 64 heads at attention TP 4; pages of 64 tokens, the adapter's workload default); the latent
  output absorbed back to 128 per head and ``o_proj`` (16 x 128 -> 7168); residual.
* MoE (the dims of kinv's MoE workload, plans/4a-expert-gemm-tiles.yaml: DeepSeek-V3's experts at expert
  parallelism 8): RMSNorm, a router over the 32 local experts (torch matmul, softmax, top-8), the routed experts'
  gate+up projection (7168 -> 2 x 2048) through kinv's Triton grouped GEMM (``kernels/moe_expert_gemm.py``),
  SiLU(gate) x up in torch, the down projection (2048 -> 7168) through the same grouped GEMM: its input is per
  token, so every (token, expert) pair is a row of its own with one route (its pair index is the same, so the
  gate+up's routing metadata serves it unchanged); the routing weights combine the pairs; a shared expert
  (7168 -> 2 x 2048 -> 7168) in torch; residual.
  The q_lora, nope, v_head and shared-expert widths are DeepSeek-V3's; no tensor-parallel all-reduce is modelled
  (one GPU's share of the layer).

It reads what a serving process reads, once, at start-up: TARGET_CTAS from its environment (the attention kernel's
split rule, through ``target_ctas_from_env``/``num_kv_splits``), the attention config from the file
``KINV_MLA_CONFIG`` names (default ``kernels/configs/mla_decode.json``) and the MoE config from ``KINV_MOE_CONFIG``
(default ``kernels/configs/moe_expert_gemm.json``), each resolved at the level by its adapter (batch C / tokens C;
the down projection uses the gate+up's parameters).

Correctness, before any timing: the attention output of one step against kinv's float32 reference
(``kernels/mla_decode_ref.py``) under the MLA adapter's level-aware tolerance, and the routed experts' output (both
grouped GEMMs, SiLU x up and the weighted combine) against a float32 torch reference built on
``kernels/moe_expert_gemm_ref.py``; outputs are filled with NaN first.  On CUDA the captured graphs are replayed into
NaN-filled outputs and compared with the eager step as well.

Timing on CUDA (docs/gpu.md, "Timing"): ``n`` input sets (KV caches, block tables, hidden states) rotated so that
the attention's KV of all sets exceeds 3x the L2 where memory allows (the weights are read past the L2 at every
step anyway); the whole step over the ``n`` sets is one CUDA graph; the attention alone and the MoE block alone are
graphs of their own over the same inputs, timed in the same process, so the output states their shares of the step.
A time is the median over batches of replays, each batch timed with CUDA events, for about ``--seconds`` (the step
70% of it, attention and MoE 15% each).  On CPU (the Triton interpreter, ``--tiny`` only) the parts run eagerly and
are timed with ``perf_counter`` (medians of at least three calls): the interpreter's numbers check the plumbing only.
``--tiny`` shrinks every dimension (a 64-wide latent row of 48 + 16 rope, 4 heads, 4 experts, hidden 64).

Modes: ``run`` (time one level, print one JSON line), ``serve`` (a long-lived server on 127.0.0.1: builds, checks and
captures every level of ``--levels`` before the port opens and ``/ready`` answers 200; ``GET /step?C=8&seconds=0.5``
times a level now; SIGTERM stops it, exit 0) and ``client`` (standard library only: fetch ``/step`` and print its
JSON line).  Bad input (a bad TARGET_CTAS, a missing or bad config): one line on stderr, exit 2; a kernel that
disagrees with its reference: one line, exit 3; a client whose server refuses or cannot be reached: one line, exit 1.

    TARGET_CTAS=512 KINV_MLA_CONFIG=plans/configs/3d-seed-bt16.json python examples/decode_step.py run --concurrency 8
    {"tokens_per_s": ..., "step_us": ..., "attention_us": ..., "attention_share": ..., "moe_us": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL = {"hidden": 7168, "q_lora": 1536, "heads": 16, "nope": 128, "rope": 64, "latent": 448, "v_head": 128,
        "experts": 32, "top_k": 8, "inter": 2048, "shared": 2048, "page": 64}  # fmt: skip
TINY = {"hidden": 64, "q_lora": 32, "heads": 4, "nope": 16, "rope": 16, "latent": 48, "v_head": 16,
        "experts": 4, "top_k": 2, "inter": 32, "shared": 32, "page": 16}  # fmt: skip
MAX_SETS = 64  # input sets rotated at most (C=1 at context 4096: 4 MiB of KV each)
L2_FACTOR = 3  # the sets' KV together exceed this many L2s, where memory allows (kinv's own timer's rule)
KV_MEMORY_SHARE = 0.5  # of the GPU memory free after the weights, the most all levels' input sets may take
# the routed experts' output against its float32 reference: the relative error norm's bound per dtype (bf16: 8
# mantissa bits in the stored gate+up, its SiLU x up and the down projection's output)
MOE_NORM = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 5e-3}
GRAPH_NORM = 1e-2  # a replayed graph against the eager step it was captured from


class Refused(Exception):
    """Bad input (exit 2), a wrong result (exit 3) or a client's failed request (exit 1): one line."""

    def __init__(self, line: str, code: int = 2):
        super().__init__(line)
        self.code = code


# --------------------------------------------------------------------------- #
# what the process reads at start-up
# --------------------------------------------------------------------------- #
def _configs() -> dict:
    """TARGET_CTAS and both kernels' config files, validated by kinv's own code; Refused (exit 2) naming the value."""
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.errors import ConfigError
    from kinv.kernels.launch_config import load_config
    from kinv.kernels.mla_decode import target_ctas_from_env

    mla = get_adapter("mla_decode")
    try:
        target = target_ctas_from_env()
    except ValueError as exc:
        raise Refused(str(exc)) from None
    bad = mla.invalid_env({"TARGET_CTAS": os.environ.get("TARGET_CTAS") or None})
    if bad:
        raise Refused(bad[0])
    out = {"target_ctas": target}
    for kernel, var in (("mla_decode", "KINV_MLA_CONFIG"), ("moe_expert_gemm", "KINV_MOE_CONFIG")):
        adapter = get_adapter(kernel)
        # the shipped file by default, wherever kinv's own bookkeeping (KINV_CONFIG_DIR) keeps its live copy
        path = Path(os.environ.get(var) or ROOT / "kernels" / "configs" / f"{kernel}.json")
        if not path.is_absolute() and not path.exists():  # a plan's path, relative to the project
            path = ROOT / path
        try:
            out[kernel] = (adapter, load_config(path, kernel), path)
        except (ConfigError, OSError) as exc:
            raise Refused(f"{var}={path}: {exc}") from None
    return out


def _compare(got, ref, atol: float, rtol: float, norm: float) -> str:
    """'' when ``got`` matches the float32 ``ref`` (every element within atol + rtol |ref|, finite, and the relative
    error norm within ``norm``), else why not, in a few words."""
    got, ref = got.float(), ref.float()
    finite = bool(got.isfinite().all())
    if not finite:
        return f"{int((~got.isfinite()).sum())} of {got.numel()} outputs are not finite (never written?)"
    diff = (got - ref).abs()
    rel = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
    bad = int((diff > atol + rtol * ref.abs()).sum())
    if bad or not rel <= norm:
        return (f"{bad} of {got.numel()} elements beyond atol {atol:.2g} + rtol {rtol:.2g}, max error "
                f"{float(diff.max()):.3g}, relative error norm {rel:.2e} (bound {norm:.1e})")  # fmt: skip
    return ""


# --------------------------------------------------------------------------- #
# the layer
# --------------------------------------------------------------------------- #
class Layer:
    """The weights (one set for every level) and the parts of one decode step over one input set."""

    def __init__(self, d: dict, context: int, device: str, dtype, seed: int = 0):
        import torch

        self.d, self.context, self.device, self.dtype = d, context, device, dtype
        self.cfg = _configs()  # before anything is built: a bad environment costs nothing
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape):  # N(0, 1/fan_in): every projection keeps its input's scale; drawn in slices (the experts)
            out = torch.empty(shape, device=device, dtype=dtype)
            for part in out.view(-1, shape[-1]).split(max(1, (1 << 24) // shape[-1])):
                part.copy_(torch.randn(part.shape, generator=g, device=device) * shape[-1] ** -0.5)
            return out

        def norm(n):
            return (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(dtype)

        h, hq = d["hidden"], d["heads"]
        self.w = {
            "norm1": norm(h), "q_a": w(d["q_lora"], h), "q_norm": norm(d["q_lora"]),
            "q_b": w(hq * (d["nope"] + d["rope"]), d["q_lora"]), "uk": w(hq, d["latent"], d["nope"]),
            "kv_a": w(d["latent"] + d["rope"], h), "kv_norm": norm(d["latent"]),
            "uv": w(hq, d["v_head"], d["latent"] + d["rope"]), "o": w(h, hq * d["v_head"]), "norm2": norm(h),
            "router": w(d["experts"], h), "gate_up": w(d["experts"], 2 * d["inter"], h),
            "down": w(d["experts"], h, d["inter"]), "sh_gate_up": w(2 * d["shared"], h), "sh_down": w(h, d["shared"]),
        }  # fmt: skip
        self.sm_scale = (d["nope"] + d["rope"]) ** -0.5  # the un-absorbed head's q.k width, as MLA scales it
        self.kv_budget = None  # bytes all levels' input sets may take (CUDA), set by the caller

    # ---- one level's inputs ---------------------------------------------------------
    def level(self, batch: int, levels: int = 1) -> dict:
        """Inputs, buffers and launch parameters of concurrency ``batch``: input sets whose KV exceeds 3x L2 where
        memory allows (``levels``: how many levels share the memory)."""
        import torch

        d, dev, dt = self.d, self.device, self.dtype
        mla, mla_cfg, _ = self.cfg["mla_decode"]
        moe, moe_cfg, _ = self.cfg["moe_expert_gemm"]
        dq = d["latent"] + d["rope"]
        lv = mla.level({"shape": "v4flash", "heads": d["heads"], "page_size": d["page"], "context": self.context,
                        "batch": batch})  # fmt: skip
        mp = mla.params_for(mla_cfg, lv)
        up_lv = moe.level({"tokens": batch, "experts": d["experts"], "top_k": d["top_k"], "hidden": d["hidden"],
                           "n": 2 * d["inter"]})  # fmt: skip
        up_p = moe.params_for(moe_cfg, up_lv)
        pages = math.ceil(self.context / d["page"])
        kv_bytes = batch * pages * d["page"] * dq * torch.empty((), dtype=dt).element_size()
        sets = 1
        if dev == "cuda":
            l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or 60 * 2**20
            if self.kv_budget is None:
                self.kv_budget = KV_MEMORY_SHARE * torch.cuda.mem_get_info()[0]
            cap = int(self.kv_budget / max(1, levels) // kv_bytes)
            sets = max(1, min(MAX_SETS, math.ceil(L2_FACTOR * l2 / kv_bytes), cap))
        g = torch.Generator(device=dev).manual_seed(1000 + batch)
        lens = torch.full((batch,), self.context, dtype=torch.int32, device=dev)
        pos = (lens - 1).long()  # the new token's position in each request
        inv = 10000.0 ** (-torch.arange(0, d["rope"], 2, device=dev, dtype=torch.float32) / d["rope"])
        ang = pos[:, None].float() * inv[None, :]  # [C, rope / 2]
        S = []
        for _ in range(sets):
            table = torch.randperm(batch * pages, generator=g, device=dev).view(batch, pages).to(torch.int32)
            kv = torch.empty((batch * pages, d["page"], dq), device=dev, dtype=dt)
            for part in kv.view(-1, dq).split(1 << 16):
                part.copy_(torch.randn(part.shape, generator=g, device=dev))
            rows = table.gather(1, (pos // d["page"])[:, None]).squeeze(1).long() * d["page"] + pos % d["page"]
            S.append({
                "x": torch.randn((batch, d["hidden"]), generator=g, device=dev).to(dt), "kv": kv, "table": table,
                "rows": rows,  # the new token's row of the cache, per request
                "q": torch.empty((batch, d["heads"], dq), device=dev, dtype=dt),
                "o": torch.empty((batch, d["heads"], dq), device=dev, dtype=dt),
                "h1": torch.empty((batch, d["hidden"]), device=dev, dtype=dt),
                "moe_in": torch.empty((batch, d["hidden"]), device=dev, dtype=dt),
                "out": torch.empty((batch, d["hidden"]), device=dev, dtype=dt),
            })  # fmt: skip
        # the split count as the kernel's adapter derives it (TARGET_CTAS, or whole waves where the config says);
        # the scratch is the adapter's too, one for every set (a step's attention uses it and is done with it)
        env = mla.derived_env(lv, mp, {**os.environ, "TARGET_CTAS": str(self.cfg["target_ctas"])})
        scratch = mla.make_scratch({"q": S[0]["q"], "max_seq_len": self.context, "d_v": dq}, mp)
        if scratch["partial_o"].shape[2] != env["num_splits"]:  # the adapter's two derivations must agree
            raise RuntimeError(f"scratch for {scratch['partial_o'].shape[2]} splits, derived {env['num_splits']}")
        return {"batch": batch, "sets": S, "lens": lens, "cos": ang.cos().to(dt), "sin": ang.sin().to(dt),
                "mla_level": lv, "mla_params": mp, "up_params": up_p, "splits": env["num_splits"],
                "split_rule": env.get("split_rule", "TARGET_CTAS"), "scratch": scratch,
                "kv_bytes": kv_bytes}  # fmt: skip

    # ---- the parts of a step ----------------------------------------------------------
    @staticmethod
    def _rms(x, w, eps: float = 1e-6):
        import torch

        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    @staticmethod
    def _rope(x, cos, sin):  # rotate-half rotary; cos, sin broadcast over x's leading dimensions
        import torch

        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def attention_in(self, L: dict, s: dict) -> None:
        """RMSNorm, the query path into ``s["q"]``, and the new token's latent written into ``s["kv"]``."""
        import torch

        d, w = self.d, self.w
        h = self._rms(s["x"], w["norm1"])
        q = (self._rms(h @ w["q_a"].T, w["q_norm"]) @ w["q_b"].T).view(-1, d["heads"], d["nope"] + d["rope"])
        q_lat = torch.einsum("bhn,hln->bhl", q[..., : d["nope"]], w["uk"])
        torch.cat([q_lat, self._rope(q[..., d["nope"]:], L["cos"][:, None], L["sin"][:, None])], dim=-1, out=s["q"])
        kv = h @ w["kv_a"].T  # [C, latent + rope]
        new = torch.cat([self._rms(kv[:, : d["latent"]], w["kv_norm"]), self._rope(kv[:, d["latent"]:], L["cos"],
                                                                                   L["sin"])], dim=-1)  # fmt: skip
        s["kv"].view(-1, kv.shape[1]).index_copy_(0, s["rows"], new)

    def attention(self, L: dict, s: dict) -> None:
        """kinv's MLA decode kernel over the set's cache, into ``s["o"]`` (no host sync: capturable)."""
        from kinv.kernels.mla_decode import mla_decode_launch

        mla_decode_launch(s["q"], s["kv"], s["table"], L["lens"], L["mla_params"], d_v=s["q"].shape[2],
                          sm_scale=self.sm_scale, max_seq_len=self.context, num_splits=L["splits"],
                          scratch=L["scratch"], out=s["o"])  # fmt: skip

    def attention_out(self, L: dict, s: dict) -> None:
        """The latent output absorbed back per head, o_proj, the residual (``s["h1"]``) and the MoE's RMSNorm."""
        import torch

        o = torch.einsum("bhl,hvl->bhv", s["o"], self.w["uv"]).reshape(s["x"].shape[0], -1)
        torch.add(s["x"], o @ self.w["o"].T, out=s["h1"])
        torch.mul(self._rms(s["h1"], 1), self.w["norm2"], out=s["moe_in"])

    def route(self, h):
        import torch

        probs = torch.softmax((h @ self.w["router"].T).float(), dim=-1)
        weights, ids = probs.topk(self.d["top_k"], dim=-1)
        return weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)

    def routed(self, L: dict, h, weights, ids, up_out=None, down_out=None):
        """The routed experts through kinv's grouped GEMM: gate+up, SiLU x up, down, weighted combine (float32)."""
        import torch

        from kinv.kernels.moe_expert_gemm import moe_align, moe_expert_gemm_launch

        d, p = self.d, L["up_params"]
        align = moe_align(ids, d["experts"], p.BLOCK_M, static_shape=True)  # no host sync: capturable
        up, _ = moe_expert_gemm_launch(h, self.w["gate_up"], ids, p, align=align, out=up_out)  # [C, k, 2 inter]
        act = (torch.nn.functional.silu(up[..., : d["inter"]]) * up[..., d["inter"]:]).reshape(-1, d["inter"])
        # pair t * k + j is row t * k + j of ``act`` with one route: the gate+up's sorted pair indices serve as they are
        down, _ = moe_expert_gemm_launch(act, self.w["down"], ids.reshape(-1, 1), p, align=align, out=down_out)
        return (down.view(h.shape[0], d["top_k"], -1).float() * weights[..., None]).sum(1)

    def moe(self, L: dict, s: dict) -> None:
        """Router, routed and shared experts and the residual: ``s["out"]``."""
        import torch

        h, d = s["moe_in"], self.d
        weights, ids = self.route(h)
        routed = self.routed(L, h, weights, ids).to(self.dtype)
        sh = h @ self.w["sh_gate_up"].T
        shared = (torch.nn.functional.silu(sh[:, : d["shared"]]) * sh[:, d["shared"]:]) @ self.w["sh_down"].T
        torch.add(s["h1"], routed + shared, out=s["out"])

    def step(self, L: dict, s: dict) -> None:
        self.attention_in(L, s)
        self.attention(L, s)
        self.attention_out(L, s)
        self.moe(L, s)

    # ---- correctness ------------------------------------------------------------------
    def check(self, L: dict) -> dict:
        """One step on set 0: the attention against kinv's float32 reference (the MLA adapter's tolerance at this
        level), the routed experts against a float32 torch reference; outputs NaN-filled first.  Refused (exit 3)."""
        import torch

        from kinv.kernels.mla_decode_ref import mla_decode_reference
        from kinv.kernels.moe_expert_gemm_ref import moe_expert_gemm_reference

        mla = self.cfg["mla_decode"][0]
        moe = self.cfg["moe_expert_gemm"][0]
        s, d, C = L["sets"][0], self.d, L["batch"]
        self.attention_in(L, s)
        s["o"].fill_(float("nan"))
        self.attention(L, s)
        ref = mla_decode_reference(s["q"], s["kv"], s["table"], L["lens"], d_v=s["q"].shape[2], sm_scale=self.sm_scale)
        atol, rtol, norm = mla.tolerance_at(self.dtype, L["mla_level"], ref)
        why = _compare(s["o"], ref, atol, rtol, norm if norm is not None else 1.0)
        if why:
            raise Refused(f"attention (MLA decode, {L['mla_params'].short()}) disagrees with kinv's reference at "
                          f"C={C}: {why}", code=3)  # fmt: skip
        att_rel = float((s["o"].float() - ref).norm() / ref.norm())

        self.attention_out(L, s)
        h = s["moe_in"]
        weights, ids = self.route(h)
        nan = float("nan")
        up_out = torch.full((C, d["top_k"], 2 * d["inter"]), nan, device=self.device, dtype=self.dtype)
        down_out = torch.full((C * d["top_k"], 1, d["hidden"]), nan, device=self.device, dtype=self.dtype)
        got = self.routed(L, h, weights, ids, up_out=up_out, down_out=down_out)
        up_ref = moe_expert_gemm_reference(h, self.w["gate_up"], ids)  # float32
        act = torch.nn.functional.silu(up_ref[..., : d["inter"]]) * up_ref[..., d["inter"]:]
        down_ref = torch.empty((C, d["top_k"], d["hidden"]), device=self.device, dtype=torch.float32)
        for e in torch.unique(ids).tolist():
            t, j = (ids == e).nonzero(as_tuple=True)
            down_ref[t, j] = act[t, j] @ self.w["down"][e].float().T
        ref = (down_ref * weights[..., None]).sum(1)
        atol, rtol = moe.tolerance(self.dtype)
        rms = float(ref.pow(2).mean().sqrt())
        name = str(self.dtype).rsplit(".", 1)[-1]
        why = _compare(got, ref, 2 * atol * rms, 2 * rtol, MOE_NORM.get(name, 2e-2))
        if why:
            raise Refused(f"routed experts (grouped GEMM, {L['up_params'].short()}) disagree with the torch reference "
                          f"at C={C}: {why}", code=3)  # fmt: skip
        if self.device == "cuda":
            torch.cuda.synchronize()
        return {"attention_rel_err": float(f"{att_rel:.3g}"),
                "routed_rel_err": float(f"{float((got - ref).norm() / ref.norm()):.3g}")}  # fmt: skip


# --------------------------------------------------------------------------- #
# timing
# --------------------------------------------------------------------------- #
PARTS = ("step", "attention", "moe")


class Timed:
    """A level ready to time: checked, and on CUDA one graph per part (step, attention, MoE) over every input set."""

    def __init__(self, layer: Layer, batch: int, levels: int = 1):
        import torch

        self.layer, self.L = layer, layer.level(batch, levels)
        self.checked = layer.check(self.L)
        self.graphs = {}
        if layer.device != "cuda":
            return
        L, sets = self.L, self.L["sets"]
        fns = {"step": layer.step, "attention": layer.attention, "moe": layer.moe}
        outs = {"step": "out", "attention": "o", "moe": "out"}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile, and warm the allocator, outside the graphs
                for s in sets:
                    layer.step(L, s)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for part in PARTS:
            eager = sets[0][outs[part]].clone()  # the eager step's output (every part of it ran above)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
                for s in sets:
                    fns[part](L, s)
            torch.cuda.current_stream().wait_stream(stream)
            for s in sets:
                s[outs[part]].fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            seen = sets[0][outs[part]].float()
            rel = float((seen - eager.float()).norm() / eager.float().norm().clamp_min(1e-30))
            if not (bool(seen.isfinite().all()) and rel <= GRAPH_NORM):
                raise Refused(f"the captured {part} graph at C={batch} does not compute the eager step's result "
                              f"(relative difference {rel:.2e})", code=3)  # fmt: skip
            self.graphs[part] = g

    def _graph_us(self, g, seconds: float) -> tuple[float, int]:
        """Median µs per step of batches of replays over ``seconds`` (each replay runs every input set once)."""
        import torch

        n = len(self.L["sets"])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        g.replay()
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        replay_s = max(start.elapsed_time(end) / 1e3, 1e-6)
        per = max(1, round(seconds / 8 / replay_s))  # about 8 batches
        times, t_end = [], time.perf_counter() + seconds
        while len(times) < 3 or time.perf_counter() < t_end:
            start.record()
            for _ in range(per):
                g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / (per * n))
        return statistics.median(times), len(times) * per * n

    def _eager_interleaved(self, fns: dict, seconds: float) -> tuple[dict, dict]:
        """Median µs of eager calls of every part, the parts called in turn on the same input set (at least three
        turns): a load on the machine lands on the step and on its parts alike, so a part's share stays a share."""
        sets, times = self.L["sets"], {p: [] for p in fns}
        t_end, i = time.perf_counter() + seconds, 0
        while i < 3 or time.perf_counter() < t_end:
            s = sets[i % len(sets)]
            for part, fn in fns.items():
                t0 = time.perf_counter()
                fn(self.L, s)
                times[part].append((time.perf_counter() - t0) * 1e6)
            i += 1
        return {p: statistics.median(t) for p, t in times.items()}, {p: len(t) for p, t in times.items()}

    def measure(self, seconds: float) -> dict:
        L, layer = self.L, self.layer
        share = {"step": 0.7, "attention": 0.15, "moe": 0.15}
        us, calls = {}, {}
        if layer.device == "cuda":
            for part in PARTS:
                us[part], calls[part] = self._graph_us(self.graphs[part], seconds * share[part])
        else:  # eager in the interpreter: the plumbing, not the GPU's speed
            fns = {"step": layer.step, "attention": layer.attention, "moe": layer.moe}
            us, calls = self._eager_interleaved(fns, seconds)
        step = us["step"]
        cfg = layer.cfg
        return {"tokens_per_s": round(L["batch"] / (step * 1e-6), 3), "step_us": round(step, 3),
                "attention_us": round(us["attention"], 3), "attention_share": round(us["attention"] / step, 4),
                "moe_us": round(us["moe"], 3), "moe_share": round(us["moe"] / step, 4),
                "C": L["batch"], "context": layer.context, "TARGET_CTAS": cfg["target_ctas"],
                "TARGET_CTAS_env": os.environ.get("TARGET_CTAS"), "num_splits": L["splits"],
                "split_rule": L["split_rule"], "mla_config": L["mla_params"].short(),
                "mla_config_file": str(cfg["mla_decode"][2]), "moe_config": L["up_params"].short(),
                "moe_config_file": str(cfg["moe_expert_gemm"][2]), "input_sets": len(L["sets"]),
                "kv_working_set_mib": round(len(L["sets"]) * L["kv_bytes"] / 2**20, 3),
                "steps_timed": calls["step"], "timing": "cuda-graph" if layer.device == "cuda" else "eager",
                "dtype": str(layer.dtype).rsplit(".", 1)[-1], "tiny": layer.d is TINY, **self.checked,
                "device": _device_name()}  # fmt: skip


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (Triton interpreter)"


def _layer(args) -> Layer:
    if args.context < 1 or args.context > 131072:
        raise Refused(f"--context {args.context} must be from 1 to 131072")
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        raise Refused("the full layer on the CPU interpreter would take hours: add --tiny")
    if not cuda:
        # the interpreter runs the kernels on CPU tensors; it must be on before triton compiles them
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ["TRITON_INTERPRET"] != "1":
            raise Refused(f"no GPU here and TRITON_INTERPRET={os.environ['TRITON_INTERPRET']!r}: set it to 1 (or unset)")
    # bf16 on the GPU; float32 in the interpreter, whose bf16 dot is wrong (docs/gpu.md)
    return Layer(TINY if args.tiny else FULL, args.context, "cuda" if cuda else "cpu",
                 torch.bfloat16 if cuda else torch.float32)  # fmt: skip


# --------------------------------------------------------------------------- #
# modes
# --------------------------------------------------------------------------- #
def run(args) -> None:
    print(json.dumps(Timed(_layer(args), args.concurrency).measure(args.seconds)), flush=True)


def serve(args) -> None:
    import http.server
    import urllib.parse

    try:
        levels = sorted({int(c) for c in args.levels.split(",")})
    except ValueError:
        raise Refused(f"--levels {args.levels!r} must be comma-separated integers such as 1,8,32") from None
    if not levels or levels[0] < 1:
        raise Refused(f"--levels {args.levels!r} must be positive integers such as 1,8,32")
    layer = _layer(args)
    ready = {c: Timed(layer, c, len(levels)) for c in levels}  # built, checked and captured before the port opens

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
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
            if not 0 < secs <= 600:
                return self._send(400, {"error": f"seconds={secs} must be above 0 and at most 600"})
            try:
                return self._send(200, ready[c].measure(secs))
            except Exception as exc:  # noqa: BLE001 - the client gets one line; the server keeps serving
                return self._send(500, {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})

    srv = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    print(json.dumps({"serving": sorted(ready), "port": args.port, "pid": os.getpid()}), flush=True)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()


def client(args) -> None:
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{args.port}/step?C={args.concurrency}&seconds={args.seconds}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:  # noqa: S310 - the local server of this arm
            body = json.loads(r.read().decode())
    except urllib.error.HTTPError as exc:
        try:
            said = json.loads(exc.read().decode()).get("error", "")
        except (ValueError, AttributeError, OSError):
            said = ""
        raise Refused(f"the server answered {exc.code} for C={args.concurrency}: {said or exc.reason}", code=1) from None
    except (OSError, ValueError) as exc:
        raise Refused(f"no answer from a server at {url}: {exc}", code=1) from None
    print(json.dumps(body), flush=True)


def _stop(signum, frame):
    raise KeyboardInterrupt  # unwinds serve_forever (or the start-up) in the main thread


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("run", "serve", "client"):
        p = sub.add_parser(name)
        p.add_argument("--seconds", type=float, default=1.0, help="about how long to time (the step, then its parts)")
        if name != "client":
            p.add_argument("--context", type=int, default=4096, help="tokens of KV per request")
            p.add_argument("--tiny", action="store_true", help="every dimension small: the CPU interpreter")
        if name != "serve":
            p.add_argument("--concurrency", type=int, required=True, help="C: requests decoding one token each")
        if name != "run":
            p.add_argument("--port", type=int, required=True)
        if name == "serve":
            p.add_argument("--levels", default="1,8,32,64,96", help="the concurrencies to build, check and capture")
        if name == "client":
            p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server's answer")
    args = ap.parse_args(argv)
    if getattr(args, "concurrency", 1) < 1:
        print(f"decode_step: --concurrency {args.concurrency} must be a positive integer", file=sys.stderr)
        return 2
    if not 0 < args.seconds <= 600:
        print(f"decode_step: --seconds {args.seconds} must be above 0 and at most 600", file=sys.stderr)
        return 2
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.mode == "serve":
        import signal

        signal.signal(signal.SIGTERM, _stop)
    try:
        {"run": run, "serve": serve, "client": client}[args.mode](args)
    except Refused as exc:
        print(f"decode_step: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: a server's clean stop
        return 0 if args.mode == "serve" else 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
