"""The plugin interface: everything kinv needs to know to investigate a kernel.

A kernel is investigable once it has one :class:`KernelAdapter` subclass, found in one of three ways, the
same in every kinv process (the CLI, the benchmark workers, the correctness child):

* ``kernel: package.module:Class`` in a plan (or a config's ``"kernel"``): imported directly;
* a ``kinv.kernels`` entry point of an installed distribution (``name = "package.module:Class"``);
* kinv's own kernels (also declared as entry points; listed here so a checkout runs uninstalled).

Standard library only at import time; adapters import torch where used, and pydantic only in
:meth:`KernelAdapter.workload_model` (the GPU worker has neither pydantic nor kinv's other dependencies).
"""

from __future__ import annotations

import importlib
import inspect
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kinv.kernels.devices import DeviceSpec, roofline
from kinv.kernels.errors import BadInput, UnknownKernelError
from kinv.kernels.moved import moved
from kinv.kernels.tunables import Params, TunableSpec, brief_repr, one_line

KERNELS_DIR = Path(__file__).resolve().parent
ENTRY_POINT_GROUP = "kinv.kernels"
BUILTIN: dict[str, str] = {
    "mla_decode": "kinv.kernels.mla_decode_adapter:MLADecodeAdapter",
    "moe_expert_gemm": "kinv.kernels.moe_expert_gemm_adapter:MoEExpertGemmAdapter",
    "command": "kinv.kernels.command_adapter:CommandAdapter",  # any command that prints a metric (--backend command)
}
REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def project_root() -> Path:
    """The directory holding the ``kernels`` package actually imported (a snapshot or a test copy
    when one is first on the path).  kinv's own kernel files and source patches are relative to it."""
    return KERNELS_DIR.parent


class Level:
    """One workload level: its named dimensions, the key that names it everywhere (samples, verdicts,
    recordings) and a short label for tables.  Dimensions read as attributes (``level.batch``)."""

    __slots__ = ("dims", "key", "label")

    def __init__(self, dims: Mapping, key: str, label: str | None = None):
        object.__setattr__(self, "dims", dict(dims))
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "label", label or key)

    def __getattr__(self, name: str):
        try:
            return self.dims[name]
        except KeyError:
            raise AttributeError(f"level {self.key} has no dimension {name!r}; its dimensions: "
                                 f"{', '.join(self.dims)}") from None  # fmt: skip

    def __setattr__(self, name, value):
        raise AttributeError("a Level is read-only")

    def __eq__(self, other) -> bool:
        return isinstance(other, Level) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Level({self.key})"

    def to_dict(self) -> dict:
        return dict(self.dims)


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


@dataclass(frozen=True)
class Premise:
    """A quantity a variant's ``targets`` may name, read from what kinv measured of one arm at one level: ``read``
    gets ``{"compiled": the compiler's figures or None, "params": the launch parameters there, "why": the
    adapter's launch figures, "profile": the profiler's figures or None, "items": items per launch}`` and returns
    ``(value, detail)`` -- a number, or a text for a shape -- or None where the figures do not show it (then the
    premise is *not measured* there: kinv never guesses it).  ``direction`` is the way the variant predicts it
    moves: ``"up"``, ``"down"`` or ``"changed"`` (any change tests it)."""

    quantity: str  # in words: "warps per SM"
    direction: str
    read: Callable[[dict], tuple[object, str] | None]
    #: how far a number must move to count as moved (the same units as the value)
    tolerance: float = 0.0


def check_level_values(values: list[int], what: str, high: int) -> list[int]:
    """A workload's swept values: 1 to 16 distinct integers from 1 to ``high``, returned sorted (for an
    adapter's workload model; the error names ``what``)."""
    if not values or len(values) > 16:
        raise ValueError(f"give 1 to 16 {what}")
    if any(v < 1 or v > high for v in values):
        raise ValueError(f"each of the {what} must be from 1 to {high}")
    if len(set(values)) != len(values):
        raise ValueError(f"{what} must be distinct")
    return sorted(values)


