"""The cuda backend: each arm is a worker subprocess with its own environment and config
(agent/tools/worker/bench_worker.py): CUDA-graph replay, L2 rotation, correctness before timing, crash isolation."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kinv.agent.errors import Incorrect, JudgeFailed, NoDevice, Tampered, VariantFailed, WorkerCrashed, WorkerError
from kinv.agent.tools.backends.base import (
    RECORDINGS,
    Arm,
    Backend,
    gpu_visible,
    round_seed,
)
from kinv.agent.tools.worker import neighbours
from kinv.agent.tools.worker.client import WorkerProcess, live_pids
from kinv.agent.tools.worker.pool import POOL, WorkerPool, reuse, worker_key
from kinv.kernels.adapter import Level


def _recorded() -> str:
    """What replay serves, by its recordings' folders (``kernels/recordings/<gpu>/``): "the samples recorded on
    h200 (kernels/recordings/h200/)"."""
    gpus = sorted(d.name for d in RECORDINGS.iterdir() if d.is_dir()) if RECORDINGS.is_dir() else []
    where = ", ".join(f"{RECORDINGS.parent.name}/{RECORDINGS.name}/{g}/" for g in gpus)
    return f"the samples recorded on {', '.join(gpus)} ({where})" if gpus else "recorded samples (KINV_RECORDINGS)"

def _recorded_kernels() -> set[str]:
    """The kernels kinv's recordings hold (each file's header names its kernel)."""
    import gzip
    import json
    import os
    from pathlib import Path

    root = Path(os.environ.get("KINV_RECORDINGS") or RECORDINGS)
    names = set()
    for f in sorted(root.rglob("*.jsonl.gz")) if root.is_dir() else []:
        try:
            with gzip.open(f, "rt") as fh:
                names.add(json.loads(fh.readline() or "{}").get("kernel"))
        except (OSError, ValueError):
            continue
    return names


def no_gpu(kernel: str) -> str:
    """What ``--backend cuda`` says without a GPU for ``kernel``: replay where it has the kernel's recordings (kinv's
    own, or the plugin's in its package), else what can be done without a GPU (``kinv check``)."""
    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter(kernel)
    own = adapter.package_dir() / "recordings"
    if adapter.name in _recorded_kernels():
        return f"--backend cuda: no CUDA GPU visible; use --backend replay to serve {_recorded()}"
    if own.is_dir() and any(own.rglob("*.jsonl.gz")):
        return (f"--backend cuda: no CUDA GPU visible; use --backend replay to serve {adapter.name}'s own recordings "
                f"({own})")  # fmt: skip
    return (f"--backend cuda: no CUDA GPU visible, and {adapter.name} has no recording to replay; without a GPU, "
            "kinv check PLAN runs its correctness gates on CPU (nothing timed); measure it on a GPU, where "
            "benchmarks/record.py can record it for replay")  # fmt: skip


log = logging.getLogger(__name__)

VERIFY_SHARE = 0.10
"""Besides each arm's first and last sample at a level, a sample's timed outputs are judged with this chance, by a
draw the worker cannot foresee (its seed is kept in the driver and logged): a check costs milliseconds."""

RETIMES = 2
"""A sample that saw other GPU work beside it is timed again up to this many times; one that still does is kept,
marked, and voids its level (agent/tools/measure/sequential.py)."""


_IPC = [True]  # outputs reach the judge over CUDA IPC until the judge once fails to map them
_WATCHES: list = []


def _WATCH() -> neighbours.Watch:  # noqa: N802 - one NVML handle per process, opened at the first sample
    if not _WATCHES:
        _WATCHES.append(neighbours.Watch())
        if not _WATCHES[0].available:
            log.info("no watch on other GPU work: %s", _WATCHES[0].why)
    return _WATCHES[0]


def watch_note() -> str:
    """Why no watch on other GPU work ran ("" where NVML watched every sample)."""
    return "" if not _WATCHES or _WATCHES[0].available else _WATCHES[0].why


