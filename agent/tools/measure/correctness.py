"""The correctness gate: no variant is timed before it matches the reference.

For every level the kernel runs on FRESH random inputs (irregular shapes where
the adapter has them) and is compared with the adapter's float32 reference under
the adapter's tolerance; every output must also be finite, and each checked
launch writes into an output first filled with NaN.  The level actually run is
the adapter's stand-in (``KernelAdapter.stand_in``: an adapter may cap its level's
dimensions so a check stays quick, and run a small stand-in on CPU); on a GPU it runs in
bf16, on CPU in the Triton interpreter in float16 (the interpreter's bf16 dot is
wrong).  A launch that raises (compile error, out of resources) is a failed
check, never an exception.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import TYPE_CHECKING

from kinv.agent.fmt import kv
from kinv.kernels.adapter import KernelAdapter, Level

if TYPE_CHECKING:
    from kinv.agent.store.db import Store

def default_device() -> str:
    """'cuda' when a CUDA device is visible, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line}"[:300] if line else type(exc).__name__


def _tensors(x) -> list:
    return [t for item in x for t in _tensors(item)] if isinstance(x, list | tuple) else [x]


#: what the harness times with, and what a kernel module must never replace (a timer patched at import is a
#: known way to fool a benchmark): (owner, attribute) pairs, resolved when first snapshotted
TIMERS = (("torch.cuda.Event", "elapsed_time"), ("torch.cuda.Event", "record"), ("torch.cuda.CUDAGraph", "replay"),
          ("torch.cuda", "synchronize"), ("time", "perf_counter"), ("time", "time"))

#: everything else in a worker that times or judges a variant, by (module, attribute path): a variant imported into
#: the same process could change any of these, by rebinding it or by changing its code in place
WATCHED = (
    ("torch.cuda", "Event.__init__"), ("torch.cuda", "Event.query"), ("torch.cuda", "Event.wait"),
    ("torch.cuda", "Event.synchronize"), ("torch.cuda", "CUDAGraph.capture_begin"),
    ("torch.cuda", "CUDAGraph.capture_end"), ("torch.cuda", "graph.__enter__"), ("torch.cuda", "graph.__exit__"),
    ("torch.cuda", "current_stream"), ("torch.cuda", "empty_cache"), ("torch", "Tensor.copy_"),
    ("torch", "Tensor.fill_"), ("torch", "Tensor.clone"), ("torch", "Tensor.cpu"), ("torch", "empty"),
    ("torch", "empty_like"), ("torch", "save"), ("statistics", "median"), ("json", "dumps"),
    ("json.encoder", "JSONEncoder.encode"), ("json.encoder", "JSONEncoder.iterencode"), ("math", "ceil"),
    ("kinv.agent.tools.measure.correctness", "judge"), ("kinv.agent.tools.measure.correctness", "_compare"),
    ("kinv.agent.tools.measure.correctness", "_poison"), ("kinv.agent.tools.measure.correctness", "_clone"),
    ("kinv.agent.tools.measure.correctness", "_check_level"), ("kinv.agent.tools.measure.correctness", "check"),
    ("kinv.agent.tools.measure.correctness", "code_changed"), ("kinv.agent.tools.measure.correctness", "code_snapshot"),
    ("kinv.agent.tools.measure.correctness", "_fingerprint"),
    ("kinv.agent.tools.worker.shared", "yardstick"), ("kinv.agent.tools.worker.shared", "share"),
    ("kinv.agent.tools.worker.shared", "empty_like"), ("kinv.agent.tools.worker.refresh", "fill"),
    ("kinv.agent.tools.worker.refresh", "moments"), ("kinv.agent.tools.worker.refresh", "counter"),
    ("kinv.agent.tools.worker.refresh", "_fill_kernel.fn"), ("kinv.agent.tools.worker.refresh", "_mix.fn"),
)


