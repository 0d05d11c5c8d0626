"""The correctness gate, launched: no variant is timed before it matches the reference.

For every level the kernel runs on FRESH random inputs (irregular shapes where
the adapter has them) and is compared with the adapter's float32 reference under
the adapter's tolerance (agent/tools/worker/compare.py); every output must also be finite, and each checked
launch writes into an output first filled with NaN.  The level actually run is
the adapter's stand-in (``KernelAdapter.stand_in``: an adapter may cap its level's
dimensions so a check stays quick, and run a small stand-in on CPU); on a GPU it runs in
bf16, on CPU in the Triton interpreter in float16 (the interpreter's bf16 dot is
wrong).  A launch that raises (compile error, out of resources) is a failed
check, never an exception.  With ``defer`` the outputs are saved for the judge (agent/tools/worker/judge.py), a
process that never imported the variant; ``python -m kinv.agent.tools.worker.gate`` is the check's own process.
"""

from __future__ import annotations

import inspect
import os

from kinv.agent.tools.worker.compare import _clone, _first_line, _poison, _rewrite_in_place, _tensors, _verdict
from kinv.agent.tools.worker.tamper import _take_first_snapshot, timers_replaced
from kinv.kernels.adapter import KernelAdapter, Level


def default_device() -> str:
    """'cuda' when a CUDA device is visible, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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
        proc = subprocess.run([sys.executable, "-P", "-m", "kinv.agent.tools.worker.gate"], input=json.dumps(job), env=env,
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
    # deferred: this process imported the kernel under test, so the judge compares (agent/tools/worker/judge.py)
    result = check(adapter, job["config"], levels, seed=job["seed"], device=job["device"], defer=True)
    sys.stdout.write(json.dumps(result, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