class KernelAdapter(ABC):
    """Everything kinv needs from a kernel; one subclass per kernel.  Nothing outside an adapter names a
    tunable or a level dimension: callers use the members below and nothing else.

    Required: ``name``, ``spec`` (the tunables), ``level_dims``, :meth:`workload_model`, :meth:`levels`,
    :meth:`make_inputs`, :meth:`launch`, :meth:`reference`, :meth:`bytes_moved`, :meth:`flops`,
    :meth:`resources`.  The rest have defaults.
    """

    #: the kernel's name: configs say ``"kernel": name``; tables and keys use it
    name: str = ""
    #: tunables, their restrictions, label and override dimensions
    spec: TunableSpec
    #: the level's dimensions, in the order of its key
    level_dims: tuple[str, ...] = ()
    #: what a person reads throughput in, e.g. "tok/s" or "TFLOP/s"
    throughput_unit: str = "calls/s"
    #: kernel source files, relative to :meth:`root`, that a source patch may change
    kernel_files: tuple[str, ...] = ()
    #: (file relative to :meth:`root`, qualified name) of the reference and metric definitions (hashed)
    reference_parts: tuple[tuple[str, str], ...] = ()
    #: a plan of this kernel, relative to :meth:`root`, that ``kinv bench``, ``kinv noise`` and ``kinv env`` use
    #: without ``--plan`` (the first registered kernel's that names one); empty: none
    example_plan: str = ""
    #: a regular expression of the kernel names the profile step profiles (e.g. the main grid of a two-stage
    #: kernel); empty: every launch of :meth:`launch`
    profile_kernels: str = ""
    #: whether the adapter models launch resources (shared memory, registers, CTAs/SM) worth showing; False for a
    #: workload measured as a whole (a plan's own command)
    resource_model: bool = True
    #: whether the time kinv compares is worth showing beside the throughput (False where it is only the reciprocal
    #: of a command's own metric)
    shows_time: bool = True
    #: premises of the kernel's own a variant's ``targets`` may name, beside kinv's (occupancy, pipelining,
    #: tile_shape, parallelism, bytes_moved): name -> :class:`Premise`
    premises: Mapping[str, Premise] = {}

    # ---- where things live -----------------------------------------------------------
    def root(self) -> Path:
        """The directory that holds the adapter's package: kernel files and source patches are relative to
        it (``kernels/mla_decode.py`` for kinv's own kernels, ``mypkg/kernel.py`` for a plugin ``mypkg``)."""
        return self.package_dir().parent

    def package_dir(self) -> Path:
        """The adapter's own package directory: a baseline snapshot copies it, and the baseline arm imports
        the copy under the same dotted name (``<snapshot>/kinv/kernels``, ``<snapshot>/mypkg``)."""
        return Path(inspect.getfile(type(self))).resolve().parent

    def package_name(self) -> str:
        """The dotted name of the adapter's package (``kinv.kernels``, ``mypkg``)."""
        return type(self).__module__.rpartition(".")[0] or type(self).__module__

    def config_path(self) -> Path:
        """The live config file: ``configs/<name>.json`` beside the adapter's module; KINV_CONFIG_DIR
        moves it (tests point it at a copy)."""
        import os

        if os.environ.get("KINV_CONFIG_DIR"):
            return Path(os.environ["KINV_CONFIG_DIR"]) / f"{self.name}.json"
        return Path(inspect.getfile(type(self))).resolve().parent / "configs" / f"{self.name}.json"

    def ensure_config(self) -> Path:
        """The live config file as a run needs it (one that measures, patches or reverts it): :meth:`config_path`,
        where an adapter with a declared default (kinv.kernels.quick, the command adapter) first writes that default
        when the file is missing.  Listing, validating and checking call :meth:`config_path`, which writes nothing."""
        return self.config_path()

    def peer(self, level: Level, gpu_name: str | None) -> dict | None:
        """The kernel a user would pick instead, at this level on this GPU, if the adapter ships its figures:
        ``peers/<name>.json`` beside the adapter's module, ``{"peer", "cards": {card: {level key: µs}}}`` (a card
        such as "H200" matches a GPU whose name contains it; the older ``{"peer", "gpu", "us"}`` holds one card).
        Returns ``{"peer", "us"}`` or None (no file, no figures for this GPU, a level without a figure)."""
        import json

        path = Path(inspect.getfile(type(self))).resolve().parent / "peers" / f"{self.name}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        cards = data.get("cards") or {data.get("gpu", ""): data.get("us", {})}
        figures = next((us for card, us in cards.items() if card and gpu_name and card.lower() in gpu_name.lower()), {})
        us = figures.get(level.key)
        if not us:
            return None
        return {"peer": data.get("peer", "peer"), "us": float(us)}

    # ---- configuration -----------------------------------------------------------------
    def bounds(self) -> dict[str, list[int]]:
        """Valid values of each tunable."""
        return {t.name: list(t.values) for t in self.spec.tunables}

    def validate_config(self, data) -> dict:
        return self.spec.validate(data, self.name)

    def params_for(self, config: dict, level: Level) -> Params:
        return self.spec.resolve(config, level.dims)

    # ---- workload ---------------------------------------------------------------------
    def level(self, dims: Mapping) -> Level:
        """A Level from its dimensions (as a plan's workload or a worker request gives them)."""
        if not isinstance(dims, Mapping) or set(dims) != set(self.level_dims):
            raise ValueError(f"a {self.name} level has dimensions {', '.join(self.level_dims)}; got "
                             f"{brief_repr(dims)}")  # fmt: skip
        return Level(dims, self.level_key(dims), self.level_label(dims))

    def level_key(self, dims: Mapping) -> str:
        """The level's key: its named dimensions, e.g. ``tokens16/experts32/topk8/...``."""
        return "/".join(f"{d}{dims[d]}" for d in self.level_dims)

    def level_label(self, dims: Mapping) -> str:
        """A short label for tables (the dimension the workload sweeps); defaults to the key."""
        return self.level_key(dims)

    @abstractmethod
    def workload_model(self):
        """The pydantic model of the plan's ``workload`` section (imported lazily: pydantic is not on GPU machines)."""

    @abstractmethod
    def levels(self, workload) -> list[Level]:
        """The levels a validated workload lists, in the order tables show them."""

    def workload_notes(self, workload, baseline: dict) -> list[str]:
        """Derivations a person should see (MLA: heads / TP -> local heads -> BLOCK_H); a warning starts
        with "warning:".  Raise ValueError for a workload that cannot work with this baseline."""
        return []

    def stand_in(self, level: Level, device: str) -> Level:
        """The level the correctness gate actually runs (smaller on CPU, where the interpreter is slow)."""
        return level

    def throughput(self, level: Level, us: float) -> float:
        """Throughput a person reads at this level, in :attr:`throughput_unit`, for one call of ``us``."""
        return 1e6 / us

    def roofline(self, level: Level, copy_gbps: float | None, matrix_tflops: float | None) -> tuple[float, str] | None:
        """The fewest seconds one call can take at this level and what bounds it: ``(seconds, "memory")`` at the
        device's copy bandwidth, ``(seconds, "compute")`` at its matrix peak, whichever is slower (None with
        neither figure).  A campaign's goal and the close-out's roofline read it; override it for a kernel
        bound by something else (:func:`kinv.kernels.devices.roofline` is the rule)."""
        return roofline(self.bytes_moved(level), self.flops(level), copy_gbps, matrix_tflops)

    # ---- the kernel ------------------------------------------------------------------
    @abstractmethod
    def make_inputs(self, level: Level, seed: int, device: str = "cuda", dtype=None, vary_lengths: bool = False) -> dict:
        """Fresh random inputs for a level, reproducible from ``seed``.  ``vary_lengths``: draw irregular
        shapes where the kernel has them (the correctness gate asks for them)."""

    @abstractmethod
    def launch(self, inputs: dict, params: Params, out=None, scratch=None, **mode):
        """Run the kernel; return ``(output, compiled_kernel_or_None)``.  ``out`` is a preallocated output
        (:meth:`make_output`'s, or sized by one launch; the gate poisons it with NaN before each of
        :meth:`check_modes` launches into it, so one buffer serves every mode), ``scratch`` what :meth:`make_scratch`
        allocated, ``mode`` one of :meth:`check_modes`."""

    def make_output(self, inputs: dict, params: Params):
        """An empty output of one launch (what ``launch(..., out=...)`` takes), or ``None``: the correctness gate
        then sizes it with a launch of its own.  The gate poisons it before every launch into it."""
        return None

    def make_scratch(self, inputs: dict, params: Params) -> dict | None:
        """Scratch buffers one launch needs (passed back as ``launch(..., scratch=...)``), or ``None`` when the
        kernel allocates none.  The timing harness allocates them itself, fresh every round, so that no
        fixed placement of them biases an arm (docs/gpu.md, "memory placement")."""
        return None

    #: the inputs that change from one step to the next in real use (a decode step's queries, a matmul's
    #: activations): the timing harness writes new values into them on the device before every timed launch, so
    #: no timed launch reads what an earlier one read.  Empty: the smallest floating-point input (:meth:`fresh_names`).
    fresh_inputs: tuple[str, ...] = ()

    def fresh_names(self, inputs: dict) -> list[str]:
        """The inputs the harness refreshes before each timed launch: :attr:`fresh_inputs`, else the smallest
        floating-point tensor among ``inputs`` (the one whose change a cache of outputs cannot ignore, at the least
        cost); none where no input is a floating-point tensor."""
        if self.fresh_inputs:
            missing = [n for n in self.fresh_inputs if n not in inputs]
            if missing:
                raise ValueError(f"fresh_inputs names {', '.join(map(repr, missing))}, not among the inputs "
                                 f"({', '.join(sorted(inputs))})")  # fmt: skip
            return list(self.fresh_inputs)
        floats = [(t.numel(), k) for k, t in inputs.items()
                  if hasattr(t, "is_floating_point") and t.is_floating_point() and t.numel() > 0]  # fmt: skip
        return [min(floats)[1]] if floats else []

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
    def resources(self, params: Params, level: Level, device: DeviceSpec, compiled=None) -> Resources:
        """Shared memory, registers, occupancy and feasibility of a config."""

    def invalid_env(self, env: Mapping[str, str | None]) -> list[str]:
        """What no run of this kernel could use in ``env`` (a plan's environment, a shell's or a process's values,
        ``None`` for unset), one phrase each, naming the variable, its value and what is valid
        (``"N='abc', which must be an integer from 1 to 64"``).  A plan with such a value is refused, and so is
        ``kinv env`` in a shell that has one.  Default: every value is usable."""
        return []

    def derived_env(self, level: Level, params: Params, environ: dict) -> dict:
        """Values derived from the environment at a level (e.g. split count)."""
        return {}

    def check_modes(self) -> list[dict]:
        """Extra launch keyword sets the correctness gate must also pass (e.g. one split, so every
        loop iteration of a program runs); ``{}`` is the plain launch."""
        return [{}]

    def check_dtype(self, device: str):
        """The dtype the correctness gate checks in on ``device`` (it passes it to :meth:`make_inputs` and names it in
        its result): bf16 on a GPU, fp16 on CPU (the Triton interpreter's bf16 dot is wrong).  Override for a kernel
        that runs in one dtype, so that the gate checks what is timed."""
        import torch

        return torch.float16 if device == "cpu" else torch.bfloat16

    def tolerance(self, dtype) -> tuple[float, float]:
        """(atol, rtol) for comparing with the reference."""
        return (2e-2, 2e-2)

    def tolerance_at(self, dtype, level: Level, reference) -> tuple[float, float, float | None]:
        """(atol, rtol, norm) for one output at one level, given its float32 ``reference``: the element-wise
        tolerance, and a bound on the relative error norm ``||out - ref|| / ||ref||`` (``None``: no bound).
        Override where an output's scale changes with the level (attention outputs shrink as the context grows,
        until a fixed atol checks nothing).  Default: :meth:`tolerance`, no norm bound."""
        return (*self.tolerance(dtype), None)


