"""The row-wise softmax's kinv adapter, written against kinv 0.2.0's API with its import paths of the time
(frozen: never edited; kinv keeps these paths working, with a DeprecationWarning, until the release that removes
them)."""

from kinv.kernels.adapter import KernelAdapter, Level, Resources, check_level_values
from kinv.kernels.devices import DeviceSpec, occupancy
from kinv.kernels.errors import BadInput
from kinv.kernels.launch_config import Params, Restriction, Tunable, TunableSpec

SPEC = TunableSpec(
    kernel="row_softmax",
    tunables=(Tunable("ROWS", (1, 2, 4), "r", said="rows per program: 1, 2 or 4"),
              Tunable("num_warps", (1, 2, 4, 8), "w")),
    restrictions=(Restriction("ROWS x num_warps <= 16", lambda v: v["ROWS"] * v["num_warps"] <= 16),),
)


def _workload():
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    class SoftmaxWorkload(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        rows: list[int] = Field(description="the row counts swept, one level each")
        cols: int = Field(1000, ge=1, le=16384, description="the length of every row")

        @field_validator("rows")
        @classmethod
        def _rows(cls, v):
            return check_level_values(v, "row counts", 1 << 20)

    return SoftmaxWorkload


class RowSoftmaxAdapter(KernelAdapter):
    name = "row_softmax"
    spec = SPEC
    level_dims = ("rows", "cols")
    throughput_unit = "GB/s"
    kernel_files = ("kinv_frozen_softmax/kernel.py",)
    reference_parts = (("kinv_frozen_softmax/adapter.py", "RowSoftmaxAdapter.reference"),)

    def workload_model(self):
        return _workload()

    def levels(self, workload) -> list[Level]:
        return [self.level({"rows": r, "cols": workload.cols}) for r in workload.rows]

    def stand_in(self, level: Level, device: str) -> Level:
        if device != "cpu":
            return level
        return self.level({"rows": min(level.rows, 9), "cols": min(level.cols, 100)})  # the interpreter is slow

    def make_inputs(self, level, seed, device="cuda", dtype=None, vary_lengths=False) -> dict:
        import torch

        g = torch.Generator(device=device).manual_seed(seed)
        x = 4 * torch.randn((level.rows, level.cols), generator=g, device=device)
        return {"x": x.to(dtype or torch.float16)}

    def launch(self, inputs, params: Params, out=None, scratch=None, **mode):
        from kinv_frozen_softmax.kernel import row_softmax

        x = inputs["x"]
        if x.dim() != 2:
            raise BadInput(f"row_softmax takes a 2-D tensor, got shape {tuple(x.shape)}")
        return row_softmax(x, params.ROWS, params.num_warps, out=out)

    def reference(self, inputs):
        import torch

        return torch.softmax(inputs["x"].float(), dim=-1)

    def tolerance(self, dtype):
        return (1e-2, 1e-2)

    def bytes_moved(self, level) -> int:
        return 2 * 2 * level.rows * level.cols  # the row read and written once, 2 bytes an element

    def flops(self, level) -> int:
        return 5 * level.rows * level.cols  # max, subtract, exp, sum, divide

    def throughput(self, level, us) -> float:
        return self.bytes_moved(level) / (us * 1e-6) / 1e9

    def resources(self, params: Params, level: Level, device: DeviceSpec, compiled=None) -> Resources:
        res = Resources(smem_estimate=0)
        if compiled is not None:
            res.smem_compiled = int(compiled.metadata.shared)
            res.registers = int(getattr(compiled, "n_regs", 0)) or None
            res.spills = int(getattr(compiled, "n_spills", 0))
        res.occupancy = occupancy(device, num_warps=params.num_warps, regs_per_thread=res.registers,
                                  smem_bytes=res.smem_compiled or 0)
        res.why = {"programs": -(-level.rows // params.ROWS)}
        return res
