"""A whole kernel adapter from a few declarations: the short path for the common case.

A Triton kernel becomes investigable with one call in the plugin's adapter module::

    from kinv.kernels import quick

    MyMatmul = quick.kernel(
        "my_matmul",
        tunables={"TILE_M": [32, 64, 128], "TILE_N": [32, 64, 128], "num_warps": [4, 8]},
        restrictions=["TILE_M * TILE_N <= 2048 * num_warps"],
        default={"TILE_M": 64, "TILE_N": 64, "num_warps": 4},
        levels=[{"M": 512, "N": 512, "K": 512}, {"M": 2048, "N": 2048, "K": 2048}],
        make_inputs=make_inputs,      # (level, seed, device, dtype) -> dict of inputs (tensors, and any other value)
        launch=launch,                # (inputs, params, out=None) -> the output(s), written into ``out`` when given
        reference=reference,          # (inputs) -> the float32 reference output(s)
        flops=lambda level: 2 * level.M * level.N * level.K,
    )

and an entry point (``my_matmul = "mypkg.adapter:MyMatmul"`` in the ``kinv.kernels`` group) or a plan's
``kernel: mypkg.adapter:MyMatmul``.  :func:`from_autotune` builds the same from a ``@triton.autotune`` kernel: its
configs become the space, its key the level dimensions.

Inputs and outputs as kernels have them: ``make_inputs`` may return non-tensor values beside the tensors (a scalar
``eps``, a ``torch.dtype``): the gate passes them to ``launch`` and ``reference`` untouched.  A kernel with several
outputs returns a tuple from ``launch`` and the same tuple, in the same order, from ``reference``; each output is
checked against its reference under the tolerance, and ``out`` is then that tuple of buffers.

On CPU the gate runs in the Triton interpreter, which cannot run every kernel a GPU runs.  The known gaps: a Python
scalar the kernel computes with as a tensor (``x * eps`` where ``eps`` is a Python float passed without ``.to()``), a
``libdevice`` function (``libdevice.rsqrt`` returns None in the interpreter), a ``tl.dot`` in bf16 (wrong results).
A launch that fails there says so and names them.  For such a kernel give ``cpu_launch=(inputs, params, out=None)``:
kinv calls it instead of ``launch`` whenever the tensors are on the CPU (the GPU path never sees it); it may launch
the same kernel with a workaround (the scalar as a 0-d tensor), or a variant of it without the missing function.

What kinv derives, and how:

* the tunables' labels (``TILE_M`` -> ``TM``, ``num_warps`` -> ``w``), and a restriction text is parsed with
  :mod:`ast` and evaluated by a walker of its own (never ``eval``; :mod:`kinv.kernels.restriction_grammar`): tunable
  names, numbers, ``+ - * / // %``,
  comparisons and ``and``/``or``/``not`` only; anything else is refused with one message;
* the level dimensions from the level dicts (their keys, in order), the key ``M512/N512/K512`` and the label (the
  dimensions that vary between the declared levels); a plan's ``workload: {levels: [...]}`` picks declared levels
  by key or label, or gives new ones as dicts (``workload: {}``: every declared level);
* the bytes one call moves, when ``bytes_moved`` is not given: the sizes of the input tensors plus each output's, from
  its size and its own dtype (``output_dtypes=[...]``, one per output; else a reference output's own dtype where it
  is not float32; else the timed dtype), from ``make_inputs`` on the ``meta`` device (on CPU if that fails), once
  per level per process; a plan's workload notes say so, and the GB/s and the roofline's memory bound use it;
* ``kernel_files`` (what a source patch may change, and what the kernel hash covers): the source files of the
  Triton kernels ``launch`` names and of ``launch`` itself, inside the plugin's package; ``reference_parts``: the
  named ``reference``, ``bytes_moved`` and ``flops`` functions (and ``make_inputs`` when the bytes are derived);
* the compiled kernel of each launch, captured from the Triton kernels ``launch`` names (``kernels=`` names
  others), so that on a GPU the registers, spills, shared memory and CTAs per SM come from the compiler as for
  kinv's own kernels; there is no analytical model (``resource_model`` is False);
* on CPU the correctness gate runs a stand-in level with every integer dimension capped at 64 (``stand_in=``
  changes it), in the Triton interpreter; the dtype is the declared one (``dtype="float16"``; bfloat16 runs as
  float16 on CPU, whose interpreter's bf16 dot is wrong), else what kinv asks for (bf16 on a GPU, fp16 on CPU);
* the config file ``configs/<name>.json`` beside the adapter module: when it does not exist, the declared default
  is written there the first time kinv asks for it.

Standard library only at import time (the GPU worker imports adapters without pydantic); torch where used,
pydantic only in :meth:`QuickAdapter.workload_model`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from kinv.kernels.adapter import NAME
from kinv.kernels.errors import BadInput
from kinv.kernels.moved import moved
from kinv.kernels.quick_adapter import DTYPES, UNITS, Declaration, QuickAdapter
from kinv.kernels.restriction_grammar import restriction
from kinv.kernels.tunables import MAX_DIM, Restriction, Tunable, TunableSpec, brief_repr

LABELS = {"num_warps": "w", "num_stages": "s", "num_ctas": "c", "maxnreg": "r"}


# --------------------------------------------------------------------------- #
# declarations
# --------------------------------------------------------------------------- #
def _abbreviations(names: list[str], given: Mapping | None) -> dict[str, str]:
    def short(n: str) -> str:
        parts = [p for p in n.split("_") if p]
        return LABELS.get(n) or ("".join(p[0] for p in parts).upper() if len(parts) > 1 else n)

    out = {n: (given or {}).get(n) or short(n) for n in names}
    seen: dict[str, int] = {}
    for a in out.values():
        seen[a] = seen.get(a, 0) + 1
    return {n: (n if seen[a] > 1 and not (given or {}).get(n) else a) for n, a in out.items()}


def _tunables(tunables, abbr) -> tuple[Tunable, ...]:
    if not isinstance(tunables, Mapping) or not tunables:
        raise BadInput(f"tunables must be a dict of name -> allowed values, e.g. {{'TILE_M': [32, 64]}}; got "
                         f"{brief_repr(tunables)}")  # fmt: skip
    names = [str(n) for n in tunables]
    for n in names:
        if not NAME.fullmatch(n):
            raise BadInput(f"tunable {brief_repr(n)} is not a valid name (letters, digits, _)")
    labels = _abbreviations(names, abbr)
    out = []
    for n, values in tunables.items():
        values = list(values) if isinstance(values, list | tuple | range) else values
        if not isinstance(values, list) or not values:
            raise BadInput(f"tunables.{n}: give a non-empty list of allowed integers; got {brief_repr(values)}")
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise BadInput(f"tunables.{n}: {brief_repr(bad[0])} is not an integer (kinv's tunables are integers)")
        if len(set(values)) != len(values):
            raise BadInput(f"tunables.{n}: the allowed values must be distinct")
        out.append(Tunable(n, tuple(values), labels[n]))
    return tuple(out)


def _levels(levels) -> tuple[tuple[str, ...], list[dict]]:
    if not isinstance(levels, list | tuple) or not levels or len(levels) > 64:
        raise BadInput(f"levels must be a list of 1 to 64 dicts of level dimensions, e.g. [{{'M': 512, 'N': 512}}]; "
                         f"got {brief_repr(levels)}")  # fmt: skip
    first = levels[0]
    if not isinstance(first, Mapping) or not first:
        raise BadInput(f"levels[0] must be a dict of level dimensions; got {brief_repr(first)}")
    dims = tuple(str(d) for d in first)
    out = []
    for i, lv in enumerate(levels):
        if not isinstance(lv, Mapping) or set(map(str, lv)) != set(dims):
            raise BadInput(f"levels[{i}] must have the dimensions of levels[0] ({', '.join(dims)}); got "
                             f"{brief_repr(lv)}")  # fmt: skip
        for d in dims:
            if not NAME.fullmatch(d):
                raise BadInput(f"level dimension {brief_repr(d)} is not a valid name (letters, digits, _)")
            v = lv[d]
            ok = (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM) or (
                isinstance(v, str) and 0 < len(v) <= 64 and "/" not in v)  # fmt: skip
            if not ok:
                raise BadInput(f"levels[{i}].{d}={brief_repr(v)} must be an integer from 0 to {MAX_DIM} or a short "
                                 "string without '/'")  # fmt: skip
            if type(v) is not type(first[d]):
                raise BadInput(f"levels[{i}].{d}={brief_repr(v)}: every level's {d} must be of one type")
        out.append({d: lv[d] for d in dims})
    return dims, out


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise BadInput(f"dtype {brief_repr(dtype)} is not one of float16, bfloat16, float32")
    return DTYPES[name]


def _takes(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _check_callable(fn, what: str, positional: int, example: str) -> None:
    if not callable(fn):
        raise BadInput(f"{what} must be a function {example}; got {brief_repr(fn)}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*range(positional))
    except TypeError:
        raise BadInput(f"{what} must take {positional} arguments {example}; it takes {sig}") from None


def _is_triton(obj) -> bool:
    """A Triton kernel object (JITFunction, its interpreter twin, Autotuner, Heuristics): launched as ``obj[grid]``."""
    return callable(getattr(obj, "run", None)) and hasattr(obj, "fn") and hasattr(type(obj), "__getitem__")


def _python_function(obj):
    for _ in range(8):
        if inspect.isfunction(obj):
            return obj
        obj = getattr(obj, "fn", None)
    return None


def _names(code) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            out |= _names(const)
    return out


def _triton_objects(fn) -> list:
    """The Triton kernels a plain function names (its globals and closure), in a stable order."""
    found = []
    code = getattr(fn, "__code__", None)
    if code is None:
        return found
    scope = getattr(fn, "__globals__", {})
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    for obj in [scope.get(n) for n in sorted(_names(code))] + cells:
        if _is_triton(obj) and all(obj is not f for f in found):
            found.append(obj)
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _relative(fn, package_dir: Path | None, root: Path | None) -> str | None:
    """``fn``'s source file relative to the plugin's root, when it lies inside the plugin's package."""
    if fn is None or package_dir is None or root is None:
        return None
    try:
        path = Path(inspect.getsourcefile(fn) or "").resolve()
    except (TypeError, OSError):
        return None
    if not path.is_file() or not path.is_relative_to(package_dir):
        return None
    return path.relative_to(root).as_posix()


