"""The adapter class a quick declaration becomes (:func:`kinv.kernels.quick.kernel` and
:func:`~kinv.kernels.quick.from_autotune` subclass it with their declaration): every member reads the declaration,
and each launch keeps the compiled kernel it returns (and runs an autotuner with the config kinv chose).

Standard library only at import time (the GPU worker imports adapters without pydantic); torch where used,
pydantic only in :meth:`QuickAdapter.workload_model`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path

from kinv.kernels.adapter import KernelAdapter, Level, Resources
from kinv.kernels.devices import DeviceSpec, occupancy
from kinv.kernels.errors import BadInput
from kinv.kernels.tunables import MAX_DIM, Params, brief_repr

CPU_CAP = 64  # the largest integer level dimension the CPU stand-in runs (the Triton interpreter is slow)
DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float32": "float32", "fp32": "float32", "float": "float32"}  # fmt: skip
TOLERANCE = {"float32": (1e-2, 1e-2), "float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2)}
UNITS = {"calls/s": (None, 1.0), "GB/s": ("bytes", 1e9), "TB/s": ("bytes", 1e12), "GFLOP/s": ("flops", 1e9),
         "TFLOP/s": ("flops", 1e12)}  # fmt: skip


class Declaration:
    """What a quick adapter was declared with (kept off the class's namespace: plain functions there would bind)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.bytes_cache: dict[tuple, int] = {}
        self.watching = False


# --------------------------------------------------------------------------- #
# the compiled kernel of a launch, and an autotuner's chosen config
# --------------------------------------------------------------------------- #
_LOCAL = threading.local()  # .compiled: the last compiled kernel a watched kernel returned; .chosen: {id: Config}
_WATCH_LOCK = threading.Lock()


def _watch(obj) -> None:
    """Route ``obj.run`` (what ``obj[grid](...)`` calls) through a wrapper, once: it keeps the compiled kernel the
    launch returns, and runs an autotuner with the config kinv chose (no search of its own) while one is chosen."""
    with _WATCH_LOCK:
        if getattr(obj, "_kinv_quick_run", None) is not None:
            return
        original = obj.run

        def run(*args, **kwargs):
            chosen = (getattr(_LOCAL, "chosen", None) or {}).get(id(obj))
            ret = original(*args, **kwargs) if chosen is None else _run_config(obj, chosen, args, kwargs)
            if getattr(ret, "metadata", None) is not None:
                _LOCAL.compiled = ret
            return ret

        try:
            obj.run = run
            obj._kinv_quick_run = original
        except (AttributeError, TypeError):  # an object that takes no attributes: its launches report no compiled kernel
            if hasattr(obj, "configs"):  # an autotuner that cannot be routed would search on its own: refuse
                raise BadInput(f"cannot route {brief_repr(obj)}'s launches to the chosen config") from None


def _run_config(autotuner, config, args, kwargs):
    """The autotuner's kernel run with ``config`` (its kwargs, warps, stages, ...), as the autotuner runs its pick."""
    given = config.all_kwargs()
    clash = sorted(set(given) & set(kwargs))
    if clash:
        raise BadInput(f"launch passes {', '.join(clash)}, which the autotune config sets: leave them to the config")
    if getattr(config, "pre_hook", None):
        config.pre_hook({**dict(zip(autotuner.arg_names, args)), **kwargs, **given})
    return autotuner.fn.run(*args, **kwargs, **given)


def _on_cpu(inputs, out) -> bool:
    """Whether a launch's tensors live on the CPU (where the Triton interpreter runs, and ``cpu_launch`` replaces
    ``launch``)."""
    ts = _tensors(inputs) + _tensors(out)
    return bool(ts) and all(getattr(getattr(t, "device", None), "type", "cpu") == "cpu" for t in ts)


def _tensors(x) -> list:
    if isinstance(x, list | tuple):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, Mapping):
        return [t for item in x.values() for t in _tensors(item)]
    return [x] if hasattr(x, "element_size") and hasattr(x, "numel") else []


