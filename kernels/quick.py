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
  :mod:`ast` and evaluated by a small walker of its own (never ``eval``): tunable names, numbers, ``+ - * / // %``,
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

import ast
import inspect
import json
import operator
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from kinv.kernels.adapter import NAME, KernelAdapter, Level, Resources
from kinv.kernels.devices import DeviceSpec, occupancy
from kinv.kernels.errors import BadInput
from kinv.kernels.moved import moved
from kinv.kernels.tunables import MAX_DIM, Params, Restriction, Tunable, TunableSpec, brief_repr

CPU_CAP = 64  # the largest integer level dimension the CPU stand-in runs (the Triton interpreter is slow)
DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float32": "float32", "fp32": "float32", "float": "float32"}  # fmt: skip
TOLERANCE = {"float32": (1e-2, 1e-2), "float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2)}
UNITS = {"calls/s": (None, 1.0), "GB/s": ("bytes", 1e9), "TB/s": ("bytes", 1e12), "GFLOP/s": ("flops", 1e9),
         "TFLOP/s": ("flops", 1e12)}  # fmt: skip
LABELS = {"num_warps": "w", "num_stages": "s", "num_ctas": "c", "maxnreg": "r"}


# --------------------------------------------------------------------------- #
# restrictions: parsed with ast, evaluated by a walker (no eval)
# --------------------------------------------------------------------------- #
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}  # fmt: skip
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_STRUCTURE = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name, ast.Load,
              ast.Constant, *_BINARY, *_COMPARE, *_UNARY)  # fmt: skip
_WHAT = {ast.Call: "a call", ast.Attribute: "an attribute", ast.Subscript: "a subscript", ast.Lambda: "a lambda",
         ast.Pow: "the power operator **", ast.IfExp: "a conditional expression", ast.NamedExpr: "an assignment",
         ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set", ast.In: "'in'",
         ast.NotIn: "'not in'", ast.Is: "'is'", ast.IsNot: "'is not'", ast.ListComp: "a comprehension",
         ast.GeneratorExp: "a generator", ast.JoinedStr: "an f-string"}  # fmt: skip


def _allowed(names) -> str:
    return (f"a restriction may use only tunable names ({', '.join(names)}), numbers, arithmetic (+ - * / // %), "
            "comparisons (== != < <= > >=) and and/or/not")  # fmt: skip


def parse_restriction(text: str, names) -> ast.Expression:
    """The parsed restriction, or BadInput saying why it is refused (one message: what it uses, what is allowed)."""
    names = tuple(names)
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"restriction {brief_repr(text)} is refused: give a condition over the tunables, "
                         f"e.g. '{names[0] if names else 'TILE_M'} <= 128'; {_allowed(names)}")  # fmt: skip
    if len(text) > 500:
        raise BadInput(f"restriction {brief_repr(text)} is refused: it is longer than 500 characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise BadInput(f"restriction {text!r} is refused: it is not an expression ({exc.msg}); "
                         f"{_allowed(names)}") from None  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names:
            raise BadInput(f"restriction {text!r} is refused: it names {node.id}, which is not a tunable; "
                             f"{_allowed(names)}")  # fmt: skip
        if isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not isinstance(node.value, int | float)):
            raise BadInput(f"restriction {text!r} is refused: it uses the constant {node.value!r}; {_allowed(names)}")
        if not isinstance(node, _STRUCTURE):
            what = _WHAT.get(type(node), f"a {type(node).__name__} expression")
            raise BadInput(f"restriction {text!r} is refused: it uses {what}; {_allowed(names)}")
    if not isinstance(tree.body, ast.Compare | ast.BoolOp) and not (
            isinstance(tree.body, ast.UnaryOp) and isinstance(tree.body.op, ast.Not)):  # fmt: skip
        raise BadInput(f"restriction {text!r} is refused: it is not a condition (compare values, e.g. "
                         f"'{names[0] if names else 'TILE_M'} <= 128'); {_allowed(names)}")  # fmt: skip
    return tree


def _evaluate(node, values: Mapping):
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, values)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, values), _evaluate(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, values))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_evaluate(v, values) for v in node.values)
        return any(_evaluate(v, values) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        for op, comp in zip(node.ops, node.comparators):
            right = _evaluate(comp, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise TypeError(f"unexpected {type(node).__name__}")  # parse_restriction admits nothing else


def restriction(item, names) -> Restriction:
    """A kinv Restriction from a string (Kernel Tuner's form), a callable of the values dict, or ``(text, callable)``."""
    if isinstance(item, str):
        tree = parse_restriction(item, names)
        return Restriction(item.strip(), lambda v, _t=tree: bool(_evaluate(_t, v)))
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1]):
        fn = item[1]
        return Restriction(item[0], lambda v, _f=fn: bool(_f(dict(v))))
    if callable(item):
        doc = (inspect.getdoc(item) or "").strip().splitlines()
        name = getattr(item, "__name__", "")
        text = doc[0] if doc else (name if name and name != "<lambda>" else "a restriction given as a function")
        return Restriction(text, lambda v, _f=item: bool(_f(dict(v))))
    raise BadInput(f"restriction {brief_repr(item)} is refused: give a string such as 'TILE_M * TILE_N <= 16384', "
                     "a function of the values dict, or (text, function)")  # fmt: skip


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


class _Declaration:
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

    _q: _Declaration
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
    decl = _Declaration(levels=level_list, common=common, default=default, make_inputs=make_inputs, launch=launch,
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


__all__ = ["QuickAdapter", "from_autotune", "kernel", "parse_restriction", "restriction"]


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: QuickError (now BadInput)
    return moved(__name__, name)