#: the spec a caller gave (a registered name, or package.module:Class) -> its adapter
_LOADED: dict[str, KernelAdapter] = {}
#: kernel name -> the adapter loaded under it by package.module:Class (a plugin that is not registered): a
#: config's ``"kernel": name`` finds it again in this process
_BY_NAME: dict[str, KernelAdapter] = {}
#: folders that ``package.module:Class`` specs were imported from, which a child process must see too
_IMPORT_ROOTS: list[str] = []


def registered() -> dict[str, str]:
    """Every kernel kinv can find by name: its own, then the ``kinv.kernels`` entry points (name -> ref)."""
    from importlib.metadata import entry_points

    out = dict(BUILTIN)
    try:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            out.setdefault(ep.name, ep.value)
    except Exception:  # a broken distribution's metadata must not hide the others
        pass
    return out


def default_plan() -> tuple[Path, str]:
    """The plan ``kinv bench``, ``kinv noise`` and ``kinv env`` use without ``--plan``: the example plan of the
    first registered kernel (kinv's own, then the entry points) whose adapter names one that exists, relative to
    the working directory when it lies under it; and a phrase saying whose it is, naming the other registered
    kernels when there are several.  BadInput when no kernel names one."""
    import os

    names = list(registered())
    for name in names:
        try:
            adapter = get_adapter(name)
        except UnknownKernelError:  # a broken plugin is not the default; its own commands say what is wrong
            continue
        path = adapter.root() / adapter.example_plan if adapter.example_plan else None
        if path and path.is_file():
            break
    else:
        raise BadInput("no --plan given and no registered kernel names an example plan; give --plan PLAN.yaml")
    try:
        shown = Path(os.path.relpath(path)) if path.resolve().is_relative_to(Path.cwd().resolve()) else path
    except (OSError, ValueError):
        shown = path
    others = [n for n in names if n != name]
    said = f"no --plan: {shown}, the example plan of {name}"
    if others:
        said += f"; also registered: {', '.join(others)} (--plan picks another kernel's plan)"
    return shown, said


