"""Nothing else on the GPU while an arm is timed.

Two lines of defence, both in the driver (the process that never imports a variant):

* :func:`paused`: every other process kinv started (the other arm's worker, kept workers, the judge, a check's
  process) is stopped with SIGSTOP for the length of a sample, and continued after it.  Each is the leader of
  a process group of its own (:func:`kinv.agent.tools.worker.client.child_spawn`), and the whole group is
  stopped, so a child a variant's worker started is stopped with it.  A stopped child still dies with the run
  (PR_SET_PDEATHSIG sends SIGKILL, which a stopped process cannot hold off).
* :class:`Watch`: the device's per-process utilization (NVML, the library nvidia-smi reads) over the sample:
  any process other than the timed worker that ran work on the GPU meanwhile is named; the sample is timed
  again, and a level whose samples keep seeing one is voided.  NVML samples utilization every few tens of
  milliseconds, so a burst shorter than that can slip through: this is the second line, the pause the first.

Imports: the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time

log = logging.getLogger(__name__)


@contextlib.contextmanager
def paused(pids):
    """Stop the process groups led by ``pids`` (SIGSTOP) for the length of the block, then continue them
    (SIGCONT), whatever happens in the block.  Groups already gone are skipped."""
    stopped = []
    try:
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGSTOP)
                stopped.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        yield stopped
    finally:
        for pid in stopped:
            try:
                os.killpg(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass


class _Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]  # fmt: skip


NVML_SUCCESS, NVML_ERROR_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE = 0, 6, 7


class Watch:
    """Per-process GPU utilization on device ``index`` since a moment, from NVML; ``available`` is False (and
    :meth:`active` returns ``None``) where there is no NVML (no GPU, no driver)."""

    def __init__(self, index: int = 0):
        self.available = False
        self.why = ""
        try:
            self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self._nvml.nvmlInit_v2() != NVML_SUCCESS:
                raise OSError("nvmlInit_v2 failed")
            self._dev = ctypes.c_void_p()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            idx = int(visible) if visible.isdigit() else index
            if self._nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(idx), ctypes.byref(self._dev)) != NVML_SUCCESS:
                raise OSError(f"no NVML handle for device {idx}")
            self.available = True
        except (OSError, AttributeError) as exc:
            self.why = f"NVML not available ({exc})"

    @staticmethod
    def now_us() -> int:
        return int(time.time() * 1e6)

    def active(self, since_us: int) -> dict[int, int] | None:
        """``{pid: highest SM utilization %}`` of the processes NVML saw running work on the device since
        ``since_us`` (microseconds since the epoch), or ``None`` where NVML cannot say."""
        if not self.available:
            return None
        count = ctypes.c_uint(0)
        rc = self._nvml.nvmlDeviceGetProcessUtilization(self._dev, None, ctypes.byref(count),
                                                        ctypes.c_ulonglong(since_us))  # fmt: skip
        if rc == NVML_ERROR_NOT_FOUND:
            return {}
        if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
            return None
        buf = (_Sample * max(count.value, 1))()
        rc = self._nvml.nvmlDeviceGetProcessUtilization(self._dev, buf, ctypes.byref(count), ctypes.c_ulonglong(since_us))
        if rc == NVML_ERROR_NOT_FOUND:
            return {}
        if rc != NVML_SUCCESS:
            return None
        out: dict[int, int] = {}
        for s in buf[: count.value]:
            if s.timeStamp >= since_us and s.smUtil > 0:
                out[s.pid] = max(out.get(s.pid, 0), int(s.smUtil))
        return out


def foreign(active: dict[int, int] | None, timed_pid: int) -> str:
    """What ran beside the timed worker, in words ("" when nothing did or NVML cannot say).  Where the timed
    worker's pid is among those NVML names, every other pid is foreign; where it is not (NVML reports the host's
    pids, a container has its own), more than one active process is."""
    if not active:
        return ""
    if timed_pid in active:
        others = {p: u for p, u in active.items() if p != timed_pid}
    else:
        others = dict(sorted(active.items(), key=lambda kv: -kv[1])[1:]) if len(active) > 1 else {}
    if not others:
        return ""
    return "other GPU work during the sample: " + ", ".join(f"pid {p} at {u}% SM" for p, u in sorted(others.items()))


__all__ = ["Watch", "foreign", "paused"]
