"""The judge: the reference computed, and every comparison made, in a process that never imported a variant.

A variant's code runs in the process that launches it (a benchmark worker, a check's process), and there it can
change anything: the reference, the comparison, the timer.  So that process only launches and saves what the
kernel wrote; the judge, a kept process of its own started from the baseline's files (the baseline snapshot while
a source patch is live), makes the inputs again from their seeds, computes the reference and compares.  The same
process measures the card's ceilings (copy bandwidth, the yardstick's, the matrix peak per dtype) that the roofline
and the plausibility rule use: a worker that imported a variant never measures them.

One judge per (device, import path), kept for the run (its imports and CUDA context take seconds).
"""

from __future__ import annotations

import atexit
import logging
import threading

from kinv.agent.errors import JudgeFailed, WorkerCrashed, WorkerError
from kinv.agent.tools.worker import gate
from kinv.agent.tools.worker.client import WorkerProcess

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_JUDGES: dict[tuple, WorkerProcess] = {}
_CEILINGS: dict[tuple, dict] = {}


def _env(device: str) -> dict[str, str]:
    # the judge runs no Triton kernel: on CPU it needs no interpreter, and it never imports the kernel's module
    return {"TRITON_INTERPRET": "1"} if device == "cpu" else {}


def _judge(device: str, pythonpath: list[str] | None) -> tuple[tuple, WorkerProcess]:
    from kinv.kernels.adapter import import_path

    key = (device, tuple(pythonpath or ()), tuple(import_path()))  # a plugin imported since needs a judge that sees it
    with _LOCK:
        w = _JUDGES.get(key)
        if w is not None and w.proc.poll() is None:
            return key, w
        w = WorkerProcess(env=_env(device), label="judge", pythonpath=list(pythonpath or []))
        _JUDGES[key] = w
        return key, w


def _request(device: str, pythonpath: list[str] | None, op: str, **kwargs) -> dict:
    key, w = _judge(device, pythonpath)
    try:
        return w.request(op, timeout=900.0, **kwargs)
    except (WorkerCrashed, WorkerError) as exc:
        with _LOCK:
            _JUDGES.pop(key, None)
        w.close()
        raise JudgeFailed(f"the judge's process could not judge: {exc}") from None


def warm(device: str, pythonpath: list[str] | None = None) -> None:
    """Start the judge now (its imports overlap the work that follows); on the CPU only where this process could
    not judge itself (:func:`settle`)."""
    if device == "cpu" and not pythonpath:
        return
    _judge(device, pythonpath)


def kernel_modules(adapter) -> list[str]:
    """The modules of this process loaded from the kernel's live source files (what a source patch changes)."""
    import sys
    from pathlib import Path

    files = {str((adapter.root() / f).resolve()) for f in adapter.kernel_files}
    out = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if path and str(Path(path).resolve()) in files:
            out.append(name)
    return out


def _settle_here(kernel: str, result: dict) -> dict | None:
    """On the CPU, the judge may be this very process when it never imported the kernel's live source (the driver
    of a run does not: it plans, patches and stores): the same comparison, without a process of its own (a torch
    import is seconds on a small CPU).  ``None`` when this process has imported it, before or while judging (the
    reference reached the kernel's module): the judge's own process then judges."""
    import copy
    import os

    from kinv.agent.tools.worker import compare
    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter(kernel)
    if kernel_modules(adapter):
        return None
    got = compare.settle(adapter, copy.deepcopy(result), unlink=False)
    if kernel_modules(adapter):
        return None
    for e in result.get("levels", ()):
        if "pending" in e:
            try:
                os.unlink(e["pending"]["file"])
            except OSError:
                pass
    return got


def settle(kernel: str, result: dict, pythonpath: list[str] | None = None) -> dict:
    """A deferred check's result (:func:`kinv.agent.tools.worker.gate.check` with ``defer``), judged: the levels'
    references computed and compared in the judge.  A result with nothing deferred is returned as it is."""
    if not any("pending" in e for e in result.get("levels", ())):
        result.pop("n_levels", None)
        return result
    device = "cuda" if str(result.get("device", "cpu")).startswith("cuda") else "cpu"
    if device == "cpu" and not pythonpath:
        here = _settle_here(kernel, result)
        if here is not None:
            return here
    try:
        return _request(device, pythonpath, "settle", kernel=kernel, result=result)["result"]
    except JudgeFailed as exc:
        return gate.failed(result.get("seed", 0), result.get("device", device), str(exc), judge_failed=True)


def outputs(kernel: str, level: dict, saved: dict, pythonpath: list[str] | None = None) -> dict:
    """A worker's saved outputs (``saved``: its reply to set-up or verify: ``file`` and the ``sets`` it ran, each
    an input seed) judged against the reference of each input set: ``{"ok", "reason", "sets"}``."""
    return _request("cuda", pythonpath, "judge", kernel=kernel, level=level, saved=saved)


def ceilings(pythonpath: list[str] | None = None) -> dict:
    """The card's ceilings, measured once per run in the judge (a process no variant was imported into):
    ``{copy_gbps, yard_gbps, matrix_tflops: {dtype: TFLOP/s}, gpu, measured: True}``."""
    key = ("cuda", tuple(pythonpath or ()))
    if key not in _CEILINGS:
        _CEILINGS[key] = {**_request("cuda", pythonpath, "ceilings"), "measured": True}
        for k in ("ok", "op"):
            _CEILINGS[key].pop(k, None)
    return _CEILINGS[key]


def close() -> None:
    """Stop every judge (at the end of the run)."""
    with _LOCK:
        judges = list(_JUDGES.values())
        _JUDGES.clear()
    for w in judges:
        try:
            w.close()
        except Exception:  # noqa: BLE001 - closing at exit: a judge already gone is no error
            pass


atexit.register(close)

__all__ = [ "ceilings", "close", "kernel_modules", "outputs", "settle", "warm"]