def import_path() -> list[str]:
    """The folders this process imported ``package.module:Class`` adapters from (the working directory, say),
    for a child's PYTHONPATH after its own entries: the correctness child and the benchmark workers start with
    ``python -P`` elsewhere, and must import the class the CLI imported."""
    return list(_IMPORT_ROOTS)


def get_adapter(name: str) -> KernelAdapter:
    """The adapter of kernel ``name`` (a registered name or ``package.module:Class``); an unknown name
    lists the valid ones.  Adapters are cached by that spec: two classes that share a kernel name stay two."""
    if not isinstance(name, str):
        raise UnknownKernelError(f"kernel must be a name or package.module:Class, got {brief_repr(name)}")
    if name in _LOADED:
        return _LOADED[name]
    if REF.fullmatch(name):
        ref = name
    else:
        known = registered()
        if name not in known:
            if name in _BY_NAME:
                return _BY_NAME[name]
            raise UnknownKernelError(f"unknown kernel {brief_repr(name)}; valid kernels: {', '.join(sorted(known))} "
                                     "(or package.module:Class of an adapter)")  # fmt: skip
        ref = known[name]
    adapter = _LOADED.get(ref) or _load(name, ref, by_ref=ref == name)
    _LOADED[ref] = _LOADED[name] = adapter
    if ref == name:
        _BY_NAME.setdefault(adapter.name, adapter)
    return adapter


