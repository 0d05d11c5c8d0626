"""Device limits and the occupancy they imply.  Standard library only.

Figures are vendor data (CUDA programming guide, compute-capability tables)
except where noted; a live GPU is always preferred: :func:`detect` reads the
SM count and name from the device and falls back to this table for the rest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from kinv.kernels.errors import BadInput
from kinv.kernels.moved import moved


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    arch: str  # sm_XX
    sms: int
    smem_per_block: int  # bytes, opt-in maximum for one CTA
    smem_per_sm: int  # bytes usable by all CTAs of one SM
    smem_reserved_per_block: int  # bytes the driver reserves per CTA
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    reg_alloc_unit: int = 256  # registers per warp are allocated in this granule
    matrix_tflops: float | None = None  # dense bf16 matrix-unit peak, measured (docs/gpu.md); None where unknown

    def to_dict(self) -> dict:
        return asdict(self)


DEVICES: dict[str, DeviceSpec] = {
    # Hopper: 228 KB shared memory per SM, 227 KB opt-in per block.
    "sm_90": DeviceSpec("NVIDIA H200 / H100 SXM", "sm_90", 132, 232448, 233472, 1024, 65536, 255, 2048, 32,
                        matrix_tflops=686.0),  # bf16 8192^3 on the H200, docs/gpu.md
    # Blackwell datacenter (B200): same per-SM limits as Hopper, 148 SMs.
    "sm_100": DeviceSpec("NVIDIA B200", "sm_100", 148, 232448, 233472, 1024, 65536, 255, 2048, 32),
    # Blackwell workstation (RTX PRO 6000): 99 KB per block (Triton's "Hardware
    # limit: 101376"), 100 KB per SM, 1536 threads per SM, 188 SMs.
    "sm_120": DeviceSpec("NVIDIA RTX PRO 6000 Blackwell", "sm_120", 188, 101376, 102400, 1024, 65536, 255, 1536, 32),
    # whatever machine runs a plan's own command (kernel: command): no GPU limits apply
    "host": DeviceSpec("the machine that runs the command", "host", 0, 0, 0, 0, 0, 0, 0, 0),
}
ALIASES = {"h100": "sm_90", "h200": "sm_90", "hopper": "sm_90", "b200": "sm_100", "rtx6000": "sm_120",
           "rtx-pro-6000": "sm_120", "blackwell-workstation": "sm_120"}  # fmt: skip


def get_device(name: str) -> DeviceSpec:
    """A device by arch (``sm_90``) or alias (``h200``); unknown names list the valid ones."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DEVICES:
        valid = ", ".join(sorted(DEVICES) + sorted(ALIASES))
        raise BadInput(f"unknown device {name!r}; valid: {valid}")
    return DEVICES[key]


def roofline(bytes_moved: float, flops: float, copy_gbps: float | None,
             matrix_tflops: float | None) -> tuple[float, str] | None:
    """The roofline: the fewest seconds a call that moves ``bytes_moved`` bytes and computes ``flops`` FLOPs can
    take, and what bounds it: ``(seconds, "memory")`` at the copy bandwidth, ``(seconds, "compute")`` at the matrix
    peak, whichever is slower (None with neither figure)."""
    mem = bytes_moved / (copy_gbps * 1e9) if copy_gbps else None
    comp = flops / (matrix_tflops * 1e12) if matrix_tflops else None
    if mem is None and comp is None:
        return None
    if comp is not None and (mem is None or comp > mem):
        return comp, "compute"
    return mem, "memory"


def detect():
    """The visible CUDA device as a DeviceSpec, or None without a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}"
    base = DEVICES.get(arch, DEVICES["sm_90"])
    return replace(base, name=props.name, arch=arch, sms=props.multi_processor_count)


def occupancy(device: DeviceSpec, *, num_warps: int, regs_per_thread: int | None, smem_bytes: int) -> dict:
    """CTAs per SM allowed by each limit, and the binding one.

    Registers: each warp takes ``regs_per_thread * 32`` rounded up to the
    allocation unit; shared memory: each CTA also costs the driver's reserve.
    """
    limits = {
        "threads": device.max_threads_per_sm // (32 * num_warps),
        "ctas": device.max_ctas_per_sm,
    }
    if regs_per_thread:
        per_warp = -(-regs_per_thread * 32 // device.reg_alloc_unit) * device.reg_alloc_unit
        limits["registers"] = device.regs_per_sm // (per_warp * num_warps)
    if smem_bytes > device.smem_per_block:
        limits["shared_memory"] = 0
    elif smem_bytes > 0:
        limits["shared_memory"] = device.smem_per_sm // (smem_bytes + device.smem_reserved_per_block)
    binding = min(limits, key=lambda k: limits[k])
    ctas = limits[binding]
    return {
        "ctas_per_sm": ctas,
        "warps_per_sm": ctas * num_warps,
        "limited_by": binding,
        "limits": limits,
    }


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: UnknownDeviceError (now BadInput)
    return moved(__name__, name)