def _module_name(depth: int) -> str:
    return sys._getframe(depth + 1).f_globals.get("__name__", "__main__")


def _build(name: str, module: str, *, tunables: tuple[Tunable, ...], restrictions, default, levels, make_inputs,
           launch, reference, bytes_moved=None, flops=None, tolerance=None, dtype=None, kernel_files=None,
           reference_parts=None, throughput_unit=None, throughput=None, stand_in=None, kernels=(),
           override_dims=None, example_plan: str = "", profile_kernels: str = "", autotune=None, cpu_launch=None,
           output_dtypes=None, fresh_inputs=()) -> type[QuickAdapter]:  # fmt: skip
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BadInput(f"name {brief_repr(name)} is not a valid kernel name (letters, digits, _; at most 64)")
    names = tuple(t.name for t in tunables)
    rules = tuple(restriction(r, names) for r in ([restrictions] if isinstance(restrictions, str) else restrictions))
    if autotune is not None:
        rules = (autotune[3], *rules)
    dims, level_list = _levels(levels)
    clash = sorted(set(dims) & set(names))
    if clash:
        raise BadInput(f"{clash[0]} is both a tunable and a level dimension")
    if override_dims is None:
        override_dims = {d: d for d in dims if isinstance(level_list[0][d], int)}
    spec = TunableSpec(kernel=name, tunables=tunables, restrictions=rules, override_dims=dict(override_dims))
    _check_callable(make_inputs, "make_inputs", 4, "(level, seed, device, dtype) -> dict of tensors")
    _check_callable(launch, "launch", 3, "(inputs, params, out=None) -> output")
    _check_callable(reference, "reference", 1, "(inputs) -> float32 output")
    for what, fn in (("bytes_moved", bytes_moved), ("flops", flops)):
        if fn is not None:
            _check_callable(fn, what, 1, "(level) -> int")
    if throughput is not None:
        _check_callable(throughput, "throughput", 2, "(level, us) -> float")
        if not throughput_unit:
            raise BadInput("throughput needs throughput_unit: what its figure is in (e.g. 'tok/s')")
    unit = throughput_unit or ("TFLOP/s" if flops is not None else "GB/s")
    if throughput is None and unit not in UNITS:
        raise BadInput(f"throughput_unit {unit!r} is not one kinv computes ({', '.join(UNITS)}); give "
                         "throughput=(level, us) -> float with it")  # fmt: skip
    if tolerance is not None and not callable(tolerance) and not isinstance(tolerance, Mapping) and not (
            isinstance(tolerance, tuple | list) and len(tolerance) == 2):  # fmt: skip
        raise BadInput(f"tolerance must be (atol, rtol), a dict dtype -> (atol, rtol) or a function of the dtype; "
                         f"got {brief_repr(tolerance)}")  # fmt: skip
    if cpu_launch is not None:
        _check_callable(cpu_launch, "cpu_launch", 3, "(inputs, params, out=None) -> output, on CPU tensors")
    if output_dtypes is not None:
        output_dtypes = [output_dtypes] if not isinstance(output_dtypes, list | tuple) else list(output_dtypes)
        output_dtypes = [_dtype_name(d) for d in output_dtypes]
    if stand_in is not None and not callable(stand_in) and not isinstance(stand_in, Mapping):
        raise BadInput("stand_in must be a dict of caps on CPU ({'M': 64}) or a function (dims, device) -> dims")
    if isinstance(fresh_inputs, str) or not all(isinstance(n, str) for n in fresh_inputs):
        raise BadInput(f"fresh_inputs must be a tuple of input names (the inputs that change from step to step); got "
                       f"{brief_repr(fresh_inputs)}")  # fmt: skip
    if not isinstance(default, Mapping):
        raise BadInput(f"default must be a dict of tunable values (the config kinv starts from); got "
                         f"{brief_repr(default)}")  # fmt: skip
    try:
        default = spec.validate({**default, "kernel": name}, name)
    except ValueError as exc:
        raise BadInput(f"default: {exc}") from None
    default.pop("kernel", None)
    triton = [*(kernels or ()), *_triton_objects(launch)]
    if autotune is not None and all(autotune[2] is not o for o in triton):
        triton.append(autotune[2])
    triton = [o for i, o in enumerate(triton) if all(o is not p for p in triton[:i])]

    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    package_dir = Path(file).resolve().parent if file else None
    root = package_dir.parent if package_dir else None
    if kernel_files is None:
        found = [_relative(_python_function(o), package_dir, root) for o in triton] + [
            _relative(fn, package_dir, root) for fn in (launch, cpu_launch) if fn is not None]
        kernel_files = tuple(dict.fromkeys(f for f in found if f))
    if reference_parts is None:
        parts = [reference, bytes_moved, flops] + ([make_inputs] if bytes_moved is None else [])
        reference_parts = tuple(dict.fromkeys(
            (rel, fn.__qualname__) for fn in parts if fn is not None and "<" not in getattr(fn, "__qualname__", "<")
            for rel in [_relative(fn, package_dir, root)] if rel))  # fmt: skip
    common = {d: level_list[0][d] for d in dims if all(lv[d] == level_list[0][d] for lv in level_list)}
    decl = Declaration(levels=level_list, common=common, default=default, make_inputs=make_inputs, launch=launch,
                        reference=reference, bytes_moved=bytes_moved, flops=flops, tolerance=tolerance,
                        dtype=_dtype_name(dtype), throughput=throughput, stand_in=stand_in, triton=triton,
                        inputs_vary=_takes(make_inputs, "vary_lengths"), cpu_launch=cpu_launch,
                        output_dtypes=output_dtypes,
                        autotune=autotune[:3] if autotune is not None else None)  # fmt: skip
    cls_name = "".join(p.capitalize() for p in name.split("_") if p) + "Adapter"
    attrs = {"__module__": module, "__qualname__": cls_name, "_q": decl, "name": name, "spec": spec, "level_dims": dims,
             "throughput_unit": unit, "kernel_files": tuple(kernel_files), "reference_parts": tuple(reference_parts),
             "example_plan": example_plan, "profile_kernels": profile_kernels, "fresh_inputs": tuple(fresh_inputs),
             "__doc__": f"The {name} kernel, declared with kinv.kernels.quick in {module}."}  # fmt: skip
    return type(cls_name, (QuickAdapter,), attrs)


