"""The kinv adapter of the MLA split-K decode kernel (``kernels/mla_decode.py``)."""

from __future__ import annotations

import math
import os

from kernels.adapter import KernelAdapter, Level, Resources
from kernels.devices import DeviceSpec, occupancy
from kernels.launch_config import LaunchParams

# Model shapes: (d_qk, d_v).  K is the whole latent row, V its first d_v values.
SHAPES: dict[str, tuple[int, int]] = {
    "v3": (576, 512),  # DeepSeek-V3: 512 latent + 64 rope
    "v4flash": (512, 512),  # DeepSeek-V4-Flash: 448 latent + 64 rope
}
ELT = 2  # bytes per element of bf16/fp16, the dtypes kinv benchmarks

# Analytical shared-memory model of stage 1 (bytes), calibrated against the
# kernels Triton 3.6 compiled for sm_90 (benchmarks/results/, kernels/NOTES.md):
#  * the queries pass once through shared memory on their way into the dot
#    operand layout: BLOCK_H x D_QK elements;
#  * num_stages = 1 (no pipelining): the BLOCK_T x D_V latent tile is staged
#    twice, once transposed for Q.K^T and once for P.V;
#  * num_stages >= 2: the KV tile is copied asynchronously into one buffer of
#    BLOCK_T x D_QK, plus 32 bytes per token of barriers/indices; from 3 stages
#    the page indices are pipelined too (4 bytes per token per load stream:
#    one stream for V4-Flash, two (main + rope tail) for V3).
def stage1_smem_estimate(params: LaunchParams, d_qk: int, d_v: int = 512, elt: int = ELT) -> int:
    q_scratch = params.BLOCK_H * d_qk * elt
    if params.num_stages <= 1:
        return 2 * params.BLOCK_T * d_v * elt + q_scratch
    streams = 1 if d_qk == d_v else 2
    index_pipe = 4 * params.BLOCK_T * streams if params.num_stages >= 3 else 0
    return params.BLOCK_T * d_qk * elt + q_scratch + 32 * params.BLOCK_T + index_pipe


