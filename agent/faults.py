"""Fault injection for the crash-safety tests: named points at every durable write.

``point(name)`` is called just before and just after each write that matters
for recovery (a store transaction, a backup, the journal intent, the kernel
file's ``os.replace``, the journal ``applied`` / ``reverted`` mark).  It does
nothing unless one of these is set in the environment (read once, at the
first call, so an unset hook costs one dict lookup):

``KINV_CRASH_AT=N``
    the N-th call in this process (1-based) kills the process with a real
    ``SIGKILL``: no ``finally``, no ``atexit``, no flush, exactly as an OOM
    kill or a pulled plug would.
``KINV_COUNT_POINTS=PATH``
    every call appends ``<n> <name>`` to PATH (written and closed before a
    ``KINV_CRASH_AT`` kill, so the last line names the point that killed it).
``KINV_STOP_AT=NAME``
    the first call of the point NAME stops the process with ``SIGSTOP`` (the
    test harness resumes it with ``SIGCONT``): a writer frozen at a known
    point, outside any transaction, for the concurrency tests.

Used by tests/agent/workstream/test_crash.py, tests/agent/cli/test_concurrency.py and
benchmarks/crash_harness.py.
"""

from __future__ import annotations

import os
import signal

from kinv.kernels.errors import BadInput

_config: tuple[int, str | None, str | None] | None = None
_count = 0
_stopped = False


def _load() -> tuple[int, str | None, str | None]:
    crash = os.environ.get("KINV_CRASH_AT", "").strip()
    if crash and not (crash.isascii() and crash.isdigit()):
        shown = crash if len(crash) <= 30 else crash[:30] + "..."
        raise BadInput(f"KINV_CRASH_AT={shown!r} is not a count: set it to the 1-based number of the fault point "
                       "to crash at (e.g. KINV_CRASH_AT=3), or unset it")
    return (int(crash) if crash else 0, os.environ.get("KINV_COUNT_POINTS") or None,
            os.environ.get("KINV_STOP_AT") or None)  # fmt: skip


def check_environment() -> None:
    """Refuse a bad fault-point variable as bad input before a command starts (it would otherwise surface at
    the first durable write, after the state dir was created)."""
    _load()


def point(name: str) -> None:
    """A fault point: count it, and crash or stop here if the environment asks for it."""
    global _config, _count, _stopped
    if _config is None:
        _config = _load()
    crash_at, count_path, stop_at = _config
    if not (crash_at or count_path or stop_at):
        return
    _count += 1
    if count_path:
        with open(count_path, "a") as f:
            f.write(f"{_count} {name}\n")
    if crash_at and _count == crash_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if stop_at == name and not _stopped:
        _stopped = True
        os.kill(os.getpid(), signal.SIGSTOP)


def reset() -> None:
    """Forget the environment read and the count (for in-process tests that change the variables)."""
    global _config, _count, _stopped
    _config, _count, _stopped = None, 0, False