def kernel(name: str, *, tunables: Mapping, default: Mapping, levels: list, make_inputs: Callable, launch: Callable,
           reference: Callable, restrictions=(), abbr: Mapping | None = None, module: str | None = None,
           **options) -> type[QuickAdapter]:  # fmt: skip
    """A KernelAdapter subclass from declarations (the module docstring says what kinv derives).

    ``tunables``: name -> allowed integers; ``restrictions``: strings over tunable names (``"TILE_M * TILE_N <=
    16384"``), functions of the values dict, or ``(text, function)``; ``default``: the config kinv starts from;
    ``levels``: dicts of level dimensions; ``make_inputs(level, seed, device, dtype)``, ``launch(inputs, params,
    out=None)`` (returns the output, written into ``out`` when given), ``reference(inputs)``.  Options:
    ``bytes_moved(level)``, ``flops(level)``, ``tolerance`` ((atol, rtol), a dict by dtype name, or a function of
    the dtype), ``dtype``, ``kernel_files`` and ``reference_parts`` (relative to the plugin's root),
    ``throughput_unit`` (calls/s, GB/s, TB/s, GFLOP/s, TFLOP/s; or any with ``throughput=(level, us) -> float``),
    ``fresh_inputs`` (the inputs that change from step to step in real use, refreshed before every timed launch;
    default: the smallest floating-point input), ``stand_in`` (CPU caps by dimension, or ``(dims, device) -> dims``), ``cpu_launch`` (``launch``'s stand-in on CPU
    tensors: the interpreter's gaps, in the module docstring), ``output_dtypes``, ``kernels`` (Triton kernels ``launch``
    reaches without naming them), ``override_dims``, ``example_plan``, ``profile_kernels``; ``abbr`` (labels of
    tunables), ``module`` (whose adapter it is: default the calling module).  Raises BadInput naming the argument.
    """
    return _build(name, module or _module_name(1), tunables=_tunables(tunables, abbr), restrictions=restrictions,
                  default=default, levels=levels, make_inputs=make_inputs, launch=launch, reference=reference,
                  **options)  # fmt: skip


