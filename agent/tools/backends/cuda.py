"""The cuda backend: each arm is a worker subprocess with its own environment and config
(agent/tools/bench_worker.py): CUDA-graph replay, L2 rotation, correctness before timing, crash isolation."""

from __future__ import annotations

import atexit
import logging
import os
import time
from pathlib import Path

from kinv.agent.tools import correctness, protocol
from kinv.agent.tools.backends.base import RECORDINGS, Arm, Backend, NoDevice, VariantFailed, gpu_visible, kernel_hash
from kinv.agent.tools.worker_client import WorkerCrashed, WorkerError, WorkerProcess
from kinv.kernels.adapter import Level, import_path


def _recorded() -> str:
    """What replay serves, by its recordings' folders (``kernels/recordings/<gpu>/``): "the samples recorded on
    h200 (kernels/recordings/h200/)"."""
    gpus = sorted(d.name for d in RECORDINGS.iterdir() if d.is_dir()) if RECORDINGS.is_dir() else []
    where = ", ".join(f"{RECORDINGS.parent.name}/{RECORDINGS.name}/{g}/" for g in gpus)
    return f"the samples recorded on {', '.join(gpus)} ({where})" if gpus else "recorded samples (KINV_RECORDINGS)"

log = logging.getLogger(__name__)

REUSE_ENV = "KINV_REUSE_WORKERS"  # "0": every arm starts a worker of its own (the way to measure what reuse saves)
MAX_IDLE = 8  # workers kept between arms; beyond, the oldest is stopped
MAX_IDLE_S = 600.0  # a worker idle longer is stopped at the next arm's start


class WorkerPool:
    """Benchmark workers kept between the arms of one process's measurements (a workstream's env check, A/A and
    A/Bs; a campaign's screenings and confirmations).  A worker is kept under what fixed it when it started: its
    environment, the import path in front of kinv (a baseline snapshot) and the kernel source on disk.  A source
    patch therefore never meets a worker that imported the source before it.  A kept worker holds its CUDA
    context and compiled kernels, not its buffers: an arm's levels are dropped when the arm closes, and every
    sample re-draws its memory placement as before."""

    def __init__(self):
        self._idle: list[tuple[tuple, WorkerProcess, float]] = []  # (key, worker, kept since)
        self.started = 0
        self.reused = 0

    def take(self, key: tuple) -> WorkerProcess | None:
        now = time.time()
        for x in [x for x in self._idle if now - x[2] > MAX_IDLE_S]:
            self._idle.remove(x)
            x[1].close()  # a long-lived process (an MCP server) does not hold GPU contexts it no longer uses
        # a worker that has answered a request is ready; one started ahead of time ("warm") may still be importing
        mine = sorted((x for x in self._idle if x[0] == key), key=lambda x: x[1].label == "warm")
        for x in mine:
            self._idle.remove(x)
            w = x[1]
            if w.proc.poll() is None:
                self.reused += w.label != "warm"
                return w
            w.close()
        return None

    def take_any(self) -> tuple[tuple, WorkerProcess] | None:
        """A ready worker of any key, with its key, for a request that depends on none (the GPU's copy
        bandwidth): the one kept last."""
        for x in reversed([x for x in self._idle if x[1].label != "warm"]):
            self._idle.remove(x)
            if x[1].proc.poll() is None:
                return x[0], x[1]
            x[1].close()
        return None

    def count(self, key: tuple) -> int:
        return sum(1 for k, *_ in self._idle if k == key)

    def give(self, key: tuple, worker: WorkerProcess) -> None:
        if worker.proc.poll() is not None:
            worker.close()
            return
        self._idle.append((key, worker, time.time()))
        while len(self._idle) > MAX_IDLE:
            self._idle.pop(0)[1].close()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for _k, w, _since in idle:
            w.close()


POOL = WorkerPool()
atexit.register(POOL.close)


