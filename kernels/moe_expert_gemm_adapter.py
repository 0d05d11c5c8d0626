"""The kinv adapter of the MoE expert grouped GEMM (``kernels/moe_expert_gemm.py``).

A second kernel, written against the plugin contract only: its own tunables (BLOCK_M/BLOCK_N/BLOCK_K,
GROUP_M, num_warps, num_stages), its own levels (tokens x experts x top_k x hidden x N) and its own
throughput unit (TFLOP/s).  Nothing in kinv names any of them.
"""

from __future__ import annotations

import math

from kinv.kernels.adapter import KernelAdapter, Level, Resources, check_level_values
from kinv.kernels.devices import DeviceSpec, occupancy
from kinv.kernels.tunables import Params, Restriction, Tunable, TunableSpec

ELT = 2  # bf16 / fp16 bytes per element, the dtypes kinv benchmarks

SPEC = TunableSpec(
    kernel="moe_expert_gemm",
    tunables=(
        Tunable("BLOCK_M", (16, 32, 64, 128), "BM", "16, 32, 64 or 128 (routed rows per tile)"),
        Tunable("BLOCK_N", (32, 64, 128, 256), "BN", "32, 64, 128 or 256 (output columns per tile)"),
        Tunable("BLOCK_K", (32, 64, 128, 256), "BK", "32, 64, 128 or 256 (hidden per step)"),
        Tunable("GROUP_M", (1, 4, 8, 16), "G", "1, 4, 8 or 16 (M blocks per swizzle group)"),
        Tunable("num_warps", (2, 4, 8), "w", "2, 4 or 8"),
        Tunable("num_stages", (1, 2, 3, 4, 5), "s", "an integer from 1 to 5"),
    ),
    restrictions=(
        Restriction("BLOCK_M x BLOCK_N <= 8192 x num_warps (the float32 accumulator must fit in registers)",
                    lambda v: v["BLOCK_M"] * v["BLOCK_N"] <= 8192 * v["num_warps"]),
    ),
    override_dims={"tokens": "t"},
)

CPU_CAPS = {"tokens": 4, "experts": 8, "top_k": 2, "hidden": 64, "n": 64}


def smem_estimate(params, elt: int = ELT) -> int:
    """Shared memory of one program: the x and w tiles of each buffered pipeline stage (Triton's pipeliner
    keeps ``num_stages - 1`` tiles in flight: exactly what the compiler allocated for every recorded config on
    the H200, tests/agent/tools/measure/test_compiled_model.py)."""
    return (params.BLOCK_M + params.BLOCK_N) * params.BLOCK_K * elt * max(1, params.num_stages - 1)


def _workload_model():
    from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

    class MoEWorkload(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        levels: list[int] = Field(description="tokens per decode step on this GPU (batch), e.g. [1, 8, 32, 64, 96]")
        experts: int = Field(32, ge=1, le=1024, description="routed experts held by this GPU")
        top_k: int = Field(8, ge=1, le=64, description="experts each token is routed to")
        hidden: int = Field(7168, ge=16, le=65536, description="model hidden size (K)")
        intermediate: int = Field(2048, ge=16, le=65536, description="expert intermediate size; the gate+up "
                                  "projection has N = 2 x intermediate outputs")

        @field_validator("levels")
        @classmethod
        def _levels(cls, v):
            return check_level_values(v, "token counts", 65536)

        @model_validator(mode="after")
        def _routes(self):
            if self.top_k > self.experts:
                raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}: a token's experts are distinct")
            return self

    return MoEWorkload


