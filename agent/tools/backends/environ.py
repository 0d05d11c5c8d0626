"""The environment of a live process, read from ``/proc/PID/environ`` (its environment at exec time): what the env
check compares with a plan's (agent/tools/measure/envcheck.py), and what the command backend reads of the process it
measures."""

from __future__ import annotations

import os
import time

from kinv.kernels.errors import BadInput

EMPTY_RETRIES = 25


def proc_environ(pid: int) -> dict[str, str]:
    """The environment of a live process (Linux ``/proc/PID/environ``: its environment at exec time)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 1:
        raise BadInput(f"pid={pid!r} is invalid: must be a positive integer process id")
    path = f"/proc/{pid}/environ"
    try:
        raw = _read(path)
        for _ in range(EMPTY_RETRIES):  # a process caught in exec reads empty for a moment
            if raw:
                break
            time.sleep(0.02)
            raw = _read(path)
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            raise BadInput(f"cannot read the environment of pid {pid}: no /proc here (Linux only)") from None
        raise BadInput(f"no process with pid {pid}; give the pid of a running worker") from None
    except PermissionError:
        raise BadInput(f"cannot read {path}: permission denied (the process belongs to another user)") from None
    except OSError as exc:  # e.g. ESRCH when the process exits while being read
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
