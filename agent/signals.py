"""SIGTERM and SIGHUP end a run the way Ctrl-C does: a KeyboardInterrupt that run_plan turns into revert,
``interrupted`` and exit 130.

A KeyboardInterrupt raised by a signal handler can be swallowed: Python reports and drops an exception raised
while it runs a finalizer (``__del__``, a weakref or GC callback), and the run would then go on to close out as
if no signal had come.  So the handler also records the signal, and :func:`check` (called at every event the
graph emits: each step, each round) raises it again until run_plan has handled it.

A SIGHUP the process inherited as ignored (``nohup kinv run ...``) stays ignored: the person asked for the run
to outlive the terminal.
"""

from __future__ import annotations

import signal

_pending: list[str] = []


class Interrupted(KeyboardInterrupt):
    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


def install():
    """Route SIGTERM and SIGHUP to :class:`Interrupted`; returns a restorer (which also forgets a pending one)."""

    def raise_interrupt(signum, _frame):
        name = signal.Signals(signum).name
        _pending.append(name)
        raise Interrupted(name)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # nohup: a hang-up must not stop the run
            old[sig] = signal.signal(sig, raise_interrupt)
        except (ValueError, OSError):  # not the main thread, or not supported here
            pass

    def restore():
        handled()
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


def check() -> None:
    """Raise a signal that came and was not handled yet (its first KeyboardInterrupt was swallowed)."""
    import threading

    if _pending and threading.current_thread() is threading.main_thread():
        raise Interrupted(_pending[0])


def handled() -> None:
    _pending.clear()