class MoEExpertGemmAdapter(KernelAdapter):
    name = "moe_expert_gemm"
    spec = SPEC
    level_dims = ("tokens", "experts", "top_k", "hidden", "n")
    throughput_unit = "TFLOP/s"
    example_plan = "plans/4a-expert-gemm-tiles.yaml"
    fresh_inputs = ("x",)  # the tokens' activations: the expert weights stay, the activations are new every step
    kernel_files = ("kernels/moe_expert_gemm.py",)
    profile_kernels = "_moe_expert_gemm_kernel"
    reference_parts = (
        ("kernels/moe_expert_gemm_ref.py", "moe_expert_gemm_reference"),
        ("kernels/moe_expert_gemm_adapter.py", "MoEExpertGemmAdapter.reference"),
        ("kernels/moe_expert_gemm_adapter.py", "MoEExpertGemmAdapter.bytes_moved"),
        ("kernels/moe_expert_gemm_adapter.py", "MoEExpertGemmAdapter.flops"),
    )

    # ---- workload ------------------------------------------------------------------
    def level_key(self, dims) -> str:
        return f"t{dims['tokens']}/e{dims['experts']}/k{dims['top_k']}/h{dims['hidden']}/n{dims['n']}"

    def level_label(self, dims) -> str:
        return f"t{dims['tokens']}"

    def workload_model(self):
        return _workload_model()

    def levels(self, workload) -> list[Level]:
        return [self.level({"tokens": t, "experts": workload.experts, "top_k": workload.top_k,
                            "hidden": workload.hidden, "n": 2 * workload.intermediate}) for t in workload.levels]  # fmt: skip

    def workload_notes(self, workload, baseline: dict) -> list[str]:
        w = workload
        notes = [f"{w.experts} experts x top-{w.top_k}: gate+up GEMM {2 * w.intermediate} x {w.hidden} per expert "
                 f"({2 * w.intermediate * w.hidden * ELT / 2**20:.0f} MiB of weights each)"]  # fmt: skip
        for t in w.levels:
            a = expected_active(t, w.experts, w.top_k)
            notes.append(f"t{t}: ~{a:.1f} active experts")
        return notes

    def stand_in(self, level: Level, device: str) -> Level:
        if device != "cpu":
            return level
        d = {k: min(level.dims[k], cap) for k, cap in CPU_CAPS.items()}
        d["top_k"] = min(d["top_k"], d["experts"])
        return self.level(d)

    def throughput(self, level: Level, us: float) -> float:
        return self.flops(level) / (us * 1e-6) / 1e12

    # ---- the kernel ------------------------------------------------------------------
    def make_inputs(self, level: Level, seed: int, device: str = "cuda", dtype=None, vary_lengths: bool = False) -> dict:
        import torch

        from kinv.kernels.moe_expert_gemm import moe_make_inputs

        dtype = dtype or torch.bfloat16
        x, w, ids = moe_make_inputs(level.tokens, level.experts, level.top_k, level.hidden, level.n, seed, device, dtype)
        return {"x": x, "w": w, "topk_ids": ids}

    def make_scratch(self, inputs: dict, params: Params) -> dict:
        from kinv.kernels.moe_expert_gemm import moe_align

        # the routing metadata: computed outside the timed graph (it syncs with the host)
        return {"align": moe_align(inputs["topk_ids"], inputs["w"].shape[0], params.BLOCK_M)}

    def launch(self, inputs: dict, params: Params, out=None, scratch=None, **mode):
        from kinv.kernels.moe_expert_gemm import moe_expert_gemm_launch

        align = scratch["align"] if scratch else None
        return moe_expert_gemm_launch(inputs["x"], inputs["w"], inputs["topk_ids"], params, out=out, align=align)

    def reference(self, inputs: dict):
        from kinv.kernels.moe_expert_gemm_ref import moe_expert_gemm_reference

        return moe_expert_gemm_reference(inputs["x"], inputs["w"], inputs["topk_ids"])

    def tolerance(self, dtype) -> tuple[float, float]:
        import torch

        if dtype == torch.float32:
            return (2e-3, 2e-3)  # tf32 dots
        if dtype == torch.float16:
            return (1e-2, 1e-2)
        return (3e-2, 3e-2)

    # ---- costs -----------------------------------------------------------------------
    def bytes_moved(self, level: Level) -> int:
        """Weights of the expected number of active experts, once, plus x in and the output out."""
        a = expected_active(level.tokens, level.experts, level.top_k)
        w = a * level.n * level.hidden * ELT
        return int(w + level.tokens * level.hidden * ELT + level.tokens * level.top_k * level.n * ELT)

    def flops(self, level: Level) -> int:
        return 2 * level.tokens * level.top_k * level.n * level.hidden

    # ---- resources ---------------------------------------------------------------------
    def resources(self, params: Params, level: Level, device: DeviceSpec, compiled=None) -> Resources:
        est = smem_estimate(params)
        res = Resources(smem_estimate=est)
        if compiled is not None and getattr(compiled, "metadata", None) is not None:
            res.smem_compiled = int(compiled.metadata.shared)
            res.registers = int(getattr(compiled, "n_regs", 0)) or None
            res.spills = int(getattr(compiled, "n_spills", 0))
        smem = res.smem_compiled if res.smem_compiled is not None else est
        res.occupancy = occupancy(device, num_warps=params.num_warps, regs_per_thread=res.registers, smem_bytes=smem)
        if smem > device.smem_per_block:
            res.feasible = False
            res.reason = (f"needs {smem / 1024:.1f} KB shared memory per block; {device.arch} allows "
                          f"{device.smem_per_block / 1024:.1f} KB")  # fmt: skip
        pairs = level.tokens * level.top_k
        a = expected_active(level.tokens, level.experts, level.top_k)
        m_blocks = math.ceil(a) + pairs // params.BLOCK_M  # upper estimate: one partial block per active expert
        programs = m_blocks * math.ceil(level.n / params.BLOCK_N)
        res.why = {
            "tile": f"[{params.BLOCK_M} rows x {params.BLOCK_N} cols] x {params.BLOCK_K} per step",
            "active_experts": round(a, 1),
            "programs": programs,
            "waves": round(programs / (device.sms * max(1, res.occupancy.get("ctas_per_sm", 1))), 2),
            "row_fill": round(pairs / max(1, m_blocks * params.BLOCK_M), 2),
        }
        return res


def expected_active(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts hit when each token picks ``top_k`` distinct experts uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)
