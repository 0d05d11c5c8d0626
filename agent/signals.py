"""SIGINT, SIGTERM and SIGHUP end a run the way Ctrl-C does: a KeyboardInterrupt that run_plan turns into revert,
``interrupted`` and exit 130.

A KeyboardInterrupt raised by a signal handler can be swallowed: Python reports and drops an exception raised
while it runs a finalizer (``__del__``, a weakref or GC callback), and the run would then go on to close out as
if no signal had come.  So the handler also records the signal, and :func:`check` (called at every event the
graph emits: each step, each round) raises it again until run_plan has handled it.

The first signal stops the run; one that comes after it (a second Ctrl-C while the run reverts its kernel files)
is noted, not raised: raised, it would cut that cleanup short.  kinv's command line (:func:`take`) keeps the
signals after the run's handlers are restored: from the moment the run has closed (``closed``, ``interrupted``,
paused, failed) until the process is gone, exit hooks included (the kept workers and command servers being
stopped), a signal is noted and the exit code the run decided stands: no traceback, no death by the signal.

A SIGHUP or SIGINT the process inherited as ignored (``nohup kinv run ...``, a background job of a shell) stays
ignored: the person asked for the run to outlive the terminal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

ROUTED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


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
        self.before: dict[int, object] | None = None  # the handlers take() replaced (None: not kinv's command line)

    def __call__(self, signum, frame):
        if self.exiting or self.closing or self.stopping:
            self.noted.append(signum)
            return
        if self.layers == 0:  # kinv's command line outside a run: what the process did before kinv took the signal
            return self._as_before(signum, frame)
        self.stopping = True
        name = signal.Signals(signum).name
        self.pending.append(name)
        raise Interrupted(name)

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
    if old:
        if st.layers == 0:  # a run starts: a signal stops it (on a command line whose earlier run has closed too)
            st.stopping = st.closing = False
        st.layers += 1

    def restore():
        handled()
        if old:
            st.layers -= 1
            if st.layers == 0:
                if st.before is not None:
                    st.closing = True  # kinv's command line: the run has closed; its exit code stands
                else:
                    st.reset()
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


def take() -> Callable[..., None]:
    """kinv's command line holds SIGINT, SIGTERM and SIGHUP for the whole command.  Outside a run they act as
    they did before (a read command stops on Ctrl-C as any other); once a run has closed, they are noted only.

    Returns ``release(exiting)``: ``exiting=True`` where the process ends with the command (the ``kinv`` script,
    ``python -m``): the handlers stay, and every signal until the process is gone (its exit hooks stopping the
    kept workers included) is noted only, the exit code decided standing; ``exiting=False`` (the command run in
    a process that goes on): the handlers before are put back."""
    st = _state
    if st.before is not None or threading.current_thread() is not threading.main_thread():
        return lambda exiting=False: None  # already held (a command within a command), or cannot be here
    before = {}
    for sig in ROUTED:
        try:
            before[sig] = _route(sig, st)
        except (ValueError, OSError):
            pass
    st.before = before

    def release(exiting: bool = False) -> None:
        if exiting:
            st.exiting = True
            return
        for sig, handler in before.items():
            signal.signal(sig, handler)
        st.before = None
        st.reset()

    return release


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
def deferred() -> Iterator[Callable[[], bool]]:
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs (workers being stopped at exit are stopped, never
    left half-way by a KeyboardInterrupt or a death by SIGTERM): one that comes is acted on as the process's
    handler says once the block is over.  Yields :func:`noted` (whether to hurry).  On kinv's command line once
    it closes, signals are already noted only: nothing to hold."""
    st = _state
    if st.exiting or threading.current_thread() is not threading.main_thread():
        yield noted
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
        yield noted
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(held):  # what the process would have done, now that the block is over
            signal.raise_signal(signum)