def _owner(path: str):
    import importlib

    if path == "time":
        return importlib.import_module("time")
    obj = importlib.import_module("torch")
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def timer_snapshot() -> dict[str, object]:
    """The harness's timers as they are now (take it before any kernel module is imported)."""
    return {f"{o}.{a}": getattr(_owner(o), a, None) for o, a in TIMERS}


def _code_digest(code, h) -> None:
    """Feed a code object (and the code objects nested in its constants) into ``h``."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _code_digest(c, h)
        else:
            h.update(repr(c).encode(errors="replace"))


def _fingerprint(obj) -> tuple:
    """What a callable is now: its identity, and for Python code its code, defaults and closure's contents (a
    function whose ``__code__`` or defaults are changed in place keeps its identity, not its fingerprint)."""
    import hashlib

    fn = getattr(obj, "__func__", obj)
    code = getattr(fn, "__code__", None)
    if code is None:
        return (id(obj),)
    h = hashlib.sha256()
    _code_digest(code, h)
    h.update(repr(getattr(fn, "__defaults__", None)).encode(errors="replace"))
    h.update(repr(getattr(fn, "__kwdefaults__", None)).encode(errors="replace"))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        h.update(repr(_fingerprint(inner) if callable(inner) else id(inner)).encode())
    return (id(obj), h.hexdigest())


def _watched() -> dict[str, object]:
    import importlib
    import sys

    out = timer_snapshot()
    for mod, path in WATCHED:
        if mod.startswith("kinv.") and mod not in sys.modules:
            continue
        try:
            obj = importlib.import_module(mod)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            continue
        out[f"{mod}.{path}"] = obj
    worker = sys.modules.get("kinv.agent.tools.worker.bench_worker")
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) and main.__spec__.name == "kinv.agent.tools.worker.bench_worker":
        worker = main  # a worker runs as ``python -m kinv.agent.tools.worker.bench_worker``: its module is __main__
    if worker is not None and hasattr(worker, "Worker"):  # the worker's own request handlers and timing code
        for cls in worker.Worker.__mro__[:-1]:  # its own and those it takes from kinv's (the judge's requests)
            for name, fn in vars(cls).items():
                if callable(fn) or isinstance(fn, staticmethod):
                    out[f"bench_worker.{cls.__name__}.{name}"] = getattr(worker.Worker, name)
        for name in ("main", "_graph_token"):
            if hasattr(worker, name):
                out[f"bench_worker.{name}"] = getattr(worker, name)
    return out


def code_snapshot() -> dict[str, tuple]:
    """The fingerprint of every function kinv relies on inside a worker (its timers, the judge's helpers, torch's
    and the standard library's functions it calls, the worker's own handlers), as they are now.  Take it before
    any kernel module is imported; :func:`code_changed` compares a later state with it."""
    return {name: _fingerprint(obj) for name, obj in _watched().items()}


def code_changed(snapshot: dict[str, tuple] | None = None) -> list[str]:
    """The names whose object or code differs from ``snapshot`` (default: the first snapshot this process took):
    rebound, or changed in place."""
    snap = snapshot if snapshot is not None else _FIRST_SNAPSHOT
    if not snap:
        return []
    now = code_snapshot()
    return [name for name, fp in snap.items() if now.get(name) != fp]


_FIRST_SNAPSHOT: dict[str, tuple] | None = None


def timers_replaced(snapshot: dict | None = None) -> list[str]:
    """The harness functions changed since ``snapshot`` (default: the first this process took), by name."""
    return code_changed(snapshot)


def _take_first_snapshot() -> None:
    global _FIRST_SNAPSHOT
    if _FIRST_SNAPSHOT is None:
        _FIRST_SNAPSHOT = code_snapshot()


def tolerance(adapter: KernelAdapter, dtype, level: Level, ref) -> tuple[float, float, float | None]:
    """(atol, rtol, norm) for one output at one level: the adapter's level-aware tolerance
    (:meth:`KernelAdapter.tolerance_at`, which may scale with the reference, so that an output that shrinks with
    the level is checked as hard as a large one) and the bound on ||out - ref|| / ||ref|| (``None``: none)."""
    return adapter.tolerance_at(dtype, level, ref)


def _compare(out, ref, atol: float, rtol: float, norm: float | None = None) -> dict:
    """Error figures of one output against its reference (non-finite outputs count as mismatched; an output whose
    relative error norm is above ``norm`` fails as a whole)."""
    out, ref = out.float().cpu(), ref.float().cpu()
    if out.shape != ref.shape:
        return {"mismatched": out.numel() or 1, "nonfinite": 0, "max_abs_err": None, "rel_err": None,
                "shape_error": f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"}  # fmt: skip
    finite = out.isfinite()
    diff = (out - ref).abs()
    bad = (diff > atol + rtol * ref.abs()) | ~finite
    nonfinite = int((~finite).sum())
    ref_norm = float(ref.norm())
    rel = float((out - ref).norm()) / ref_norm if nonfinite == 0 and ref_norm > 0 else None
    rel = rel if rel is None or math.isfinite(rel) else None
    return {
        "mismatched": int(bad.sum()),
        "nonfinite": nonfinite,
        "max_abs_err": float(diff[finite].max()) if bool(finite.any()) else None,
        "rel_err": rel,
        **({"norm_exceeded": True} if norm is not None and rel is not None and rel > norm else {}),
    }


def judge(adapter: KernelAdapter, level: Level, out, ref) -> dict:
    """One launch's outputs against the reference at ``level``, under the level's tolerance: ``{ok, mismatched,
    nonfinite, max_abs_err, rel_err, atol, rtol, norm, reason}`` (the benchmark worker's set-up uses it too)."""
    outs, refs = _tensors(out), _tensors(ref)
    if len(outs) != len(refs):
        return {"ok": False, "reason": f"kernel returned {len(outs)} outputs, the reference {len(refs)}",
                "mismatched": None, "nonfinite": None, "max_abs_err": None, "rel_err": None}  # fmt: skip
    figs, tol = [], (0.0, 0.0, None)
    for o, r in zip(outs, refs, strict=True):
        tol = tolerance(adapter, o.dtype, level, r)
        figs.append(_compare(o, r, *tol))
    errs = [f["max_abs_err"] for f in figs if f["max_abs_err"] is not None]
    rels = [f["rel_err"] for f in figs]
    res = {"mismatched": sum(f["mismatched"] for f in figs), "nonfinite": sum(f["nonfinite"] for f in figs),
           "max_abs_err": max(errs) if errs else None, "rel_err": None if None in rels else max(rels),
           "atol": tol[0], "rtol": tol[1], "norm": tol[2], "norm_exceeded": any(f.get("norm_exceeded") for f in figs)}  # fmt: skip
    res["ok"] = res["mismatched"] == 0 and not res["norm_exceeded"]
    res["reason"] = _why(res, sum(r.numel() for r in refs), level.key)
    return res


def _why(f: dict, total: int, key: str, how: str = "") -> str:
    if f.get("shape_error"):
        return f"{key}: {f['shape_error']}"
    if f["nonfinite"]:
        return f"{key}: {f['nonfinite']} of {total} outputs are not finite{how}"
    if f["mismatched"]:
        return (f"{key}: {f['mismatched']} of {total} outputs outside atol={f['atol']:.3g}, rtol={f['rtol']:g} "
                f"(max abs err {f['max_abs_err']:.3g}){how}")  # fmt: skip
    if f.get("norm_exceeded"):
        return (f"{key}: relative error {f['rel_err']:.2e} above the level's bound {f['norm']:.1e} (a loss of "
                f"precision beyond the kernel's own){how}")  # fmt: skip
    return ""


def _poison(out) -> None:
    """Fill every floating-point output tensor with NaN."""
    for t in _tensors(out):
        if t.is_floating_point():
            t.fill_(float("nan"))


def _clone(out):
    """A copy of a launch's output (a tensor or a list/tuple of them), so the next mode can reuse the buffer."""
    if isinstance(out, list | tuple):
        return type(out)(_clone(o) for o in out)
    return out.clone() if hasattr(out, "clone") else out


def _rewrite_in_place(inputs: dict) -> bool:
    """Overwrite the floating-point inputs with other values of the same distribution (each shifted one element
    along), at the same addresses: a result cached by input address then goes stale.  False when there is none."""
    done = False
    import torch

    for t in inputs.values():  # tensors only: a scalar, a dtype or a string input passes through untouched
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1:
            t.copy_(t.flatten().roll(1).view_as(t))
            done = True
    return done


def _check_level(adapter: KernelAdapter, config: dict, level: Level, seed: int, device: str, dtype,
                 defer: bool = False) -> dict:  # fmt: skip
    run = adapter.stand_in(level, device)
    params = adapter.params_for(config, level)  # the level's own parameters (overrides by real batch)
    entry = {"level": level.key, "ran": run.key, "params": params.short(), "seed": seed,
             "max_abs_err": None, "rel_err": None, "mismatched": None, "nonfinite": None, "ok": False}  # fmt: skip
    kwargs = {"device": device, "dtype": dtype}
    if "vary_lengths" in inspect.signature(adapter.make_inputs).parameters:
        kwargs["vary_lengths"] = True
    try:
        inputs = adapter.make_inputs(run, seed, **kwargs)
    except Exception as exc:
        return {**entry, "reason": f"inputs failed: {_first_line(exc)}"}
    _take_first_snapshot()
    modes = adapter.check_modes()
    takes_out = "out" in inspect.signature(adapter.launch).parameters

    def launch_all(mode_list, buffer):
        got = []
        for mode in mode_list:
            if takes_out:  # poison, then launch into it: a mode that writes nothing leaves NaN, never an
                _poison(buffer)  # earlier correct result (buffer reuse is a known benchmark exploit)
                got.append((mode, _clone(adapter.launch(inputs, params, out=buffer, **mode)[0])))
            else:
                got.append((mode, adapter.launch(inputs, params, **mode)[0]))
        if device != "cpu":
            import torch

            torch.cuda.synchronize()
        return got

    def late_writes(buffer, got) -> bool:
        # the last launch's output, copied on the launch's own stream right after it, against the buffer after a
        # device-wide sync: a difference is work that finished after the launch returned on its stream (a side
        # stream the caller, and so the timer, never waits for)
        if device == "cpu" or not takes_out or not got:
            return False
        import torch

        a, b = _tensors(got[-1][1]), _tensors(buffer)
        return any(not torch.equal(x.nan_to_num(), y.nan_to_num()) for x, y in zip(a, b, strict=False))

    try:
        buffer = None
        if takes_out:  # the adapter's empty output, or one launch's output (which sizes it)
            buffer = adapter.make_output(inputs, params)
            if buffer is None:
                buffer = adapter.launch(inputs, params, **modes[0])[0]
        outs_by_mode = launch_all(modes, buffer)
        late = late_writes(buffer, outs_by_mode)
    except Exception as exc:
        return {**entry, "reason": f"launch failed: {_first_line(exc)}{_cpu_hint(device, exc)}", "fatal": True}
    try:
        ref = None if defer else adapter.reference(inputs)
    except Exception as exc:
        return {**entry, "reason": f"reference failed: {_first_line(exc)} (the adapter's reference, not the kernel, "
                                   "raised)", "fatal": True}  # fmt: skip
    try:
        # the same addresses, new values: the first mode once more (a result cached by input pointer is stale)
        rewritten = _rewrite_in_place(inputs)
        again = launch_all(modes[:1], buffer) if rewritten else []
    except Exception as exc:
        return {**entry, "reason": f"launch failed: {_first_line(exc)}{_cpu_hint(device, exc)}", "fatal": True}
    replaced = timers_replaced()
    if replaced:  # a kernel module that patches the timer cannot be timed, whatever its outputs
        return {**entry, "reason": f"{level.key}: the kernel's import or launch replaced the harness's timer "
                                   f"or changed its code in memory ({', '.join(replaced)}); it cannot be timed",
                "tampered": replaced}  # fmt: skip
    if late:
        return {**entry, "reason": f"{level.key}: the outputs were still being written after the launch returned on "
                                   "its stream (work on a side stream that the caller, and so the timer, never waits "
                                   "for)", "side_stream": True}  # fmt: skip
    if defer:  # the judge, in a process that never imported this kernel, computes the reference and compares
        return {**entry, "ok": None, "pending": _deferred(run, seed, kwargs, outs_by_mode, again)}
    try:
        ref2 = adapter.reference(inputs) if again else None
    except Exception as exc:
        return {**entry, "reason": f"reference failed: {_first_line(exc)}", "fatal": True}
    return _verdict(adapter, run, level, entry, outs_by_mode, again, ref, ref2)


#: what the Triton interpreter cannot run that a GPU runs, as an error shows it: (what the text holds, the gap)
INTERPRETER_GAPS = (
    ("libdevice", "a libdevice function (in the interpreter it returns None)"),
    ("NoneType", "a libdevice function (in the interpreter it returns None)"),
    ("float' object", "a Python scalar used as a tensor (pass it as a 0-d tensor, or .to() it in the kernel)"),
    ("int' object", "a Python scalar used as a tensor (pass it as a 0-d tensor, or .to() it in the kernel)"),
    ("bf16", "a bf16 tl.dot (the interpreter's is wrong: check in float16)"),
    ("bfloat16", "a bf16 tl.dot (the interpreter's is wrong: check in float16)"),
)


def _cpu_hint(device: str, exc: BaseException) -> str:
    """What to add to a launch that failed on CPU: TRITON_INTERPRET unset, or the interpreter's known gaps (the one the
    error points at first), and the way around them."""
    if device != "cpu":
        return ""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return " (on CPU, set TRITON_INTERPRET=1 before triton is imported)"
    text = f"{type(exc).__name__}: {exc}"
    from_triton = type(exc).__name__ == "InterpreterError" or type(exc).__module__.startswith("triton")
    if not from_triton:  # the adapter's own error (a bad argument, a shape): nothing about the interpreter
        return ""
    seen = list(dict.fromkeys(gap for key, gap in INTERPRETER_GAPS if key in text))
    known = "; ".join(dict.fromkeys(gap for _, gap in INTERPRETER_GAPS))
    likely = f"likely {seen[0]}; " if seen else ""
    return (f" [in the Triton interpreter (CPU), which cannot run every kernel a GPU runs: {likely}known gaps: {known}. "
            "A kernel that runs on a GPU may fail only here: give the adapter a cpu_launch (kinv.kernels.quick) or a "
            "stand_in, or check it on a GPU]")  # fmt: skip


def _fresh_inputs(adapter: KernelAdapter, run: Level, seed: int, kwargs: dict, rewritten: bool = False) -> dict:
    """The inputs a check launched on, made again from their seed (never the buffers a kernel had in hand: one that
    wrote into its inputs is judged against what its inputs should have been)."""
    inputs = adapter.make_inputs(run, seed, **kwargs)
    if rewritten:
        _rewrite_in_place(inputs)
    return inputs


def _deferred(run: Level, seed: int, kwargs: dict, outs_by_mode: list, again: list) -> dict:
    """Save a level's checked outputs for the judge: ``{file, run, seed, kwargs, modes, again}``."""
    import tempfile

    import torch

    fd, path = tempfile.mkstemp(prefix="kinv-outputs-", suffix=".pt")
    os.close(fd)
    cpu = [[_to_cpu(out) for _mode, out in outs_by_mode], [_to_cpu(out) for _mode, out in again]]
    torch.save(cpu, path)
    kw = {k: (str(v).removeprefix("torch.") if k == "dtype" else v) for k, v in kwargs.items()}
    return {"file": path, "run": run.to_dict(), "seed": seed, "kwargs": kw,
            "modes": [m for m, _ in outs_by_mode], "again": [m for m, _ in again]}  # fmt: skip


def _to_cpu(out):
    if isinstance(out, list | tuple):
        return type(out)(_to_cpu(o) for o in out)
    return out.detach().cpu() if hasattr(out, "detach") else out


def _verdict(adapter: KernelAdapter, run: Level, level: Level, entry: dict, outs_by_mode: list, again: list, ref,
             ref2) -> dict:  # fmt: skip
    """A level's entry from its checked outputs and the references (wherever those were computed)."""
    figures = [(mode, judge(adapter, run, out, ref), "") for mode, out in outs_by_mode]
    figures += [(mode, judge(adapter, run, out, ref2), " (after its inputs were rewritten in place at the same "
                 "addresses: a result cached by input address?)") for mode, out in again]  # fmt: skip
    bad = [(m, f, note) for m, f, note in figures if not f["ok"]]
    errs = [f["max_abs_err"] for _, f, _ in figures if f["max_abs_err"] is not None]
    rels = [f["rel_err"] for _, f, _ in figures]
    first = figures[0][1]
    plain = [f for _, f, note in figures if not note]  # the counts are the plain launches' (one per mode)
    entry.update(max_abs_err=max(errs) if errs else None, rel_err=None if None in rels else max(rels),
                 mismatched=sum(f["mismatched"] or 0 for f in plain),
                 nonfinite=sum(f["nonfinite"] or 0 for f in plain), atol=first.get("atol"),
                 rtol=first.get("rtol"), norm=first.get("norm"), ok=not bad)  # fmt: skip
    if bad:
        mode, f, note = bad[0]
        how = f" (launched with {kv(mode, ', ')})" if mode else ""
        total = sum(r.numel() for r in _tensors(ref)) * (len(plain) if not note else 1)
        f = {**f, "mismatched": entry["mismatched"], "nonfinite": entry["nonfinite"]} if not note else f
        entry["reason"] = (_why(f, total, level.key, how) or f["reason"]) + note
    return entry


def settle_level(adapter: KernelAdapter, entry: dict, unlink: bool = True) -> dict:
    """The judge's half of a deferred check (:func:`check` with ``defer``): the level's inputs made again from
    their seed, the reference computed here, the saved outputs compared with it.  Run it in a process that never
    imported the kernel under test."""
    import torch

    p = entry.pop("pending")
    try:
        outs, again_outs = torch.load(p["file"], weights_only=True)
    finally:
        if unlink:
            try:
                os.unlink(p["file"])
            except OSError:
                pass
    run = adapter.level(p["run"])
    kwargs = {k: (getattr(torch, v) if k == "dtype" else v) for k, v in p["kwargs"].items()}
    device = kwargs.get("device", "cpu")
    where = "cuda" if str(device).startswith("cuda") else "cpu"
    try:
        ref = adapter.reference(_fresh_inputs(adapter, run, p["seed"], kwargs))
        ref2 = adapter.reference(_fresh_inputs(adapter, run, p["seed"], kwargs, rewritten=True)) if p["again"] else None
    except Exception as exc:
        return {**entry, "reason": f"reference failed: {_first_line(exc)}", "fatal": True}
    plain = [(m, _to_device(o, where)) for m, o in zip(p["modes"], outs)]
    again = [(m, _to_device(o, where)) for m, o in zip(p["again"], again_outs)]
    return _verdict(adapter, run, _KeyOnly(entry["level"]), entry, plain, again, ref, ref2)


class _KeyOnly:
    """A level known only by its key (what :func:`_verdict` says of the level it reports)."""

    def __init__(self, key: str):
        self.key = key


def _to_device(out, device: str):
    if isinstance(out, list | tuple):
        return type(out)(_to_device(o, device) for o in out)
    return out.to(device) if hasattr(out, "to") else out


def settle(adapter: KernelAdapter, result: dict, unlink: bool = True) -> dict:
    """Judge every deferred level of a check's result here (:func:`settle_level`), and decide the result as
    :func:`check` would have (``unlink``: delete the saved outputs once read)."""
    by_level = {}
    for i, e in enumerate(result["levels"]):
        if "pending" in e:
            e = settle_level(adapter, e, unlink)
            e.pop("fatal", None)
            result["levels"][i] = e
        by_level[e["level"]] = e
    for i, e in enumerate(result["levels"]):
        if e.get("same_as") and e.get("ok") is None:
            first = by_level[e["same_as"]]
            e = {**first, "level": e["level"], "same_as": first["level"]}
            if not e["ok"]:
                e["reason"] = f"{e['level']}: as {first['level']} (the same stand-in and parameters): " + \
                    (first.get("reason") or "").removeprefix(f"{first['level']}: ")
            result["levels"][i] = e
    result["ok"] = bool(result["levels"]) and all(e.get("ok") for e in result["levels"]) and \
        result.pop("n_levels", len(result["levels"])) == len(result["levels"])
    if not result["ok"] and not result.get("reason"):
        result["reason"] = next((e.get("reason") for e in result["levels"] if not e.get("ok") and e.get("reason")), "")
    return result


def check(adapter: KernelAdapter, config: dict, levels: list[Level], *, seed: int, device: str | None = None,
          defer: bool = False) -> dict:  # fmt: skip
    """Run ``config`` at every level on fresh random inputs and compare with the reference; never raises
    for a kernel failure.

    Returns ``{"ok", "levels": [{level, ran, max_abs_err, rel_err, mismatched, nonfinite, ok, ...}], "seed",
    "device", "dtype", "reason"}``.  After a launch failure the remaining levels are not run.  A level whose
    stand-in and resolved parameters equal an earlier level's shares that level's check (``same_as``).
    """
    _take_first_snapshot()  # before this call launches anything (a caller that imports kernels takes it earlier)
    device = device or default_device()
    dtype = adapter.check_dtype(device)  # bf16 on a GPU, fp16 on CPU, unless the kernel runs in one dtype
    result = {"ok": False, "levels": [], "seed": seed, "device": device, "dtype": str(dtype).removeprefix("torch."),
              "reason": ""}  # fmt: skip
    if not levels:
        result["reason"] = "no levels to check"
        return result
    config = adapter.validate_config(config)
    checked: dict[tuple, dict] = {}  # (stand-in, launch parameters) -> the entry of the level that ran it
    for i, level in enumerate(levels):
        # levels whose stand-in and resolved parameters are the same launch the same program on the same
        # problem: it runs once (on its own fresh inputs) and the others say whose check they share
        same = (adapter.stand_in(level, device).key, tuple(sorted(adapter.params_for(config, level).items())))
        if same in checked:
            first = checked[same]
            if "pending" in first:  # judged once the first is (settle)
                result["levels"].append({"level": level.key, "same_as": first["level"], "ok": None})
                continue
            entry = {**first, "level": level.key, "same_as": first["level"]}
            if not entry["ok"]:
                entry["reason"] = f"{level.key}: as {first['level']} (the same stand-in and parameters): " + \
                    first["reason"].removeprefix(f"{first['level']}: ")
            result["levels"].append(entry)
            continue
        entry = _check_level(adapter, config, level, seed + 7919 * i, device, dtype, defer)
        checked[same] = entry
        fatal = entry.pop("fatal", False)
        result["levels"].append(entry)
        if entry["ok"] is False and not result["reason"]:
            result["reason"] = entry["reason"]
        if fatal:
            break
    result["ok"] = all(e["ok"] for e in result["levels"]) and len(result["levels"]) == len(levels)
    if defer:
        result["n_levels"] = len(levels)  # settle decides "ok" once the judge has judged
        if not any(e["ok"] is False for e in result["levels"]) and len(result["levels"]) == len(levels):
            result["ok"] = None  # launched everywhere, judged nowhere yet
    return result


def record(store: Store, ws_id: str | None, experiment: int, result: dict) -> None:
    """Store the result on the experiment; an incorrect variant is rejected there and then."""
    store.update_experiment(experiment, correctness=result)
    if result["ok"]:
        n = len(result["levels"])
        ran = sum(1 for e in result["levels"] if not e.get("same_as"))
        runs = f"; {ran} distinct stand-in launch(es)" if ran != n else ""
        store.event(ws_id, "correctness.ok", f"correct at {n} level(s) ({result['device']}, {result['dtype']}{runs})",
                    {"experiment": experiment})  # fmt: skip
        return
    reason = f"incorrect: {result['reason']}"
    store.update_experiment(experiment, status="rejected", verdict="reject", reason=reason)
    store.event(ws_id, "correctness.failed", reason, {"experiment": experiment})


__all__ = ["CHECK_TIMEOUT_S", "TIMERS", "check", "check_isolated", "default_device", "failed", "judge", "record",
           "timer_snapshot", "timers_replaced", "tolerance"]


# --------------------------------------------------------------------------- #
# crash isolation: the check in a child process
# --------------------------------------------------------------------------- #
CHECK_TIMEOUT_S = 900.0  # a check that has not answered by then hangs: its process is killed


def failed(seed: int, device: str, reason: str, **extra) -> dict:
    """The result of a check whose process died or refused the job: no level was checked."""
    return {"ok": False, "levels": [], "seed": seed, "device": device, "dtype": None, "reason": reason, **extra}


def check_isolated(kernel: str, config: dict, levels: list[Level], *, seed: int, device: str,
                   pythonpath: list[str] | None = None, timeout: float = CHECK_TIMEOUT_S,
                   env: dict | None = None) -> dict:  # fmt: skip
    """:func:`check` in a child process, so a variant that crashes (segfault, illegal address, abort)
    or hangs kills only the child; the result then says how it died.  ``pythonpath`` entries go first
    on the child's path (a kernel source snapshot); ``env`` is the plan's environment (the child sees
    what the benchmark workers see).  Never raises for a kernel failure."""
    import json
    import subprocess
    import sys

    from kinv import IMPORT_ROOT as root

    env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
    from kinv.kernels.adapter import import_path

    paths = [*(pythonpath or []), root, env.get("PYTHONPATH", ""), *import_path()]  # import_path: a plugin's folder
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    job = {"kernel": kernel, "config": config, "levels": [lv.to_dict() for lv in levels], "seed": seed,
           "device": device}  # fmt: skip
    from kinv.agent.tools.worker.client import child_spawn

    spawn, child_env = child_spawn()  # the check dies with the run (a kill -9 of kinv leaves no child computing)
    env.update(child_env)
    try:
        proc = subprocess.run([sys.executable, "-P", "-m", "kinv.agent.tools.measure.correctness"], input=json.dumps(job), env=env,
                              capture_output=True, text=True, timeout=timeout, **spawn)  # fmt: skip
    except subprocess.TimeoutExpired:
        return failed(seed, device, f"the check did not finish within {timeout:.0f} s (hang?)")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    rc = proc.returncode
    how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
    tail = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "")
    return failed(seed, device, f"crashed: the check process died ({how})" + (f": {tail[:200]}" if tail else ""),
                  crashed=True)  # fmt: skip


def _main() -> int:
    import json
    import sys

    from kinv.agent.tools.worker.client import watch_parent
    from kinv.kernels.adapter import get_adapter

    watch_parent()
    _take_first_snapshot()  # the timers before the kernel's module is imported
    job = json.loads(sys.stdin.read())
    adapter = get_adapter(job["kernel"])
    levels = [adapter.level(lv) for lv in job["levels"]]
    # deferred: this process imported the kernel under test, so the judge compares (agent/tools/measure/judge.py)
    result = check(adapter, job["config"], levels, seed=job["seed"], device=job["device"], defer=True)
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