class MLADecodeAdapter(KernelAdapter):
    name = "mla_decode"
    kernel_files = ("kernels/mla_decode.py",)
    reference_parts = (
        ("kernels/mla_decode_ref.py", "mla_decode_reference"),
        ("kernels/mla_decode_adapter.py", "MLADecodeAdapter.reference"),
        ("kernels/mla_decode_adapter.py", "MLADecodeAdapter.bytes_moved"),
    )

    # ---- inputs --------------------------------------------------------------
    def make_inputs(self, level: Level, seed: int, device: str = "cuda", dtype=None, vary_lengths=False) -> dict:
        import torch

        dtype = dtype or torch.bfloat16
        if level.shape not in SHAPES:
            raise ValueError(f"unknown shape {level.shape!r}; valid shapes: {', '.join(SHAPES)}")
        d_qk, d_v = SHAPES[level.shape]
        gen = torch.Generator(device=device).manual_seed(seed)
        b, p = level.batch, level.page_size
        if vary_lengths:
            lens = torch.randint(1, level.context + 1, (b,), generator=gen, device=device)
            lens[0] = level.context
        else:
            lens = torch.full((b,), level.context, device=device)
        max_pages = math.ceil(level.context / p)
        num_pages = b * max_pages
        block_table = torch.randperm(num_pages, generator=gen, device=device).view(b, max_pages).to(torch.int32)
        kv = torch.randn((num_pages, p, d_qk), generator=gen, device=device, dtype=torch.float32).to(dtype)
        q = torch.randn((b, level.heads, d_qk), generator=gen, device=device, dtype=torch.float32).to(dtype)
        return {
            "q": q,
            "kv_cache": kv,
            "block_table": block_table,
            "seq_lens": lens.to(torch.int32),
            "max_seq_len": level.context,
            "d_v": d_v,
        }

    # ---- the kernel ------------------------------------------------------------
    def launch(self, inputs: dict, params: LaunchParams, out=None, target_ctas=None, scratch=None):
        from kernels.mla_decode import mla_decode_launch

        return mla_decode_launch(
            inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"], params,
            d_v=inputs["d_v"], max_seq_len=inputs["max_seq_len"], out=out, target_ctas=target_ctas,
            scratch=scratch,
        )  # fmt: skip

    def make_scratch(self, inputs: dict, params: LaunchParams, target_ctas=None) -> dict:
        from kernels.mla_decode import mla_decode_scratch, num_kv_splits

        b, h, _ = inputs["q"].shape
        splits = num_kv_splits(b, math.ceil(h / params.BLOCK_H), inputs["max_seq_len"], params.BLOCK_T, target_ctas)
        return mla_decode_scratch(b, h, splits, inputs["d_v"], inputs["q"].device)

    def reference(self, inputs: dict):
        from kernels.mla_decode_ref import mla_decode_reference

        return mla_decode_reference(
            inputs["q"], inputs["kv_cache"], inputs["block_table"], inputs["seq_lens"], d_v=inputs["d_v"]
        )

    def check_modes(self) -> list[dict]:
        # the plain split count, and one split: a program then walks every tile of its sequence
        return [{}, {"target_ctas": 1}]

    def tolerance(self, dtype) -> tuple[float, float]:
        import torch

        if dtype == torch.float32:
            return (2e-3, 2e-3)  # tf32 dots
        if dtype == torch.float16:
            return (1e-2, 1e-2)
        return (3e-2, 3e-2)  # bf16: 8 mantissa bits in p and the inputs

    # ---- costs -----------------------------------------------------------------
    def bytes_moved(self, level: Level) -> int:
        d_qk, d_v = SHAPES[level.shape]
        kv = level.batch * level.context * d_qk * ELT
        q = level.batch * level.heads * d_qk * ELT
        out = level.batch * level.heads * d_v * ELT
        return kv + q + out

    def flops(self, level: Level) -> int:
        d_qk, d_v = SHAPES[level.shape]
        return 2 * level.batch * level.heads * level.context * (d_qk + d_v)

    # ---- environment and resources ---------------------------------------------
    def derived_env(self, level: Level, params: LaunchParams, environ: dict) -> dict:
        from kernels.mla_decode import num_kv_splits, target_ctas_from_env

        target = target_ctas_from_env(environ)
        head_tiles = math.ceil(level.heads / params.BLOCK_H)
        splits = num_kv_splits(level.batch, head_tiles, level.context, params.BLOCK_T, target)
        return {"TARGET_CTAS": target, "num_splits": splits, "head_tiles": head_tiles}

    def resources(self, params: LaunchParams, level: Level, device: DeviceSpec, compiled=None) -> Resources:
        d_qk, d_v = SHAPES[level.shape]
        est = stage1_smem_estimate(params, d_qk, d_v)
        res = Resources(smem_estimate=est)
        if compiled is not None:
            res.smem_compiled = int(compiled.metadata.shared)
            res.registers = int(getattr(compiled, "n_regs", 0)) or None
            res.spills = int(getattr(compiled, "n_spills", 0))
        smem = res.smem_compiled if res.smem_compiled is not None else est
        res.occupancy = occupancy(device, num_warps=params.num_warps, regs_per_thread=res.registers, smem_bytes=smem)
        if smem > device.smem_per_block:
            res.feasible = False
            res.reason = (
                f"needs {smem / 1024:.1f} KB shared memory per block; {device.arch} allows "
                f"{device.smem_per_block / 1024:.1f} KB"
            )
        env = self.derived_env(level, params, dict(os.environ))
        splits = env["num_splits"]
        tiles = math.ceil(level.context / params.BLOCK_T)
        res.why = {
            "tile": f"[{params.BLOCK_H} heads x {params.BLOCK_T} tokens] x {d_qk}",
            "mma_tile": f"[{params.BLOCK_H},{params.BLOCK_T}]",
            "num_splits": splits,
            "iterations_per_split": math.ceil(tiles / splits),
            "ctas": level.batch * env["head_tiles"] * splits,
            "waves": round(level.batch * env["head_tiles"] * splits / (device.sms * max(1, res.occupancy["ctas_per_sm"])), 2),
        }
        return res
