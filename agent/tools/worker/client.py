"""Talk to a benchmark worker subprocess (standard library only).

One :class:`WorkerProcess` per variant: it is started with the variant's own
environment (the plan's ``environment:``, checked) and keeps its compiled kernels and
captured graphs between samples, so a sample costs one pipe round trip beyond
the GPU time itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from kinv import IMPORT_ROOT
from kinv.agent.errors import WorkerCrashed, WorkerError

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or the installed kinv/): the worker's cwd


LIVE: weakref.WeakSet[WorkerProcess] = None  # set below: every worker this process started and has not closed


def live_pids(but=None) -> list[int]:
    """The pids (each a process group's leader) of the workers this process started that still run, but ``but``."""
    return [w.proc.pid for w in list(LIVE) if w is not but and w.proc.poll() is None]


CLOSE_WAIT_S = 10.0  # a worker asked to exit is killed when it has not within this
PARENT_ENV = "KINV_PARENT_PID"  # the pid a child of a run watches: when it is gone, so is the child


def _die_with(parent: int, main_thread: bool):
    """The child side of :func:`child_spawn`: runs in the forked child before exec."""

    def preexec():
        if main_thread and sys.platform.startswith("linux"):
            try:  # the kernel kills this child when the run that started it dies, even by SIGKILL
                import ctypes
                import signal

                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
            except (OSError, AttributeError):
                pass  # the child's own watch on its parent (watch_parent) still ends it
        if os.getppid() != parent:  # the run died between fork and here
            os._exit(1)

    return preexec


def child_spawn() -> tuple[dict, dict]:
    """Popen keyword arguments and environment for a child of a run (a benchmark worker, a correctness check):
    its own process group (a terminal's Ctrl-C reaches the run, which stops its children itself), killed by the
    kernel when the run dies (PR_SET_PDEATHSIG, armed only from the main thread: it fires when the spawning
    thread ends), and told the run's pid, which it watches (:func:`watch_parent`).  No child outlives its run."""
    import threading

    parent = os.getpid()
    main = threading.current_thread() is threading.main_thread()
    return {"preexec_fn": _die_with(parent, main), "process_group": 0}, {PARENT_ENV: str(parent)}


def watch_parent(every: float = 0.5) -> None:
    """In a child of a run: exit as soon as the run that started it is gone (its parent pid changes)."""
    import threading

    want = os.environ.get(PARENT_ENV, "")
    if not want.isdigit():
        return
    parent = int(want)
    if os.getppid() != parent:
        os._exit(1)

    def watch():
        while True:
            time.sleep(every)
            if os.getppid() != parent:
                os._exit(1)  # the run died: nobody reads what this child would compute

    threading.Thread(target=watch, daemon=True, name="kinv-watch-parent").start()


class WorkerProcess:
    def __init__(self, env: dict[str, str] | None = None, label: str = "worker", python: str | None = None,
                 pythonpath: list[str] | None = None):  # fmt: skip
        self.label = label
        full_env = {k: v for k, v in os.environ.items()}
        full_env.update(env or {})
        from kinv.kernels.adapter import import_path

        # after the snapshot and kinv itself: the folders the CLI imported a package.module:Class adapter from
        paths = [*(pythonpath or []), IMPORT_ROOT, full_env.get("PYTHONPATH", ""), *import_path()]
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.started = time.time()
        spawn, child_env = child_spawn()
        full_env.update(child_env)
        # -P: the cwd (a checkout holding the live, possibly patched, package) must not come before a
        # baseline snapshot on PYTHONPATH
        self.proc = subprocess.Popen(
            [python or sys.executable, "-P", "-m", "kinv.agent.tools.worker.bench_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=full_env, cwd=str(ROOT), **spawn,
        )  # fmt: skip
        LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, op: str, timeout: float | None = None, **kwargs) -> dict:
        """One request and its reply.  ``timeout``: seconds after which the worker is killed (a hang), which the
        caller then reads as a :class:`WorkerCrashed` whose message says so."""
        if timeout is None:
            return self._request(op, **kwargs)
        import threading

        timer = threading.Timer(timeout, self.proc.kill)
        timer.daemon = True  # a timer a signal kept from being cancelled must not hold the process's exit
        try:
            timer.start()
            return self._request(op, **kwargs)
        except WorkerCrashed as exc:
            if timer.finished.is_set():
                raise WorkerCrashed(f"{self.label} worker did not answer {op!r} within {timeout:g} s (hang?)") from exc
            raise
        finally:
            timer.cancel()

    def _request(self, op: str, **kwargs) -> dict:
        if self.proc.poll() is not None:
            raise WorkerCrashed(self._death(f"{self.label} worker is not running"))
        try:
            self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerCrashed(self._death(f"{self.label} worker closed its input")) from None
        line = self.proc.stdout.readline()
        if not line:
            raise WorkerCrashed(self._death(f"{self.label} worker died during {op!r}"))
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise WorkerCrashed(f"{self.label} worker broke protocol: {line[:200]!r}") from None
        if not reply.get("ok"):
            if self.proc.poll() is not None or "illegal memory access" in reply.get("error", ""):
                self.close()
                raise WorkerCrashed(f"{self.label} worker failed fatally during {op!r}: {reply.get('error')}")
            raise WorkerError(reply.get("error", "unknown error"))
        return reply

    def _death(self, what: str) -> str:
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        err = (self.proc.stderr.read() or "").strip().splitlines()
        tail = next((ln for ln in reversed(err) if ln.strip()), "")
        rc = self.proc.returncode
        sig = f" (signal {-rc})" if rc is not None and rc < 0 else ""
        return f"{what}: exit code {rc}{sig}" + (f"; last stderr line: {tail[:300]}" if tail else "")

    def close(self, hurry: Callable[[], bool] | None = None) -> None:
        """Stop the worker: ask it to exit and wait for it, killing it after :data:`CLOSE_WAIT_S` s, at once
        when ``hurry()`` turns true (by default: a signal came while the run stops or exits, see
        :func:`kinv.agent.signals.noted`), or when the wait is interrupted (the interruption then goes on): never
        left running."""
        if hurry is None:
            from kinv.agent import signals

            hurry = signals.noted
        try:
            if self.proc.poll() is None:
                try:
                    if hurry():
                        raise TimeoutError
                    self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                    self.proc.stdin.flush()
                    self._wait_exit(hurry)
                except BaseException as exc:
                    self.proc.kill()
                    self.proc.wait()
                    if not isinstance(exc, Exception):
                        raise
        finally:
            LIVE.discard(self)
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    stream.close()
                except Exception:
                    pass

    def _wait_exit(self, hurry: Callable[[], bool]) -> None:
        """Wait for the worker to exit; TimeoutExpired after CLOSE_WAIT_S s, TimeoutError once ``hurry()``."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        while True:
            try:
                self.proc.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
                if hurry():
                    raise TimeoutError from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


LIVE = weakref.WeakSet()