class CudaArm(Arm):
    def __init__(self, name, kernel, config, env, pythonpath=None, pool: WorkerPool | None = None,
                 judge_path: list[str] | None = None):  # fmt: skip
        import random

        super().__init__(name=name, kernel=kernel, config=config, env=env)
        # the judge starts from the baseline's files (the snapshot while a source patch is live): never this arm's
        self.judge_path = judge_path
        self.verified: list[tuple[str, str]] = []  # (level, which capture) the judge passed
        self.verify_s = 0.0  # wall seconds its captures' checks took
        self._draw_seed = random.SystemRandom().randrange(2**32)
        self._draw = random.Random(self._draw_seed)
        self._sampled: set[str] = set()
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
            s = self.worker.request("setup", kernel=self.kernel, config=self.config, level=level.to_dict(),
                                    via="ipc" if _IPC[0] else "file")  # fmt: skip
        except WorkerCrashed as exc:
            raise self._fail(f"{self.name} crashed during set-up at {level.key}: {exc}") from None
        except WorkerError as exc:
            raise self._fail(f"{self.name} failed at {level.key}: {exc}") from None
        if s.get("kernel_hash") != self.expect_kernel:
            where = "the baseline snapshot" if self._key[1] else "the source on disk"
            raise self._fail(f"{self.name} imported kernel source {s.get('kernel_hash')}, not {where} "
                             f"{self.expect_kernel}" + (": the snapshot did not shadow the live package"
                                                        if self._key[1] else ""))  # fmt: skip
        if s.get("tampered"):
            self._failed = True
            raise Tampered(f"{self.name} changed the harness's code in memory at set-up of {level.key} "
                           f"({', '.join(s['tampered'])}); it cannot be timed")  # fmt: skip
        self._judge(level, s["check"], "its own inputs at set-up")
        self.setups[level.key] = s
        log.info("arm %s: set up %s in %s s (compile %s s)", self.name, level.key, s.get("setup_s"), s.get("compile_s"))
        return s

    def _timed(self, s: dict, level: Level, round_index: int) -> dict:
        """One sample request with every other process kinv started stopped, and the device watched."""
        since = neighbours.Watch.now_us()
        with neighbours.paused(live_pids(but=self.worker)):
            t0 = time.perf_counter()
            r = self.worker.request("sample", key=s["key"], seed=round_seed(round_index))
            r["request_wall_s"] = time.perf_counter() - t0
            r["foreign"] = neighbours.foreign(_WATCH().active(since), self.worker_pid)
        return r

    def sample(self, level: Level, round_index: int) -> dict:
        s = self.setups.get(level.key) or self.setup(level)
        try:
            r = self._timed(s, level, round_index)
            for _ in range(RETIMES):
                if not r["foreign"]:
                    break
                log.warning("arm %s: round %d at %s timed again: %s", self.name, round_index + 1, level.key,
                            r["foreign"])  # fmt: skip
                r = self._timed(s, level, round_index)
        except (WorkerCrashed, WorkerError) as exc:
            raise self._fail(f"{self.name} failed while sampling {level.key}: {exc}") from None
        if r.get("tampered"):
            self._failed = True
            raise Tampered(f"{self.name} changed the harness's code in memory while it was timed at {level.key} "
                           f"(round {round_index + 1}: {', '.join(r['tampered'])}); nothing it timed can be believed")
        if r.get("launches") != s.get("launches_per_replay"):
            self._failed = True
            raise Tampered(f"{self.name} reported {r.get('launches')} launches per replay at {level.key}, not the "
                           f"{s.get('launches_per_replay')} its graph was captured with: its timing state was "
                           "changed while it was timed")  # fmt: skip
        first = level.key not in self._sampled
        self._sampled.add(level.key)
        if first or self._draw.random() < VERIFY_SHARE:  # the first sample, and a draw the worker can't see
            self.verify(level, f"round {round_index + 1}" + (" (its first timed sample)" if first else " (drawn)"))
        r["derived_env"] = s["derived_env"]
        r["harness_hash"] = self.harness
        self._n += 1
        self._gpu_s += r.get("gpu_s") or 0.0
        self._req_s += r["request_wall_s"]
        self._reset_s += r.get("reset_s") or 0.0
        return r

    def _judge(self, level: Level, saved: dict, what: str) -> None:
        from kinv.agent.tools.worker import judge

        try:
            got = judge.outputs(self.kernel, level.to_dict(), saved, self.judge_path)
        except JudgeFailed as exc:
            if "ipc" not in saved:
                raise VariantFailed(f"{self.name} at {level.key}: {exc}") from None
            _IPC[0] = False  # this machine does not map CUDA memory across processes: files from now on
            log.warning("the judge could not map %s's outputs over CUDA IPC (%s); handing them through files", self.name,
                        exc)  # fmt: skip
            try:
                saved = self.worker.request("rehand")["check"]
            except (WorkerCrashed, WorkerError) as err:
                raise self._fail(f"{self.name} failed while its outputs were handed over at {level.key}: {err}") from None
            return self._judge(level, saved, what)
        if not got["ok_all"]:
            self._failed = True
            raise Incorrect(f"{self.name} is incorrect at {level.key} ({what}): {got['reason']}")

    def verify(self, level: Level, why: str) -> bool:
        """The outputs this arm's last timed replays at ``level`` left, judged against the reference of the inputs
        those replays read (nothing is replayed for the check: a timed replay is the only kind there is)."""
        s = self.setups.get(level.key)
        if s is None or level.key not in self._sampled:
            return False
        t0 = time.perf_counter()
        try:
            r = self.worker.request("collect", key=s["key"], via="ipc" if _IPC[0] else "file")
        except (WorkerCrashed, WorkerError) as exc:
            raise self._fail(f"{self.name} failed while its timed outputs were collected at {level.key}: {exc}") from None
        if r.get("tampered"):
            self._failed = True
            raise Tampered(f"{self.name} changed the harness's code in memory at {level.key} ({why}: "
                           f"{', '.join(r['tampered'])})")  # fmt: skip
        t1 = time.perf_counter()
        self._judge(level, r["check"], f"the outputs its timed replays left in {why}, every input set")
        self.verified.append((level.key, why))
        self.verify_s += time.perf_counter() - t0
        log.info("arm %s: %s at %s checked in %.3f s (worker %.3f s, judge %.3f s, %d input sets, %s)", self.name,
                 why, level.key, time.perf_counter() - t0, t1 - t0, time.perf_counter() - t1,
                 len(r["check"]["sets"]), "IPC" if "ipc" in r["check"] else "file")  # fmt: skip
        return True

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
        self.pool = POOL if reuse() else None

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant",
             judge_path=None) -> Arm:  # fmt: skip
        return CudaArm(name, kernel, config, env, pythonpath, pool=self.pool,
                       judge_path=judge_path if judge_path is not None else pythonpath)  # fmt: skip

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        super().close()

    def profile(self, adapter, config: dict, level: Level, env: dict) -> tuple[dict | None, str, float]:
        from kinv.agent.tools.backends import profile

        return profile.run(adapter, config, level, env)

    def compiled(self, kernel: str, config: dict, env: dict, levels: list[Level]) -> dict | None:
        from kinv.agent.tools.backends.compiled import compiled_figures

        out = {}
        try:
            with WorkerProcess(env={k: str(v) for k, v in env.items()}, label="compile") as w:
                for lv in levels:
                    out[lv.key] = compiled_figures(w.request("compile", kernel=kernel, config=config,
                                                             level=lv.to_dict())["resources"])  # fmt: skip
        except (WorkerCrashed, WorkerError) as exc:
            log.warning("compiling %s for its resources failed: %s", kernel, exc)
            return None
        return out

    def warm(self, kernel: str, env: dict, n: int) -> None:
        if self.pool is None:
            return
        env_s = {k: str(v) for k, v in env.items()}
        key = worker_key(kernel, env_s, None)
        for _ in range(n - self.pool.count(key)):  # a worker's imports and CUDA context start in its own process
            self.pool.started += 1
            self.pool.give(key, WorkerProcess(env=env_s, label="warm"))

    def check_pool(self, device: str) -> WorkerPool | None:
        """On the GPU the check runs in a benchmark worker of the arms that follow (a kept one when there is
        one): the worker starts once and has compiled the config before it is timed."""
        return self.pool if device == "cuda" else super().check_pool(device)

    def copy_bandwidth(self) -> float:
        """The GPU's device-to-device copy bandwidth, measured once per run in the judge (a process no variant
        was imported into)."""
        return self.ceilings()["copy_gbps"]

    def ceilings(self) -> dict:
        """The card's ceilings, measured once per run in the judge: copy bandwidth, the yardstick's, the matrix
        peak per dtype (agent/tools/worker/judge.py)."""
        from kinv.agent.tools.worker import judge

        if self._copy is None:
            self._copy = {**judge.ceilings(), "source": "measured on this card by the judge, a process no variant "
                                                       "was imported into"}  # fmt: skip
        return self._copy


__all__ = ["CudaArm", "CudaBackend", "watch_note"]
