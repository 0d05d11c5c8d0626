"""Worker processes kept between the requests of one run: benchmark workers between a workstream's arms (env
check, A/A, A/Bs; a campaign's screenings and confirmations), and on CPU the correctness checks of a run.

A worker is kept under what fixed it when it started: its environment, the import path in front of kinv (a
baseline snapshot, a plugin's folder) and the kernel source on disk.  A source patch therefore never meets a
worker that imported the source before it.  A kept worker holds its CUDA context and compiled kernels, not its
buffers: an arm's levels are dropped when the arm closes, and every sample re-draws its memory placement.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from kinv.agent import faults, signals
from kinv.agent.errors import WorkerCrashed, WorkerError
from kinv.agent.tools.worker.client import WorkerProcess
from kinv.agent.tools.worker.hashes import kernel_source_hash
from kinv.kernels.adapter import get_adapter, import_path

log = logging.getLogger(__name__)

REUSE_ENV = "KINV_REUSE_WORKERS"  # "0": every arm and check starts a process of its own (to measure what reuse saves)
MAX_IDLE = 8  # workers kept in one pool; beyond, the oldest is stopped
MAX_IDLE_S = 600.0  # a worker idle longer is stopped at the next take


def reuse() -> bool:
    return os.environ.get(REUSE_ENV, "1") != "0"


class WorkerPool:
    """Idle workers by key; one caller at a time holds a worker it took (thread-safe: a campaign's threads and
    an MCP server's requests share a pool)."""

    def __init__(self):
        self._idle: list[tuple[tuple, WorkerProcess, float]] = []  # (key, worker, kept since)
        self._lock = threading.Lock()
        self.started = 0
        self.reused = 0

    def take(self, key: tuple) -> WorkerProcess | None:
        while True:
            now = time.time()
            with self._lock:
                stale = [x for x in self._idle if now - x[2] > MAX_IDLE_S]
                for x in stale:
                    self._idle.remove(x)
                # a worker that has answered a request is ready; one started ahead of time ("warm") may still be
                # importing
                mine = sorted((x for x in self._idle if x[0] == key), key=lambda x: x[1].label == "warm")
                if mine:
                    self._idle.remove(mine[0])
            for x in stale:
                x[1].close()  # a long-lived process (an MCP server) does not hold GPU contexts it no longer uses
            if not mine:
                return None
            w = mine[0][1]
            if w.proc.poll() is None:
                self.reused += w.label != "warm"
                return w
            w.close()  # died while kept: try the next one

    def take_any(self) -> tuple[tuple, WorkerProcess] | None:
        """A ready worker of any key, with its key, for a request that depends on none (the GPU's copy
        bandwidth): the one kept last."""
        while True:
            with self._lock:
                ready = [x for x in self._idle if x[1].label != "warm"]
                if not ready:
                    return None
                x = ready[-1]
                self._idle.remove(x)
            if x[1].proc.poll() is None:
                return x[0], x[1]
            x[1].close()

    def count(self, key: tuple) -> int:
        with self._lock:
            return sum(1 for k, *_ in self._idle if k == key)

    def give(self, key: tuple, worker: WorkerProcess) -> None:
        if worker.proc.poll() is not None:
            worker.close()
            return
        with self._lock:
            self._idle.append((key, worker, time.time()))
            over = []
            while len(self._idle) > MAX_IDLE:
                over.append(self._idle.pop(0)[1])
        for w in over:
            w.close()

    def close(self) -> None:
        """Stop every kept worker.  One interrupted while it stops is killed, and the others are stopped before
        the interruption goes on."""
        with self._lock:
            idle, self._idle = self._idle, []
        try:
            for _k, w, _since in idle:
                w.close()
        finally:
            for _k, w, _since in idle:
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
                    w.close()


POOL = WorkerPool()  # benchmark workers (one GPU per process)
CHECKERS = WorkerPool()  # CPU correctness checks (the Triton interpreter)


def close_at_exit() -> None:
    """The process's exit hook: stop the kept workers.  A signal that comes meanwhile cannot cut it short: kinv's
    command line notes it (the exit code its run decided stands, with no traceback); elsewhere it is held until
    the workers are stopped.  Either way it hurries them: killed, not waited for (WorkerProcess.close)."""
    with signals.deferred():
        # not a write: the process is exiting, its kept workers still alive (the judge's too, stopped by its own
        # exit hook); KINV_STOP_AT=pool.exit freezes it here for tests/agent/cli/test_exit_signals.py
        faults.point("pool.exit")
        CHECKERS.close()
        POOL.close()


atexit.register(close_at_exit)


def worker_key(kernel: str, env: dict[str, str], pythonpath: list[str] | None) -> tuple:
    """What a worker's start fixes, and a later request must share to take it: the environment, the folders in
    front of kinv on its import path (a baseline snapshot, a plugin's folder) and the kernel's source on disk."""
    return (tuple(sorted(env.items())), tuple(pythonpath or ()), tuple(import_path()),
            kernel_source_hash(get_adapter(kernel)))


def check_in_worker(pool: WorkerPool, kernel: str, config: dict, levels: list, *, seed: int, device: str,
                    env: dict, pythonpath: list[str] | None = None) -> dict:  # fmt: skip
    """The correctness gate in a worker of ``pool`` (a kept one when there is one), as crash-isolated as a check
    in a process of its own: a crash or hang ends that worker only, and a worker whose check did not pass is
    never kept.  On CPU the worker runs the Triton interpreter."""
    from kinv.agent.tools.worker import gate

    env_s = {k: str(v) for k, v in env.items()}
    if device == "cpu":
        env_s["TRITON_INTERPRET"] = "1"
    key = worker_key(kernel, env_s, pythonpath)
    t0 = time.perf_counter()
    worker = pool.take(key)
    if worker is None:
        worker = WorkerProcess(env=env_s, label="check", pythonpath=pythonpath)
        pool.started += 1
    worker.label = "check"  # it has answered once it is given back: an arm then takes it before a warm one
    try:
        result = worker.request("check", timeout=gate.CHECK_TIMEOUT_S, kernel=kernel, config=config,
                                levels=[lv.to_dict() for lv in levels], seed=seed, device=device)["result"]  # fmt: skip
    except WorkerCrashed as exc:
        worker.close()
        return gate.failed(seed, device, f"crashed: the check process died ({exc})", crashed=True)
    except WorkerError as exc:
        worker.close()
        return gate.failed(seed, device, f"the check failed: {exc}")
    except BaseException:  # interrupted mid-check (a signal): the worker, busy with it, is stopped now, not at exit
        worker.proc.kill()
        worker.close()
        raise
    log.info("check of %d level(s) in worker pid %d: %.2f s", len(levels), worker.pid, time.perf_counter() - t0)
    if result.get("ok") or result.get("ok") is None:  # passed, or launched and left to the judge
        pool.give(key, worker)
    else:
        worker.close()
    return result
