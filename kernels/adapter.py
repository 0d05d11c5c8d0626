"""The plugin interface: what kinv needs to know to investigate a kernel.

A kernel is investigable once it has one :class:`KernelAdapter` subclass and
an entry in :data:`REGISTRY` (``name -> "module:Class"``, imported lazily).
Standard library only at import time; adapters import torch where used.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernels.devices import DeviceSpec
from kernels.launch_config import BOUNDS, PARAMS, LaunchParams, load_config, resolve, validate_config

KERNELS_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The directory holding the ``kernels`` package actually imported (a snapshot or a test copy
    when one is first on the path).  Kernel files, source patches and hashes are relative to it."""
    return KERNELS_DIR.parent


@dataclass(frozen=True)
class Level:
    """One workload level: batch (concurrency C) x context x model shape."""

    batch: int
    context: int
    shape: str = "v4flash"
    heads: int = 16
    page_size: int = 64

    @property
    def key(self) -> str:
        return f"{self.shape}/h{self.heads}/p{self.page_size}/ctx{self.context}/b{self.batch}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Resources:
    """Resources of one config at one level on one device."""

    smem_estimate: int
    smem_compiled: int | None = None
    registers: int | None = None
    spills: int | None = None
    occupancy: dict = field(default_factory=dict)
    feasible: bool = True
    reason: str = ""
    why: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class KernelAdapter(ABC):
    """Everything kinv needs from a kernel; one subclass per kernel."""

    name: str = ""
    #: kernel source files (relative to :func:`project_root`) that a source patch may change
    kernel_files: tuple[str, ...] = ()
    #: (file, qualified name) of the reference and the metric definitions: hashed for integrity
    reference_parts: tuple[tuple[str, str], ...] = ()

    # ---- configuration -----------------------------------------------------
    def config_path(self) -> Path:
        """The live config file; KINV_CONFIG_DIR moves it (tests point it at a copy)."""
        import os

        base = Path(os.environ["KINV_CONFIG_DIR"]) if os.environ.get("KINV_CONFIG_DIR") else KERNELS_DIR / "configs"
        return base / f"{self.name}.json"

    def bounds(self) -> dict:
        """Valid values of each launch parameter."""
        return {k: list(BOUNDS[k][0]) for k in PARAMS}

    def validate_config(self, data) -> dict:
        return validate_config(data, self.name)

    def load_config(self, path: Path | None = None) -> dict:
        return load_config(path or self.config_path(), self.name)

    def params_for(self, config: dict, level: Level) -> LaunchParams:
        return resolve(config, level.batch)

    # ---- the kernel ------------------------------------------------------------
    @abstractmethod
    def make_inputs(self, level: Level, seed: int, device: str = "cuda", dtype=None) -> dict:
        """Fresh random inputs for a level, reproducible from ``seed``."""

    @abstractmethod
    def launch(self, inputs: dict, params: LaunchParams):
        """Run the kernel; return ``(output, compiled_kernel_or_None)``."""

    def make_scratch(self, inputs: dict, params: LaunchParams) -> dict | None:
        """Scratch buffers one launch needs (passed back as ``launch(..., scratch=...)``), or ``None`` when the
        kernel allocates none.  The timing harness allocates them itself, fresh every round, so that no
        fixed placement of them biases an arm (GPU.md, "memory placement")."""
        return None

    @abstractmethod
    def reference(self, inputs: dict):
        """The float32 reference output for the same inputs."""

    @abstractmethod
    def bytes_moved(self, level: Level) -> int:
        """The fewest bytes one call must move through device memory."""

    @abstractmethod
    def flops(self, level: Level) -> int:
        """Floating-point operations of one call."""

    @abstractmethod
    def resources(self, params: LaunchParams, level: Level, device: DeviceSpec, compiled=None) -> Resources:
        """Shared memory, registers, occupancy and feasibility of a config."""

    def derived_env(self, level: Level, params: LaunchParams, environ: dict) -> dict:
        """Values derived from the environment at a level (e.g. split count)."""
        return {}

    def check_modes(self) -> list[dict]:
        """Extra launch keyword sets the correctness gate must also pass (e.g. one split, so every
        loop iteration of a program runs); ``{}`` is the plain launch."""
        return [{}]

    def tolerance(self, dtype) -> tuple[float, float]:
        """(atol, rtol) for comparing with the reference."""
        return (2e-2, 2e-2)


REGISTRY: dict[str, str] = {
    "mla_decode": "kernels.mla_decode_adapter:MLADecodeAdapter",
}


class UnknownKernelError(ValueError):
    pass


def get_adapter(name: str) -> KernelAdapter:
    """The adapter of kernel ``name``; an unknown name lists the valid ones."""
    if name not in REGISTRY:
        raise UnknownKernelError(f"unknown kernel {name!r}; valid kernels: {', '.join(sorted(REGISTRY))}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)()