def worker_key(kernel: str, env: dict[str, str], pythonpath: list[str] | None) -> tuple:
    """What a worker's start fixes, and a later arm must share to take it: the environment, the folders in
    front of kinv on its import path (a baseline snapshot, a plugin's folder) and the kernel's source on disk."""
    return (tuple(sorted(env.items())), tuple(pythonpath or ()), tuple(import_path()), kernel_hash(kernel))


class CudaArm(Arm):
    def __init__(self, name, kernel, config, env, pythonpath=None, pool: WorkerPool | None = None):
        super().__init__(name=name, kernel=kernel, config=config, env=env)
        env_s = {k: str(v) for k, v in env.items()}
        self._key = worker_key(kernel, env_s, pythonpath)
        on_disk = self._key[-1]
        # a baseline snapshot is named by its kernel hash: the worker must have imported that very source; a
        # live arm's worker must have imported the source on disk now (a kept worker: before any patch since)
        self.expect_kernel = Path(pythonpath[0]).name if pythonpath else on_disk
        self._pool = pool
        self._failed = False
        self._n = 0
        self._gpu_s = self._req_s = self._reset_s = 0.0
        t0 = time.perf_counter()
        kept = pool.take(self._key) if pool is not None else None
        if kept is None:
            self.worker = WorkerProcess(env=env_s, label=name, pythonpath=pythonpath)
            if pool is not None:
                pool.started += 1
        elif kept.label == "warm":
            self.worker, self.worker.label, kept = kept, name, None  # started for this arm ahead of time: new
        else:
            self.worker, self.worker.label = kept, name
        try:
            hello = self.worker.request("hello", env_keys=sorted(env))
        except (WorkerCrashed, WorkerError) as exc:
            self.worker.close()
            raise VariantFailed(f"{name}: worker failed to start: {exc}") from None
        self.fingerprint = hello["fingerprint"]
        self.env_seen = hello["env"]
        self.harness = hello["harness_hash"]
        self.worker_pid = hello["pid"]
        self.reused = kept is not None
        log.info("arm %s: %s worker pid %d ready in %.2f s", name, "kept" if kept else "new", self.worker_pid,
                 time.perf_counter() - t0)  # fmt: skip

    def _fail(self, message: str) -> VariantFailed:
        self._failed = True  # a worker that failed an arm is not kept for another
        return VariantFailed(message)

    def setup(self, level: Level) -> dict:
        try:
            s = self.worker.request("setup", kernel=self.kernel, config=self.config, level=level.to_dict())
        except WorkerCrashed as exc:
            raise self._fail(f"{self.name} crashed during set-up at {level.key}: {exc}") from None
        except WorkerError as exc:
            raise self._fail(f"{self.name} failed at {level.key}: {exc}") from None
        if s.get("kernel_hash") != self.expect_kernel:
            where = "the baseline snapshot" if self._key[1] else "the source on disk"
            raise self._fail(f"{self.name} imported kernel source {s.get('kernel_hash')}, not {where} "
                             f"{self.expect_kernel}" + (": the snapshot did not shadow the live package"
                                                        if self._key[1] else ""))  # fmt: skip
        if not s["correct"]:
            raise self._fail(
                f"{self.name} is incorrect at {level.key}: {s['mismatched']} elements off, rel err {s['rel_err']:.2e}"
            )
        self.setups[level.key] = s
        log.info("arm %s: set up %s in %s s (compile %s s)", self.name, level.key, s.get("setup_s"), s.get("compile_s"))
        return s

    def sample(self, level: Level, round_index: int) -> dict:
        s = self.setups.get(level.key) or self.setup(level)
        t0 = time.perf_counter()
        try:
            r = self.worker.request("sample", key=s["key"], seed=protocol.round_seed(round_index))
        except (WorkerCrashed, WorkerError) as exc:
            raise self._fail(f"{self.name} failed while sampling {level.key}: {exc}") from None
        r["request_wall_s"] = time.perf_counter() - t0
        r["derived_env"] = s["derived_env"]
        r["harness_hash"] = self.harness
        self._n += 1
        self._gpu_s += r.get("gpu_s") or 0.0
        self._req_s += r["request_wall_s"]
        self._reset_s += r.get("reset_s") or 0.0
        return r

    def close(self) -> None:
        if self._n:
            log.info("arm %s: %d samples, %.2f GPU s in %.2f s of requests (memory re-set %.2f s)", self.name,
                     self._n, self._gpu_s, self._req_s, self._reset_s)  # fmt: skip
        keep = self._pool is not None and not self._failed and self.worker.proc.poll() is None
        if keep:
            try:  # the arm's buffers and graphs go; the process, its context and compiled kernels stay
                for s in self.setups.values():
                    self.worker.request("drop", key=s["key"])
            except (WorkerCrashed, WorkerError):
                keep = False
        self.setups = {}
        if keep:
            self._pool.give(self._key, self.worker)
        else:
            self.worker.close()


