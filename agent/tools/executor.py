"""Where a campaign's screening shards run: in this process (one GPU), or on Ray actors holding one GPU each.

``--executor local`` (the default) runs every shard here, exactly as before Ray existed.  ``--executor ray``
starts one actor per GPU of the Ray cluster (``ray.init()`` on this node, or ``--ray-address`` of an existing
cluster), each created with ``num_gpus=1`` so Ray pins it to its own device; the workers an actor starts
inherit that pin.  On the replay backend, which needs no GPU, ``--ray-actors N`` CPU actors stand in for GPUs.

A shard is one incumbent worker and the candidates paired with it, on one actor: every paired comparison
runs on one GPU, and results from different GPUs meet only as per-GPU paired effects.  Actors compute and
return sample rows; the driver alone writes kinv.db, holds the approval gate and the config journal, and the
live config file is never touched by an actor (workers receive configs as data).  An actor that dies loses
only its in-flight shard: the driver records the loss, starts a replacement actor and runs the shard again
(its rows never reached the store, so nothing is counted twice).

Ray is an optional extra (``pip install -e '.[ray]'``): nothing here imports it unless asked for.
"""

from __future__ import annotations

import os

from kinv.agent.tools.screening import screen_shard

EXECUTORS = ("local", "ray")
ENV_FOR_ACTORS = ("KINV_FORCE_NO_GPU", "KINV_RECORDINGS", "KINV_CONFIG_DIR", "TRITON_INTERPRET", "PYTHONPATH",
                  "KINV_EXECUTOR_FAULT", "KINV_EXECUTOR_FAULT_MARKER")  # fmt: skip


class ExecutorError(RuntimeError):
    """The executor cannot run (Ray missing, no GPU in the cluster, every actor lost); one line."""


class LocalExecutor:
    name = "local"
    width = 1
    places = ["local"]

    def run(self, jobs: list[dict]) -> tuple[list[dict], list[str]]:
        return [screen_shard(**job, where="local") for job in jobs], []

    def close(self) -> None:
        pass


class RayExecutor:
    name = "ray"

    def __init__(self, backend: str, address: str | None = None, actors: int | None = None):
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install -e '.[ray]'") from None
        from kinv.agent.tools import bench

        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            env = {k: os.environ[k] for k in ENV_FOR_ACTORS if k in os.environ}
            kwargs = {"address": address, "include_dashboard": False, "log_to_driver": False,
                      "runtime_env": {"env_vars": env}}  # fmt: skip
            if address is None and actors:
                kwargs["num_cpus"] = max(actors, 1)
            try:
                ray.init(**kwargs)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ExecutorError(f"cannot start or reach the Ray cluster ({address or 'local'}): "
                                    f"{str(exc).splitlines()[0]}") from None  # fmt: skip
        live = backend == "cuda" or (backend == "auto" and bench.gpu_visible())
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if live:
            n = actors or gpus
            if gpus < 1 or n > gpus:
                raise ExecutorError(f"the Ray cluster has {gpus} GPU(s); --executor ray with the cuda backend needs "
                                    f"one per actor ({n} asked)")  # fmt: skip
            self.options = {"num_gpus": 1, "num_cpus": 1}
        else:
            n = actors or 2
            self.options = {"num_cpus": 1}
        self.backend = backend
        self.actor_cls = ray.remote(_Bench)
        self.actors = [self._new(i) for i in range(n)]
        self.places = ray.get([a.where.remote() for a in self.actors])
        self.width = n
        self.lost: list[str] = []

    def _new(self, i: int):
        return self.actor_cls.options(**self.options).remote(i, self.backend)

    def run(self, jobs: list[dict]) -> tuple[list[dict], list[str]]:
        """Each job on a free actor; a job whose actor dies goes back in the queue for a replacement actor."""
        ray = self.ray
        from ray.exceptions import ActorDiedError, RayActorError

        results: list[dict | None] = [None] * len(jobs)
        queue = list(range(len(jobs)))
        losses: list[str] = []
        running: dict = {}
        free = list(range(len(self.actors)))
        while queue or running:
            while queue and free:
                i, j = free.pop(0), queue.pop(0)
                running[self.actors[i].screen.remote(jobs[j], self.places[i])] = (i, j)
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            i, j = running.pop(ref)
            try:
                results[j] = ray.get(ref)
                free.append(i)
            except (RayActorError, ActorDiedError) as exc:
                what = f"actor {i} ({self.places[i]}) died during a shard of {len(jobs[j]['candidates'])} " \
                       f"candidates: {type(exc).__name__}; the shard re-runs on a new actor"
                losses.append(what)
                if len(losses) > 3 * len(jobs):
                    raise ExecutorError(f"Ray actors keep dying ({len(losses)} losses): {what}") from None
                self.actors[i] = self._new(i)
                self.places[i] = ray.get(self.actors[i].where.remote())
                queue.append(j)
                free.append(i)
        self.lost += losses
        return results, losses  # type: ignore[return-value]

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.started_here:
            self.ray.shutdown()


class _Bench:
    """One actor: one GPU (CUDA_VISIBLE_DEVICES set by Ray), the workers of the shards it is given."""

    def __init__(self, index: int, backend: str):
        self.index, self.backend = index, backend

    def where(self) -> str:
        import socket

        dev = os.environ.get("CUDA_VISIBLE_DEVICES")
        return f"actor{self.index}@{socket.gethostname()}" + (f"/gpu{dev}" if dev else "/cpu")

    def screen(self, job: dict, where: str) -> dict:
        return screen_shard(**job, where=where)


def get_executor(name: str, backend: str, address: str | None = None, actors: int | None = None):
    if name not in EXECUTORS:
        raise ValueError(f"--executor {name!r} is not valid; use {', '.join(EXECUTORS)}")
    if name == "local":
        if address or actors:
            raise ValueError("--ray-address and --ray-actors need --executor ray")
        return LocalExecutor()
    return RayExecutor(backend, address, actors)
