"""The judge's comparison: a launch's outputs against the adapter's reference under the level's tolerance, and the
judge's half of a deferred check (the inputs made again from their seed, the reference computed, the saved outputs
compared), run in a process that never imported the kernel under test.  Every output must be finite; an output whose
relative error norm is above the level's bound fails as a whole."""

from __future__ import annotations

import math
import os

from kinv.agent.fmt import kv
from kinv.kernels.adapter import KernelAdapter, Level


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line}"[:300] if line else type(exc).__name__


def _tensors(x) -> list:
    return [t for item in x for t in _tensors(item)] if isinstance(x, list | tuple) else [x]


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


def _fresh_inputs(adapter: KernelAdapter, run: Level, seed: int, kwargs: dict, rewritten: bool = False) -> dict:
    """The inputs a check launched on, made again from their seed (never the buffers a kernel had in hand: one that
    wrote into its inputs is judged against what its inputs should have been)."""
    inputs = adapter.make_inputs(run, seed, **kwargs)
    if rewritten:
        _rewrite_in_place(inputs)
    return inputs


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