class CudaBackend(Backend):
    name = "cuda"
    loud = "CUDA backend: measuring live on this machine's GPU"

    def __init__(self):
        if not gpu_visible():
            raise NoDevice(f"--backend cuda: no CUDA GPU visible; use --backend replay to serve {_recorded()}")
        self._copy = None
        # one pool per process (one GPU): a campaign's screenings and its workstreams keep workers for each other
        self.pool = POOL if os.environ.get(REUSE_ENV, "1") != "0" else None

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant") -> Arm:
        return CudaArm(name, kernel, config, env, pythonpath, pool=self.pool)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def warm(self, kernel: str, env: dict, n: int) -> None:
        if self.pool is None:
            return
        env_s = {k: str(v) for k, v in env.items()}
        key = worker_key(kernel, env_s, None)
        for _ in range(n - self.pool.count(key)):  # a worker's imports and CUDA context start in its own process
            self.pool.started += 1
            self.pool.give(key, WorkerProcess(env=env_s, label="warm"))

    def check(self, kernel, config, levels, *, seed, device, env, pythonpath=None) -> dict:
        """The check in a benchmark worker of the arms that follow (a kept one when there is one): the worker
        starts once and has compiled the config before it is timed.  Crash-isolated as before: a crash or hang
        ends that worker only, and a worker whose check did not pass is never kept."""
        if self.pool is None or device != "cuda":
            return super().check(kernel, config, levels, seed=seed, device=device, env=env, pythonpath=pythonpath)
        env_s = {k: str(v) for k, v in env.items()}
        key = worker_key(kernel, env_s, pythonpath)
        t0 = time.perf_counter()
        worker = self.pool.take(key)
        if worker is None:
            worker = WorkerProcess(env=env_s, label="check", pythonpath=pythonpath)
            self.pool.started += 1
        worker.label = "check"  # it has answered once it is given back: an arm then takes it before a warm one
        try:
            result = worker.request("check", timeout=correctness.CHECK_TIMEOUT_S, kernel=kernel, config=config,
                                    levels=[lv.to_dict() for lv in levels], seed=seed, device=device)["result"]  # fmt: skip
        except WorkerCrashed as exc:
            worker.close()
            return correctness.failed(seed, device, f"crashed: the check process died ({exc})", crashed=True)
        except WorkerError as exc:
            worker.close()
            return correctness.failed(seed, device, f"the check failed: {exc}")
        log.info("check of %d level(s) in worker pid %d: %.2f s", len(levels), worker.pid, time.perf_counter() - t0)
        if result.get("ok"):
            self.pool.give(key, worker)
        else:
            worker.close()
        return result

    def copy_bandwidth(self) -> float:
        """The GPU's device-to-device copy bandwidth, measured once per backend, in a kept worker when there is
        one (the close-out asks after the last A/B: a new process would spend seconds importing torch)."""
        if self._copy is None:
            kept = self.pool.take_any() if self.pool is not None else None
            if kept is None:
                with WorkerProcess(label="copy") as w:
                    self._copy = w.request("copy_bandwidth", mib=2048)["gbps"]
            else:
                key, w = kept
                try:
                    self._copy = w.request("copy_bandwidth", mib=2048)["gbps"]
                except (WorkerCrashed, WorkerError):
                    w.close()
                    raise
                self.pool.give(key, w)
        return self._copy
