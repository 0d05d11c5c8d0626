"""The cuda backend: each arm is a worker subprocess with its own environment and config
(agent/tools/bench_worker.py): CUDA-graph replay, L2 rotation, correctness before timing, crash isolation."""

from __future__ import annotations

import time
from pathlib import Path

from kinv.agent.tools import protocol
from kinv.agent.tools.backends.base import RECORDINGS, Arm, Backend, NoDevice, VariantFailed, gpu_visible
from kinv.agent.tools.worker_client import WorkerCrashed, WorkerError, WorkerProcess
from kinv.kernels.adapter import Level


def _recorded() -> str:
    """What replay serves, by its recordings' folders (``kernels/recordings/<gpu>/``): "the samples recorded on
    h200 (kernels/recordings/h200/)"."""
    gpus = sorted(d.name for d in RECORDINGS.iterdir() if d.is_dir()) if RECORDINGS.is_dir() else []
    where = ", ".join(f"{RECORDINGS.parent.name}/{RECORDINGS.name}/{g}/" for g in gpus)
    return f"the samples recorded on {', '.join(gpus)} ({where})" if gpus else "recorded samples (KINV_RECORDINGS)"

class CudaArm(Arm):
    def __init__(self, name, kernel, config, env, pythonpath=None):
        super().__init__(name=name, kernel=kernel, config=config, env=env)
        self.worker = WorkerProcess(env={k: str(v) for k, v in env.items()}, label=name, pythonpath=pythonpath)
        # a baseline snapshot is named by its kernel hash: the worker must have imported that very source
        self.expect_kernel = Path(pythonpath[0]).name if pythonpath else None
        try:
            hello = self.worker.request("hello", env_keys=sorted(env))
        except (WorkerCrashed, WorkerError) as exc:
            raise VariantFailed(f"{name}: worker failed to start: {exc}") from None
        self.fingerprint = hello["fingerprint"]
        self.env_seen = hello["env"]
        self.harness = hello["harness_hash"]
        self.worker_pid = hello["pid"]

    def setup(self, level: Level) -> dict:
        try:
            s = self.worker.request("setup", kernel=self.kernel, config=self.config, level=level.to_dict())
        except WorkerCrashed as exc:
            raise VariantFailed(f"{self.name} crashed during set-up at {level.key}: {exc}") from None
        except WorkerError as exc:
            raise VariantFailed(f"{self.name} failed at {level.key}: {exc}") from None
        if self.expect_kernel and s.get("kernel_hash") != self.expect_kernel:
            raise VariantFailed(f"{self.name} imported kernel source {s.get('kernel_hash')}, not the baseline "
                                f"snapshot {self.expect_kernel}: the snapshot did not shadow the live package")
        if not s["correct"]:
            raise VariantFailed(
                f"{self.name} is incorrect at {level.key}: {s['mismatched']} elements off, rel err {s['rel_err']:.2e}"
            )
        self.setups[level.key] = s
        return s

    def sample(self, level: Level, round_index: int) -> dict:
        s = self.setups.get(level.key) or self.setup(level)
        t0 = time.perf_counter()
        try:
            r = self.worker.request("sample", key=s["key"], seed=protocol.round_seed(round_index))
        except (WorkerCrashed, WorkerError) as exc:
            raise VariantFailed(f"{self.name} failed while sampling {level.key}: {exc}") from None
        r["request_wall_s"] = time.perf_counter() - t0
        r["derived_env"] = s["derived_env"]
        r["harness_hash"] = self.harness
        return r

    def close(self) -> None:
        self.worker.close()


class CudaBackend(Backend):
    name = "cuda"
    loud = "CUDA backend: measuring live on this machine's GPU"

    def __init__(self):
        if not gpu_visible():
            raise NoDevice(f"--backend cuda: no CUDA GPU visible; use --backend replay to serve {_recorded()}")
        self._copy = None

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant") -> Arm:
        return CudaArm(name, kernel, config, env, pythonpath)

    def copy_bandwidth(self) -> float:
        if self._copy is None:
            with WorkerProcess(label="copy") as w:
                self._copy = w.request("copy_bandwidth", mib=2048)["gbps"]
        return self._copy