def from_autotune(name: str, autotuned, *, levels: list, make_inputs: Callable, launch: Callable, reference: Callable,
                  default: Mapping | None = None, restrictions=(), abbr: Mapping | None = None,
                  module: str | None = None, **options) -> type[QuickAdapter]:  # fmt: skip
    """A KernelAdapter subclass from a ``@triton.autotune`` kernel: the tunables are its configs' kwargs plus
    ``num_warps`` and ``num_stages`` (``num_ctas``, ``maxnreg`` where the configs differ in them), each allowed its
    listed values and restricted to exactly the listed combinations; the level dimensions are the autotuner's key
    (every level dict names those arguments) and any others the levels add (batch, heads, chunks, ...: they reach
    ``make_inputs`` as the key's do, and a ``stand_in`` may shrink them on CPU); ``default``: the first config unless
    given.  ``launch`` calls the
    autotuned kernel as usual (``kernel[grid](...)``, no tunables passed): while kinv launches it, the autotuner runs
    its underlying kernel with the config kinv chose, and searches nothing.  Options as :func:`kernel`."""
    configs, key = getattr(autotuned, "configs", None), getattr(autotuned, "keys", None)
    if key is None or callable(key):
        key = getattr(autotuned, "key", None)
    if not isinstance(configs, list | tuple) or not configs or not isinstance(key, list | tuple) or not _is_triton(autotuned):
        raise BadInput(f"from_autotune needs what @triton.autotune returns (an Autotuner: .configs, .keys, .fn); got "
                         f"{brief_repr(autotuned)}")  # fmt: skip
    fn = getattr(_python_function(autotuned), "__name__", "the kernel")
    kw = list(configs[0].kwargs)
    for i, c in enumerate(configs):
        if set(c.kwargs) != set(kw):
            raise BadInput(f"{fn}'s autotune configs[{i}] sets {', '.join(sorted(c.kwargs)) or 'nothing'}; configs[0] "
                             f"sets {', '.join(kw) or 'nothing'}: every config must set the same kwargs")  # fmt: skip
    launch_opts = ["num_warps", "num_stages"] + [o for o in ("num_ctas", "maxnreg")
                                                 if len({getattr(c, o, None) for c in configs}) > 1]  # fmt: skip
    names = kw + [o for o in launch_opts if o not in kw]
    values: dict[str, list] = {n: [] for n in names}
    combos: dict[tuple, object] = {}
    for i, c in enumerate(configs):
        row = []
        for n in names:
            v = c.kwargs[n] if n in c.kwargs else getattr(c, n, None)
            if isinstance(v, bool) or not isinstance(v, int):
                raise BadInput(f"{fn}'s autotune configs[{i}].{n}={brief_repr(v)} is not an integer (kinv's tunables "
                                 "are integers)")  # fmt: skip
            row.append(v)
            if v not in values[n]:
                values[n].append(v)
        combos.setdefault(tuple(row), c)
    rule = Restriction(f"one of the {len(combos)} configs of {fn}'s @triton.autotune",
                       lambda v, _c=combos, _n=tuple(names): tuple(v[n] for n in _n) in _c)  # fmt: skip
    if not isinstance(levels, list | tuple) or not levels:
        raise BadInput(f"levels must be a list of dicts of {fn}'s autotune key ({', '.join(key)})")
    for i, lv in enumerate(levels):
        if not isinstance(lv, Mapping) or not set(key) <= set(map(str, lv)):
            raise BadInput(f"levels[{i}] must name {fn}'s autotune key ({', '.join(key)}) and may add dimensions of "
                             f"its own; got {brief_repr(lv)}")  # fmt: skip
    extra = [str(d) for d in levels[0] if str(d) not in key]  # beyond the key: batch, heads, ... (make_inputs reads them)
    levels = [{**{k: lv[k] for k in key}, **{d: lv[d] for d in lv if d not in key}} for lv in levels]
    if any(list(lv)[len(key):] != extra for lv in levels):
        raise BadInput(f"every level must name the same dimensions beyond {fn}'s autotune key (levels[0]: "
                         f"{', '.join(extra) or 'none'})")  # fmt: skip
    tunables = _tunables({n: sorted(values[n]) for n in names}, abbr)
    if default is None:
        default = dict(zip(names, next(iter(combos))))
    return _build(name, module or _module_name(1), tunables=tunables, restrictions=restrictions, default=default,
                  levels=levels, make_inputs=make_inputs, launch=launch, reference=reference,
                  autotune=(tuple(names), combos, autotuned, rule), **options)  # fmt: skip


__all__ = ["from_autotune", "kernel"]


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: QuickError (now BadInput), the adapter's own names
    # (kinv.kernels.quick_adapter) and parse_restriction (kinv.kernels.restriction_grammar)
    return moved(__name__, name)
