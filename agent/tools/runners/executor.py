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

from kinv.agent.errors import BackendError, ExecutorError, NoRecording, VariantFailed
from kinv.agent.tools.backends.ray import RayBackend
from kinv.agent.tools.runners.screening import screen_shard
from kinv.kernels.errors import BadInput

EXECUTORS = ("local", "ray")
ENV_FOR_ACTORS = ("KINV_FORCE_NO_GPU", "KINV_RECORDINGS", "KINV_CONFIG_DIR", "TRITON_INTERPRET", "TRITON_CACHE_DIR", "PYTHONPATH",
                  "KINV_EXECUTOR_FAULT", "KINV_EXECUTOR_FAULT_MARKER")  # fmt: skip


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
        from kinv.agent.tools.backends import base

        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            env = {k: os.environ[k] for k in ENV_FOR_ACTORS if k in os.environ}
            from kinv.kernels.adapter import import_path

            if import_path():  # a package.module:Class adapter imported from a folder only this process sees
                env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *import_path()) if p)
            kwargs = {"address": address, "include_dashboard": False, "log_to_driver": False,
                      "runtime_env": {"env_vars": env}}  # fmt: skip
            if address is None and actors:
                kwargs["num_cpus"] = max(actors, 1)
            try:
                ray.init(**kwargs)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ExecutorError(f"cannot start or reach the Ray cluster ({address or 'local'}): "
                                    f"{str(exc).splitlines()[0]}") from None  # fmt: skip
        live = backend == "cuda" or (backend == "auto" and base.gpu_visible())
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
        # a threaded actor: the arms of one measurement start their workers at the same time
        self.options["max_concurrency"] = 4
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
                self._respawn(i)
                queue.append(j)
                free.append(i)
        self.lost += losses
        return results, losses  # type: ignore[return-value]

    def measuring_backend(self) -> RayBackend:
        """The measurement backend over these actors: the graph's A/As and A/Bs (a campaign's confirmation
        workstreams and its final A/B) time each level on the actor that owns it."""
        if getattr(self, "_backend", None) is None:
            self._backend = RayBackend(self)
        return self._backend

    def replace(self, i: int, why: str) -> str:
        """Actor ``i`` died: start a new one in its place; returns the loss line."""
        what = f"actor {i} ({self.places[i]}) died {why}; a new actor takes its place"
        self.lost.append(what)
        if len(self.lost) > 8 * self.width + 8:
            raise ExecutorError(f"Ray actors keep dying ({len(self.lost)} losses): {what}")
        self._respawn(i)
        return what

    def _respawn(self, i: int) -> None:
        """A new actor ``i``, placed within KINV_RAY_PLACE_TIMEOUT_S (120 s): a cluster with no GPU left for it
        (a node gone) stops the campaign with one line instead of waiting forever; `kinv campaign` resumes."""
        from ray.exceptions import GetTimeoutError

        limit = float(os.environ.get("KINV_RAY_PLACE_TIMEOUT_S", "120"))
        self.actors[i] = self._new(i)
        try:
            self.places[i] = self.ray.get(self.actors[i].where.remote(), timeout=limit)
        except GetTimeoutError:
            need = "a GPU" if self.options.get("num_gpus") else "a CPU"
            raise ExecutorError(f"actor {i} died and no new actor could be placed within {limit:g} s (the Ray cluster "
                                f"has no {need} free for it); stopped: run kinv campaign again to resume") from None

    def close(self) -> None:
        if getattr(self, "_backend", None) is not None:
            self._backend.close()
        try:  # workers closed and package copies removed; an actor already dead has nothing to clean
            self.ray.wait([a.cleanup.remote() for a in self.actors], num_returns=len(self.actors), timeout=30)
        except Exception:  # noqa: BLE001
            pass
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
        import threading

        self.index, self.backend = index, backend
        self._lock = threading.Lock()  # calls may run at once (max_concurrency): the arms table is shared
        self._closed: set[int] = set()

    def where(self) -> str:
        import socket

        dev = os.environ.get("CUDA_VISIBLE_DEVICES")
        return f"actor{self.index}@{socket.gethostname()}" + (f"/gpu{dev}" if dev else "/cpu")

    def screen(self, job: dict, where: str) -> dict:
        return screen_shard(**job, where=where)

    # -- arms of the graph's A/As and A/Bs, hosted here (RayBackend) ------------------------------------
    def _be(self):
        with self._lock:
            if getattr(self, "_inner", None) is None:
                from kinv.agent.tools.runners import bench

                self._inner, self._arms = bench.get_backend(self.backend), {}
            return self._inner

    def open_arm(self, aid: int, spec: dict) -> dict:
        """Open arm ``aid`` from its own copy of the kernel package (``spec["files"]``, written under this
        actor's directory, named by the source hash); returns what the driver's handle needs, or the error."""
        from kinv.agent.tools.files.snapshot import materialize

        be = self._be()
        self.close_arm(aid, final=False)  # opened here already (a replacement actor reopens, then the call re-sent)
        root = self._dir() / spec["src_hash"]
        with self._lock:  # one writer: a copy in use is never replaced under a worker importing it
            snap = materialize(spec["files"], root, spec["package"])
        # the worker imports the copy (and proves it: its kernel hash must be the copy's name); replay runs no
        # kernel, and keeps its own check that a recording exists for this source
        path = [str(snap)] if be.name == "cuda" or spec["snapshot_arm"] else None
        try:
            arm = be.open(spec["name"], spec["kernel"], spec["config"], spec["env"], replica=spec["replica"],
                          pythonpath=path, partner=spec["partner"], role=spec["role"])  # fmt: skip
        except (VariantFailed, NoRecording, BackendError) as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        with self._lock:
            closed = aid in self._closed  # closed by the driver while it was opening: never leak its worker
            if not closed:
                self._arms[aid] = arm
        if closed:
            arm.close()
        return {"fingerprint": arm.fingerprint, "env_seen": arm.env_seen, "snapshot": str(snap)}

    def setup_arms(self, aids: list[int], levels: list[dict]) -> dict:
        from kinv.kernels.adapter import get_adapter

        setups: dict[int, dict] = {}
        try:
            for aid in aids:
                arm = self._arms[aid]
                adapter = get_adapter(arm.kernel)
                for d in levels:
                    lv = adapter.level(d)
                    setups.setdefault(aid, {})[lv.key] = arm.setup(lv)
        except (VariantFailed, NoRecording, BackendError) as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        return {"setups": setups}

    def sample_part(self, part: list[tuple[dict, list[int]]], round_index: int, where: str) -> dict:
        """This actor's levels of one round: at each level its arms in the given order, back to back."""
        from kinv.agent.tools.runners.screening import _fault
        from kinv.kernels.adapter import get_adapter

        _fault("sample", where)
        out = {}
        try:
            for d, aids in part:
                lv = get_adapter(self._arms[aids[0]].kernel).level(d)
                got = {}
                for aid in aids:
                    arm = self._arms[aid]
                    smp = arm.sample(lv, round_index)
                    got[aid] = {**smp, "place": where, "fingerprint": arm.fingerprint}
                out[lv.key] = got
        except (VariantFailed, NoRecording, BackendError) as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        return {"samples": out}

    def close_arm(self, aid: int, final: bool = True) -> None:
        with self._lock:
            if final:
                self._closed.add(aid)
            arm = getattr(self, "_arms", {}).pop(aid, None)
        if arm is not None:
            arm.close()

    def _dir(self):
        import tempfile
        from pathlib import Path

        return Path(tempfile.gettempdir()) / f"kinv-actor{self.index}-{os.getpid()}"

    def cleanup(self) -> None:
        """Close every arm and remove this actor's package copies."""
        import shutil

        for aid in list(getattr(self, "_arms", {})):
            self.close_arm(aid)
        shutil.rmtree(self._dir(), ignore_errors=True)


def get_executor(name: str, backend: str, address: str | None = None, actors: int | None = None):
    if name not in EXECUTORS:
        raise BadInput(f"--executor {name!r} is not valid; use {', '.join(EXECUTORS)}")
    if name == "local":
        if address or actors:
            raise BadInput("--ray-address and --ray-actors need --executor ray")
        return LocalExecutor()
    return RayExecutor(backend, address, actors)