def _load(name: str, ref: str, by_ref: bool) -> KernelAdapter:
    module, cls = ref.split(":")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a plugin's import may raise anything (SyntaxError, RuntimeError, ...)
        raise UnknownKernelError(f"kernel {brief_repr(name)}: cannot import {module}: {_said(exc)}") from None
    try:
        obj = getattr(mod, cls)
    except AttributeError:
        raise UnknownKernelError(f"kernel {brief_repr(name)}: {module} has no {cls}") from None
    if not (isinstance(obj, type) and issubclass(obj, KernelAdapter)):
        raise UnknownKernelError(f"kernel {brief_repr(name)}: {ref} is not a KernelAdapter subclass")
    try:
        adapter = obj()
    except Exception as exc:  # noqa: BLE001 - abstract (incomplete) adapter, or its __init__ failed
        raise UnknownKernelError(f"kernel {brief_repr(name)}: {ref} cannot be instantiated: {_said(exc)}") from None
    if not NAME.fullmatch(adapter.name or ""):
        raise UnknownKernelError(f"kernel {ref}: its adapter's name {brief_repr(adapter.name)} is not a valid name")
    if by_ref:
        root = _import_root(mod)
        if root and root not in _IMPORT_ROOTS:
            _IMPORT_ROOTS.append(root)
    return adapter


def _import_root(mod) -> str | None:
    """The folder on whose path ``mod`` was found (``/x`` for ``pkg.adapter`` at ``/x/pkg/adapter.py``); None for
    kinv's own modules and for modules without a file."""
    parts = mod.__name__.split(".")
    if parts[0] == "kinv" or not getattr(mod, "__file__", None):
        return None
    path = Path(mod.__file__).resolve()
    if path.name == "__init__.py":
        path = path.parent
    return str(path.parents[len(parts) - 1])


def _said(exc: BaseException) -> str:
    """An exception as one short line: its first line, or its type when it says nothing."""
    lines = str(exc).strip().splitlines()
    return one_line(lines[0], 200) if lines else type(exc).__name__


__all__ = ["KernelAdapter", "Level", "Resources", "get_adapter", "import_path", "project_root", "default_plan",
           "registered"]  # fmt: skip


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: ConfigError
    return moved(__name__, name)
