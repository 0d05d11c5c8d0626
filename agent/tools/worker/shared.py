"""What a benchmark worker and the judge share: the outputs a worker hands over to be judged, and the yardstick.

A worker hands over its outputs without files: on a GPU the outputs are copied into buffers of the harness's own
and passed to the judge as CUDA IPC handles (``torch.multiprocessing``'s reductions, the mechanism its queues
use), so the judge reads them where they lie, in device memory, and compares there.  The worker keeps the copies
alive until its next request (the driver asks nothing of it while the judge reads).  On the CPU, or where IPC is
refused, the outputs go through a temporary file, as before.

Imports: the standard library and torch only.
"""

from __future__ import annotations

import base64
import os

YARD_MIB = 256  # the yardstick: a device copy of this size, timed in every sample with the sample's own events
YARD_REPS = 3


def yardstick(reps: int = YARD_REPS, mib: int = YARD_MIB, bufs: list | None = None) -> list[float]:
    """GB/s of ``reps`` device copies of ``mib`` MiB, each timed by its own pair of events (the timer under test)."""
    import torch

    bufs = [] if bufs is None else bufs
    if not bufs:  # kept by the caller between samples: the yardstick allocates nothing in a timed sample
        src = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda").random_(0, 255)
        bufs.extend([src, torch.empty_like(src)])
    src, dst = bufs[0], bufs[1]
    dst.copy_(src)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        dst.copy_(src)
        e.record()
    torch.cuda.synchronize()
    return [2 * src.numel() / (s.elapsed_time(e) / 1000) / 1e9 for s, e in events]


def to(out, device: str):
    """``out`` (a tensor, or a list/tuple of them) on ``device``."""
    if isinstance(out, list | tuple):
        return type(out)(to(o, device) for o in out)
    return out.to(device) if hasattr(out, "to") else out


def empty_like(out):
    """An empty output shaped like one launch's (a tensor, or a list/tuple of them: every output is timed and
    checked)."""
    import torch

    if isinstance(out, list | tuple):
        return type(out)(empty_like(o) for o in out)
    return torch.empty_like(out)


def save(outs: list, sets: list[dict]) -> dict:
    """Outputs (on the CPU) in a temporary file for the judge: ``{"file", "sets"}``, one input-set spec per
    output."""
    import tempfile

    import torch

    fd, path = tempfile.mkstemp(prefix="kinv-outputs-", suffix=".pt")
    os.close(fd)
    torch.save([to(o, "cpu") for o in outs], path)
    return {"file": path, "sets": sets}


def share(outs: list, sets: list[dict]) -> dict:
    """Device outputs handed over as CUDA IPC handles: ``{"ipc", "sets"}``; the caller keeps ``outs`` alive until
    the judge has read them.  Outputs on the CPU (or a refusal of IPC) go through :func:`save`."""
    import torch

    if not all(t.is_cuda for t in _tensors(outs)):
        return save(outs, sets)
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers the CUDA tensor reductions with the forking pickler

    try:
        data = bytes(ForkingPickler.dumps(outs))
    except (RuntimeError, TypeError) as exc:  # IPC refused on this device or allocator: the file way
        out = save(outs, sets)
        out["ipc_refused"] = str(exc).splitlines()[0][:200]
        return out
    torch.cuda.synchronize()  # the copies are complete before the judge maps them
    return {"ipc": base64.b64encode(data).decode("ascii"), "sets": sets}


def load(saved: dict):
    """The outputs of :func:`share` or :func:`save` in this process (the judge): mapped over IPC where they were
    shared, read (and the file removed) where they were saved."""
    import torch

    if "ipc" in saved:
        import pickle

        import torch.multiprocessing  # noqa: F401 - the rebuild functions the pickle names

        return pickle.loads(base64.b64decode(saved["ipc"]))
    try:
        return torch.load(saved["file"], weights_only=True)
    finally:
        try:
            os.unlink(saved["file"])
        except OSError:
            pass


def _tensors(x) -> list:
    if isinstance(x, list | tuple):
        return [t for o in x for t in _tensors(o)]
    return [x] if hasattr(x, "is_cuda") else []


__all__ = ["YARD_MIB", "YARD_REPS", "empty_like", "load", "save", "share", "to", "yardstick"]
