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

from kinv.kernels.adapter import KernelAdapter, Level

if TYPE_CHECKING:
    from kinv.agent.store import Store

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


def _compare(out, ref, atol: float, rtol: float) -> dict:
    """Error figures of one output against its reference (non-finite outputs count as mismatched)."""
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
    return {
        "mismatched": int(bad.sum()),
        "nonfinite": nonfinite,
        "max_abs_err": float(diff[finite].max()) if bool(finite.any()) else None,
        "rel_err": rel if rel is None or math.isfinite(rel) else None,
    }


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


def _check_level(adapter: KernelAdapter, config: dict, level: Level, seed: int, device: str, dtype) -> dict:
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
    try:
        outs_by_mode = []
        modes = adapter.check_modes()
        takes_out = "out" in inspect.signature(adapter.launch).parameters
        buffer = None
        if takes_out:  # the adapter's empty output, or one launch's output (which sizes it)
            buffer = adapter.make_output(inputs, params)
            if buffer is None:
                buffer = adapter.launch(inputs, params, **modes[0])[0]
        for mode in modes:
            if takes_out:  # poison, then launch into it: a mode that writes nothing leaves NaN, never an
                _poison(buffer)  # earlier correct result (buffer reuse is a known benchmark exploit)
                out = _clone(adapter.launch(inputs, params, out=buffer, **mode)[0])
            else:
                out = adapter.launch(inputs, params, **mode)[0]
            outs_by_mode.append((mode, out))
        if device != "cpu":
            import torch

            torch.cuda.synchronize()
    except Exception as exc:
        hint = ""
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            hint = " (on CPU, set TRITON_INTERPRET=1 before triton is imported)"
        return {**entry, "reason": f"launch failed: {_first_line(exc)}{hint}", "fatal": True}
    try:
        ref = adapter.reference(inputs)
    except Exception as exc:
        return {**entry, "reason": f"reference failed: {_first_line(exc)}", "fatal": True}
    refs = _tensors(ref)
    figures, atol, rtol = [], 0.0, 0.0
    for mode, out in outs_by_mode:
        outs = _tensors(out)
        if len(outs) != len(refs):
            return {**entry, "reason": f"kernel returned {len(outs)} outputs, the reference {len(refs)}"}
        atol, rtol = adapter.tolerance(outs[0].dtype)
        figures += [{**_compare(o, r, atol, rtol), "mode": mode} for o, r in zip(outs, refs, strict=True)]
    total = sum(r.numel() for r in refs) * len(outs_by_mode)
    bad_modes = [f["mode"] for f in figures if f["mismatched"] or f["nonfinite"]]
    how = f" (launched with {', '.join(f'{k}={v}' for k, v in bad_modes[0].items())})" if bad_modes and bad_modes[0] else ""
    mismatched = sum(f["mismatched"] for f in figures)
    nonfinite = sum(f["nonfinite"] for f in figures)
    errs = [f["max_abs_err"] for f in figures if f["max_abs_err"] is not None]
    rels = [f["rel_err"] for f in figures]
    entry.update(max_abs_err=max(errs) if errs else None, rel_err=None if None in rels else max(rels),
                 mismatched=mismatched, nonfinite=nonfinite, atol=atol, rtol=rtol, ok=mismatched == 0)  # fmt: skip
    shape_error = next((f["shape_error"] for f in figures if "shape_error" in f), None)
    if shape_error:
        entry["reason"] = f"{level.key}: {shape_error}"
    elif nonfinite:
        entry["reason"] = f"{level.key}: {nonfinite} of {total} outputs are not finite{how}"
    elif mismatched:
        entry["reason"] = (f"{level.key}: {mismatched} of {total} outputs outside atol={atol:g}, rtol={rtol:g} "
                           f"(max abs err {entry['max_abs_err']:.3g}){how}")  # fmt: skip
    return entry


def check(adapter: KernelAdapter, config: dict, levels: list[Level], *, seed: int, device: str | None = None) -> dict:
    """Run ``config`` at every level on fresh random inputs and compare with the reference; never raises
    for a kernel failure.

    Returns ``{"ok", "levels": [{level, ran, max_abs_err, rel_err, mismatched, nonfinite, ok, ...}], "seed",
    "device", "dtype", "reason"}``.  After a launch failure the remaining levels are not run.  A level whose
    stand-in and resolved parameters equal an earlier level's shares that level's check (``same_as``).
    """
    import torch

    device = device or default_device()
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
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
            entry = {**first, "level": level.key, "same_as": first["level"]}
            if not entry["ok"]:
                entry["reason"] = f"{level.key}: as {first['level']} (the same stand-in and parameters): " + \
                    first["reason"].removeprefix(f"{first['level']}: ")
            result["levels"].append(entry)
            continue
        entry = _check_level(adapter, config, level, seed + 7919 * i, device, dtype)
        checked[same] = entry
        fatal = entry.pop("fatal", False)
        result["levels"].append(entry)
        if not entry["ok"] and not result["reason"]:
            result["reason"] = entry["reason"]
        if fatal:
            break
    result["ok"] = all(e["ok"] for e in result["levels"]) and len(result["levels"]) == len(levels)
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


__all__ = ["CHECK_TIMEOUT_S", "check", "check_isolated", "default_device", "failed", "record"]


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
    from kinv.agent.tools.worker_client import child_spawn

    spawn, child_env = child_spawn()  # the check dies with the run (a kill -9 of kinv leaves no child computing)
    env.update(child_env)
    try:
        proc = subprocess.run([sys.executable, "-P", "-m", "kinv.agent.tools.correctness"], input=json.dumps(job), env=env,
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

    from kinv.agent.tools.worker_client import watch_parent
    from kinv.kernels.adapter import get_adapter

    watch_parent()
    job = json.loads(sys.stdin.read())
    adapter = get_adapter(job["kernel"])
    levels = [adapter.level(lv) for lv in job["levels"]]
    result = check(adapter, job["config"], levels, seed=job["seed"], device=job["device"])
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