# --------------------------------------------------------------------------- #
# the adapter
# --------------------------------------------------------------------------- #
class QuickAdapter(KernelAdapter):
    """A KernelAdapter built by :func:`kernel` or :func:`from_autotune`; every member reads the declaration ``_q``."""

    _q: Declaration
    resource_model = False  # no analytical model: resources come from the compiled kernel, where there is one

    # ---- config ----------------------------------------------------------------------
    def default_text(self) -> str:
        """The config file a run writes when it is missing: the declared default."""
        return json.dumps({"kernel": self.name, **self._q.default}, indent=2) + "\n"

    def ensure_config(self) -> Path:
        """The live config file, the declared default written there first when it is missing (a run's first step;
        ``kinv kernels`` and ``kinv check`` never write it)."""
        path = self.config_path()
        if not path.exists():  # the declared default, written once where kinv keeps the live config
            import os

            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(self.default_text())
                os.link(tmp, path)  # whole or not at all, and never over a file another process wrote first
            except OSError:  # written by another process first, or a read-only install: kinv then says it is missing
                pass
            finally:
                tmp.unlink(missing_ok=True)
        return path

    # ---- workload --------------------------------------------------------------------
    def workload_model(self):
        from pydantic import BaseModel, ConfigDict, Field, field_validator

        adapter = self
        declared = ", ".join(self.level_label(d) for d in self._q.levels)

        class QuickWorkload(BaseModel):
            model_config = ConfigDict(extra="forbid", strict=True)

            levels: list[str | dict[str, int | str]] | None = Field(
                None, description=f"levels of {adapter.name}: declared ones by key or label ({declared}), or dicts "
                f"of {', '.join(adapter.level_dims)}; default: every declared level")

            @field_validator("levels")
            @classmethod
            def _pick(cls, v):
                if v is None:
                    return v
                if not v or len(v) > 64:
                    raise ValueError("give 1 to 64 levels")
                out = [adapter._dims_of(item) for item in v]
                keys = [adapter.level_key(d) for d in out]
                if len(set(keys)) != len(keys):
                    raise ValueError("levels must be distinct")
                return out

        return QuickWorkload

    def _dims_of(self, item) -> dict:
        q = self._q
        if isinstance(item, str):
            for d in q.levels:
                if item in (self.level_key(d), self.level_label(d)):
                    return dict(d)
            raise ValueError(f"{item!r} is not a declared level of {self.name}; its levels: "
                             f"{', '.join(self.level_label(d) for d in q.levels)} (or give a dict of "
                             f"{', '.join(self.level_dims)})")  # fmt: skip
        if set(item) != set(self.level_dims):
            raise ValueError(f"a {self.name} level has the dimensions {', '.join(self.level_dims)}; got "
                             f"{brief_repr(item)}")  # fmt: skip
        for d in self.level_dims:
            v, want = item[d], type(q.levels[0][d])
            if type(v) is not want or (want is int and not 0 <= v <= MAX_DIM):
                raise ValueError(f"{d}={brief_repr(v)} must be {'an integer from 0 to ' + str(MAX_DIM) if want is int else 'a string'}")
        return {d: item[d] for d in self.level_dims}

    def levels(self, workload) -> list[Level]:
        chosen = getattr(workload, "levels", None) or self._q.levels
        return [self.level(d) for d in chosen]

    def level_label(self, dims) -> str:
        common = self._q.common
        parts = [f"{d}{dims[d]}" for d in self.level_dims if d not in common or dims[d] != common[d]]
        return "/".join(parts) or self.level_key(dims)

    def workload_notes(self, workload, baseline: dict) -> list[str]:
        notes = []
        if self._q.bytes_moved is None:
            notes.append("bytes per call derived by kinv from the input tensors plus the output (no bytes_moved "
                         "declared; GB/s and the roofline's memory bound use them)")
        if self._q.flops is None:
            notes.append("no flops declared: the roofline is the memory bound alone")
        return notes

    def stand_in(self, level: Level, device: str) -> Level:
        how = self._q.stand_in
        if callable(how):
            return self.level(how(dict(level.dims), device))
        if not str(device).startswith("cpu"):
            return level
        caps = how if isinstance(how, Mapping) else {}
        dims = {d: (min(v, caps.get(d, CPU_CAP)) if isinstance(v, int) else v) for d, v in level.dims.items()}
        return self.level(dims)

    def throughput(self, level: Level, us: float) -> float:
        q = self._q
        if q.throughput is not None:
            return float(q.throughput(level, us))
        what, scale = UNITS[self.throughput_unit]
        amount = 1.0 if what is None else (self.bytes_moved(level) if what == "bytes" else self.flops(level))
        return amount / (us * 1e-6) / scale

    # ---- the kernel ------------------------------------------------------------------
    def _dtype(self, device: str, given=None):
        import torch

        cpu = str(device).startswith("cpu")
        name = self._q.dtype
        if name is None:
            return given if given is not None else (torch.float16 if cpu else torch.bfloat16)
        if cpu and name == "bfloat16":
            name = "float16"  # the interpreter's bf16 dot is wrong
        return getattr(torch, name)

    def check_dtype(self, device: str):
        return self._dtype(device, super().check_dtype(device))

    def make_inputs(self, level: Level, seed: int, device: str = "cuda", dtype=None, vary_lengths: bool = False) -> dict:
        q = self._q
        dtype = self._dtype(device, dtype)
        if q.inputs_vary:
            return q.make_inputs(level, seed, device, dtype, vary_lengths=vary_lengths)
        return q.make_inputs(level, seed, device, dtype)

    def launch(self, inputs: dict, params: Params, out=None, scratch=None, **mode):
        q = self._q
        if not q.watching:
            for obj in q.triton:
                _watch(obj)
            q.watching = True
        _LOCAL.compiled = None
        previous = getattr(_LOCAL, "chosen", None)
        if q.autotune is not None:
            names, combos, autotuner = q.autotune
            _LOCAL.chosen = {**(previous or {}), id(autotuner): combos[tuple(params[n] for n in names)]}
        fn = q.cpu_launch if q.cpu_launch is not None and _on_cpu(inputs, out) else q.launch
        try:
            result = fn(inputs, params, out)
        finally:
            _LOCAL.chosen = previous
            compiled, _LOCAL.compiled = getattr(_LOCAL, "compiled", None), None
        if result is None:
            if out is None:
                raise BadInput(f"{self.name}: launch returned nothing; return the output (written into out when "
                                 "given)")  # fmt: skip
            result = out
        elif out is not None:
            mine, given = _tensors(result), _tensors(out)
            if len(mine) != len(given) or any(a.data_ptr() != b.data_ptr() for a, b in zip(mine, given)):
                raise BadInput(f"{self.name}: launch returned an output other than the out it was given; write into "
                                 "out (kinv fills it with NaN before a checked launch and times launches into it)")  # fmt: skip
        return result, compiled

    def reference(self, inputs: dict):
        return self._q.reference(inputs)

    def tolerance(self, dtype) -> tuple[float, float]:
        tol = self._q.tolerance
        name = DTYPES.get(str(dtype).removeprefix("torch."), "bfloat16")
        if tol is None:
            return TOLERANCE[name]
        if callable(tol):
            return tuple(tol(dtype))
        if isinstance(tol, Mapping):
            return tuple(tol.get(name) or TOLERANCE[name])
        return tuple(tol)

    # ---- costs -----------------------------------------------------------------------
    def bytes_moved(self, level: Level) -> int:
        q = self._q
        if q.bytes_moved is not None:
            return int(q.bytes_moved(level))
        key = (level.key, q.dtype)
        if key not in q.bytes_cache:
            q.bytes_cache[key] = self._derived_bytes(level)
        return q.bytes_cache[key]

    def _derived_bytes(self, level: Level) -> int:
        """The input tensors' bytes plus each output's, from its own size and dtype: the declared ``output_dtypes``
        (one per output), else a reference output's own dtype where it is not float32 (a reference that returns an
        output in the dtype the kernel writes), else the timed dtype.  Inputs are made on the ``meta`` device (no
        memory, no compute), else on CPU."""
        import torch

        dtype = self._dtype("cuda")
        for device in ("meta", "cpu"):
            try:
                inputs = self._q.make_inputs(level, 0, device, dtype)
                ref = self._q.reference(inputs)
                break
            except Exception:  # noqa: BLE001 - a make_inputs or reference that cannot run on meta: on CPU then
                if device == "cpu":
                    raise
        outs = _tensors(ref)
        declared = self._q.output_dtypes
        if declared is not None and len(declared) != len(outs):
            raise BadInput(f"{self.name}: output_dtypes names {len(declared)} dtype(s); the reference returns "
                           f"{len(outs)} output(s)")  # fmt: skip
        out_bytes = 0
        for i, t in enumerate(outs):
            if declared is not None:
                kind = getattr(torch, declared[i])
            elif t.dtype != torch.float32:
                kind = t.dtype
            else:
                kind = dtype
            out_bytes += t.numel() * torch.empty((), dtype=kind, device="meta").element_size()
        return int(sum(t.numel() * t.element_size() for t in _tensors(inputs)) + out_bytes)

    def flops(self, level: Level) -> int:
        return int(self._q.flops(level)) if self._q.flops is not None else 0

    def resources(self, params: Params, level: Level, device: DeviceSpec, compiled=None) -> Resources:
        """The compiler's figures where a launch compiled the kernel (a GPU); without one, nothing is modelled."""
        res = Resources(smem_estimate=0)
        meta = getattr(compiled, "metadata", None)
        if meta is None or device is None:
            return res
        res.smem_compiled = int(getattr(meta, "shared", 0) or 0)
        res.registers = int(getattr(compiled, "n_regs", 0) or 0) or None
        res.spills = int(getattr(compiled, "n_spills", 0) or 0)
        warps = params.get("num_warps") or getattr(meta, "num_warps", None) or 4
        res.occupancy = occupancy(device, num_warps=int(warps), regs_per_thread=res.registers,
                                  smem_bytes=res.smem_compiled)  # fmt: skip
        if res.smem_compiled > device.smem_per_block:
            res.feasible = False
            res.reason = (f"needs {res.smem_compiled / 1024:.1f} KB shared memory per block; {device.arch} allows "
                          f"{device.smem_per_block / 1024:.1f} KB")  # fmt: skip
        return res


__all__ = ["Declaration", "QuickAdapter"]
