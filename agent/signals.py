"""SIGINT, SIGTERM and SIGHUP end a run the way Ctrl-C does: a KeyboardInterrupt that run_plan turns into revert,
``interrupted`` and exit 130.

A KeyboardInterrupt raised by a signal handler can be swallowed: Python reports and drops an exception raised
while it runs a finalizer (``__del__``, a weakref or GC callback) or an after-fork hook (logging's, at every
subprocess started), and the run would then go on to close out as if no signal had come.  So the handler also
records the signal, and :func:`check` (called at every event the graph emits: each step, each round) raises it
again until run_plan has handled it; the dropped one is not printed (no traceback), and the next signal raises.

The first signal stops the run; one that comes after it (a second Ctrl-C while the run reverts its kernel files)
is noted, not raised: raised, it would cut that cleanup short.  kinv's command line (:func:`take`) keeps the
signals after the run's handlers are restored: from the moment the run has closed (``closed``, ``interrupted``,
paused, failed) until the process is gone, exit hooks included (the kept workers and command servers being
stopped), a signal is noted and the exit code the run decided stands: no traceback, no death by the signal.

A SIGHUP or SIGINT the process inherited as ignored (``nohup kinv run ...``, a background job of a shell) stays
ignored: the person asked for the run to outlive the terminal.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from kinv.agent.errors import Interrupted

ROUTED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
AGAIN_S = 2.0  # while kinv exits: a signal this long after the first ends a hung exit at once, with its exit code


class _Signals:
    """The process's one handler of the routed signals, and what it knows.  An object, not module globals: its
    state stays readable while the interpreter tears its modules down at exit."""

    def __init__(self):
        self.pending: list[str] = []  # raised and not handled yet (check() raises it again)
        self.noted: list[int] = []  # came while stopping or closing: not raised
        self.layers = 0  # install()s not restored yet
        self.stopping = False  # a signal has raised: the process is on its way out, later ones are only noted
        self.closing = False  # kinv's command line: its run has closed (a run started after it clears this)
        self.exiting = False  # kinv's command line: its exit code is decided, the process is on its way out
        self.before: dict[int, object] | None = None  # the handlers when take() held them (None: not kinv's CLI)
        self.exit_code: int | None = None  # the exit code decided (exiting)
        self.exit_signal_at: float | None = None  # when the first signal came while exiting (time.monotonic())

    def __call__(self, signum, frame):
        if self.exiting:
            self._while_exiting(signum)
            return
        if self.closing or self.stopping:
            self.noted.append(signum)
            return
        if self.layers == 0:  # not held (a handler left behind): what the process did before kinv took the signal
            return self._as_before(signum, frame)
        self.stopping = True
        name = signal.Signals(signum).name
        self.pending.append(name)
        raise Interrupted(name)

    def _while_exiting(self, signum: int) -> None:
        """Noted; and a signal again, :data:`AGAIN_S` s or more after the first, when the exit hangs (a hook that
        waits on something stuck): the process ends at once with its exit code (its workers watch it and go)."""
        now = time.monotonic()
        if self.exit_signal_at is not None and now - self.exit_signal_at >= AGAIN_S and self.exit_code is not None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed or broken pipe: nothing more to say anyway
                    pass
            os._exit(self.exit_code)
        self.noted.append(signum)
        if self.exit_signal_at is None:
            self.exit_signal_at = now

    def _as_before(self, signum, frame):
        before = (self.before or {}).get(signum, signal.SIG_DFL)
        if callable(before):
            return before(signum, frame)
        if before == signal.SIG_IGN:
            return None
        signal.signal(signum, signal.SIG_DFL)  # the default action: end by the signal, as without kinv
        signal.raise_signal(signum)
        return None

    def reset(self) -> None:
        self.pending.clear()
        self.noted.clear()
        self.stopping = self.closing = self.exiting = False
        self.exit_code = self.exit_signal_at = None


_state = _Signals()


def _route(sig: signal.Signals, handler) -> object:
    """Put ``handler`` on ``sig``; returns the handler it replaced.  Raises ValueError off the main thread, and
    leaves an inherited SIG_IGN of SIGHUP or SIGINT alone (also raising ValueError)."""
    if sig != signal.SIGTERM and signal.getsignal(sig) is signal.SIG_IGN:
        raise ValueError("ignored since the process started")  # nohup, a background job: stays ignored
    return signal.signal(sig, handler)


def install():
    """Route SIGINT, SIGTERM and SIGHUP to :class:`Interrupted` (the first one; later ones are noted); returns
    a restorer (which also forgets a pending one)."""
    st = _state
    old = {}
    for sig in ROUTED:
        try:
            old[sig] = _route(sig, st)
        except (ValueError, OSError):  # not the main thread, not supported here, or ignored (nohup)
            pass
    old_hook = sys.unraisablehook
    if old:
        if st.layers == 0:  # a run starts: a signal stops it (on a command line whose earlier run has closed too)
            st.stopping = st.closing = False
        st.layers += 1
        sys.unraisablehook = _unraisable_hook(old_hook)

    def restore():
        handled()
        if getattr(sys.unraisablehook, "kinv_wraps", None) is old_hook:
            sys.unraisablehook = old_hook
        closing = False
        if old:
            st.layers -= 1
            if st.layers == 0:
                if st.before is not None:
                    closing = st.closing = True  # kinv's command line: the run has closed; its exit code stands
                else:
                    st.reset()
        for sig, handler in old.items():
            signal.signal(sig, st if closing else handler)

    return restore


def _unraisable_hook(old):
    """``sys.unraisablehook`` while a run holds the signals: an :class:`Interrupted` that Python drops (raised in
    a ``__del__``, a GC callback, an after-fork hook of logging's) is not printed with its traceback: it is
    pending, :func:`check` raises it at the next event, and the next signal raises again."""

    def hook(unraisable):
        if isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, Interrupted):
            _state.stopping = False  # it did not stop anything: a signal that comes next raises
            return
        old(unraisable)

    hook.kinv_wraps = old
    return hook


def take() -> Callable[..., None]:
    """kinv's command line holds SIGINT, SIGTERM and SIGHUP from the moment its run has closed (the run's own
    handlers restored) until the process is gone: each is noted only, the exit code decided standing.  Until
    then they act as they did (a read command, or a run not started yet, stops on Ctrl-C as any other).

    Returns ``release(exiting, code)``: ``exiting=True`` where the process ends with the command (the ``kinv``
    script, ``python -m``) and its exit ``code``: from there every signal is noted, the process's exit hooks
    (stopping the kept workers, the command servers) included, and one that comes again after :data:`AGAIN_S` s
    of a hung exit ends the process with ``code``; ``exiting=False`` (the command ran in a process that goes on):
    the handlers before are put back."""
    st = _state
    if st.before is not None or threading.current_thread() is not threading.main_thread():
        return lambda exiting=False, code=None: None  # already held (a command within a command), or cannot be here
    st.before = before = {sig: signal.getsignal(sig) for sig in ROUTED}
    # runs after the exit hooks registered from here on (the kept workers', the judge's, the command servers'):
    # atexit runs the last registered first
    atexit.unregister(_ignore_from_here)
    atexit.register(_ignore_from_here)

    def release(exiting: bool = False, code: int | None = None) -> None:
        if exiting:
            st.exiting, st.exit_code = True, code
            for sig in ROUTED:
                try:
                    _route(sig, st)
                except (ValueError, OSError):  # ignored since the process started: stays so
                    pass
            return
        for sig, handler in before.items():
            try:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
        st.before = None
        st.reset()

    return release


def _ignore_from_here() -> None:
    """The last exit hook of kinv's command line: once the hooks are done, Python puts every signal back to its
    default action before it tears its modules down (a second or more with torch loaded), and a signal then
    would end the process by it.  Ignored at the OS level instead: the process ends with its exit code."""
    if _state.exiting:
        for sig in ROUTED:
            if signal.getsignal(sig) is _state:
                signal.signal(sig, signal.SIG_IGN)


def check() -> None:
    """Raise a signal that came and was not handled yet (its first KeyboardInterrupt was swallowed)."""
    if _state.pending and threading.current_thread() is threading.main_thread():
        raise Interrupted(_state.pending[0])


def handled() -> None:
    _state.pending.clear()


def noted() -> bool:
    """Whether a signal came while the process was stopping or closing (the person wants it gone: hurry)."""
    return bool(_state.noted)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs (workers being stopped at exit are stopped, never
    left half-way by a KeyboardInterrupt or a death by SIGTERM): one that comes is acted on as the process's
    handler says once the block is over (meanwhile :func:`noted` says one came: workers are killed, not waited
    for).  On kinv's command line once it exits, signals are already noted only: nothing to hold."""
    st = _state
    if st.exiting or threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum, _frame):
        held.append(signum)
        st.noted.append(signum)

    old = {}
    for sig in ROUTED:
        try:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                old[sig] = signal.signal(sig, hold)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(held):  # what the process would have done, now that the block is over
            signal.raise_signal(signum)
