"""Signals while kinv exits: a SIGINT or SIGTERM that lands while a run closes (its exit hooks stopping the kept
workers), or a second one shortly after the first, still ends in at most one line and the run's own exit code:
0 when it had closed out, 130 when it was interrupted.  Never a traceback, never a death by the signal, never
a worker left behind.

The run is frozen inside its exit hooks with KINV_STOP_AT=pool.exit (agent/faults.py): the signals sent while
it is stopped are delivered the moment it continues, inside the hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.utils import replay_env

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"


@pytest.fixture
def env(tmp_path, state_dir):
    e = replay_env(tmp_path, state_dir, PYTHONUNBUFFERED="1")
    for k in ("KINV_CRASH_AT", "KINV_COUNT_POINTS", "KINV_STOP_AT"):
        e.pop(k, None)
    return e


class Run:
    """`kinv run` of #3a on replay in the background, its stdout and stderr read as they come."""

    def __init__(self, env: dict, **extra):
        self.proc = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "run", str(PLAN), "--backend", "replay",
                                      "--approval", "auto"], env={**env, **extra}, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(s, lines), daemon=True)
                         for s, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]  # fmt: skip
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def said(self) -> str:
        return "".join(self.out) + "\n--- stderr ---\n" + "".join(self.err)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in self.out):
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise AssertionError(f"the run never printed {text!r}:\n{self.said()}")
            time.sleep(0.02)

    def wait_stopped(self, timeout: float = 240) -> list[int]:
        """Wait until the run has frozen itself at its KINV_STOP_AT point; returns its child processes' pids."""
        deadline = time.time() + timeout
        while _state(self.proc.pid) != "T":
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise AssertionError(f"the run never stopped in its exit hooks:\n{self.said()}")
            time.sleep(0.02)
        kids = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            kids += [int(p) for p in (task / "children").read_text().split()]
        return kids

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        for t in self._readers:
            t.join(timeout=10)
        return rc, "".join(self.out), "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie or a gone one is not)."""
    return [p for p in pids if _state(p) not in (None, "Z", "X")]


def _signal_while_stopped(run: Run, *sigs: signal.Signals) -> list[int]:
    """Freeze the run in its exit hooks, queue ``sigs`` and let it go on: they land inside the hook."""
    kids = run.wait_stopped()
    assert kids, "the run keeps no worker at exit (the judge): this test would prove nothing\n" + run.said()
    for sig in sigs:
        run.proc.send_signal(sig)
    os.kill(run.proc.pid, signal.SIGCONT)
    return kids


@pytest.mark.slow  # whole runs on replay, frozen and signalled (python -m pytest -m slow)
@pytest.mark.parametrize("sigs", [(signal.SIGTERM,), (signal.SIGINT,), (signal.SIGTERM, signal.SIGINT)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM+SIGINT"])  # fmt: skip
def test_a_signal_while_a_closed_run_stops_its_workers_keeps_exit_0_and_stops_them(env, sigs):
    run = Run(env, KINV_STOP_AT="pool.exit")
    kids = _signal_while_stopped(run, *sigs)
    rc, out, err = run.finish()
    assert rc == 0, run.said()  # the run had closed out: not 130, not a death by the signal (-15, -2)
    assert "close-out:" in out and "Traceback" not in err, run.said()
    assert len(err.strip().splitlines()) <= 1, run.said()
    assert not _alive(kids), f"workers left running after kinv exited: {_alive(kids)}"


@pytest.mark.slow
def test_an_interrupted_run_signalled_again_in_its_exit_hooks_ends_in_one_line_and_130(env):
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    run = Run(env, KINV_STOP_AT="pool.exit")
    run.wait_for("V1: patched")
    run.proc.send_signal(signal.SIGTERM)
    kids = _signal_while_stopped(run, signal.SIGINT)
    rc, _out, err = run.finish()
    assert rc == 130, run.said()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted (SIGTERM)" in lines[0] and "kinv resume 3a" in lines[0], run.said()
    assert cfg.read_bytes() == before  # V1's patch is not left on disk
    assert not _alive(kids), f"workers left running after kinv exited: {_alive(kids)}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "second,delay", [(signal.SIGINT, 0.05), (signal.SIGTERM, 0.3)], ids=["SIGINT-50ms", "SIGTERM-300ms"]
)
def test_a_second_signal_shortly_after_the_first_still_ends_in_one_line_and_130(env, second, delay):
    """Ctrl-C pressed twice, or a supervisor's SIGTERM repeated: the second lands while the run reverts its patch
    or while it exits, and changes nothing the person sees."""
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    run = Run(env)
    run.wait_for("V1: patched")
    run.proc.send_signal(signal.SIGTERM)
    time.sleep(delay)
    run.proc.send_signal(second)
    rc, _out, err = run.finish()
    assert rc == 130, run.said()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted (SIGTERM)" in lines[0] and "Traceback" not in err, run.said()
    assert cfg.read_bytes() == before


def test_a_second_signal_while_the_run_stops_does_not_cut_its_revert_short():
    """The first signal stops the run; a second one while it reverts (Ctrl-C pressed twice) is noted, not raised
    into the middle of the revert."""
    from kinv.agent import signals

    restore = signals.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        signals.handled()  # run_plan's except: the revert begins
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # no KeyboardInterrupt here: the revert goes on
        assert signals.noted()  # and the workers still to stop are killed, not waited for
    finally:
        restore()
    assert not signals.noted()


def test_an_interrupt_python_drops_prints_no_traceback_and_the_next_signal_stops_the_run(capfd):
    """A signal whose KeyboardInterrupt lands in a finalizer or an after-fork hook (logging's, at each subprocess
    a run starts) is dropped by Python: no traceback for it, the run stops at its next event, and a signal sent
    again stops it at once."""
    import gc

    from kinv.agent import signals

    restore = signals.install()
    try:

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)

        Finalized()
        gc.collect()
        assert "Traceback" not in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            signals.check()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        restore()
