"""The ray backend: the arms of a workstream's A/As and A/Bs hosted on a RayExecutor's actors, one per GPU.

It wraps the backend the actors run (cuda or replay: ``ex.backend``) and honours the same arm contract
(agent/tools/backends/base.py): an arm's ``setup`` returns the set-up record the actor's local arm
returned, its ``sample`` the local arm's sample (with the GPU that timed it).  The Ray executor
(agent/tools/runners/executor.py) builds it; it is not chosen by name.
"""

from __future__ import annotations

from kinv.agent.errors import BackendError, NoRecording, VariantFailed
from kinv.agent.tools.backends.base import Backend


class RemoteArm:
    """The driver's handle of an arm hosted on the actors: one worker of the config on each actor that times
    a level of the measurement (so both arms of a paired comparison run on one GPU)."""

    def __init__(self, aid: int, spec: dict, backend: RayBackend, pending: list):
        self.aid, self.spec, self.backend = aid, spec, backend
        self.name, self.kernel, self.config, self.env = spec["name"], spec["kernel"], spec["config"], spec["env"]
        self.setups: dict = {}
        self.places: dict = {}
        self._pending = pending  # (actor index, ref, resend) of the opens still in flight
        self._hello: dict | None = None

    def resolve(self) -> None:
        """Wait for this arm's workers (started on every actor when it was opened, alongside the other arms');
        raises the open's error (VariantFailed, NoRecording) here."""
        if self._hello is not None:
            return
        try:
            got = [self.backend._get(i, ref, resend) for i, ref, resend in self._pending]
        except Exception:
            self.backend.close_arm(self)
            raise
        self._pending = []
        self._hello = got[0]
        self.places = {self.backend.ex.places[i]: g["fingerprint"] for i, g in enumerate(got)}

    @property
    def fingerprint(self) -> dict:
        self.resolve()
        return self._hello["fingerprint"]

    @property
    def env_seen(self) -> dict:
        self.resolve()
        return self._hello["env_seen"]

    @property
    def config_hash(self) -> str:
        from kinv.kernels.launch_config import config_hash

        return config_hash(self.config)

    def setup(self, level) -> dict:
        """Set up one level on the actor that owns it (a measurement sets up all its levels at once through
        RayBackend.prepare)."""
        self.backend.prepare([self], [level])
        return self.setups[level.key]

    def sample(self, level, round_index: int) -> dict:
        """One sample at a level, on the actor that owns it (a round goes through RayBackend.sample_round)."""
        return self.backend.sample_round([self], [level], round_index, {level.key: [0]})[level.key][0]

    def close(self) -> None:
        self.backend.close_arm(self)


class RayBackend(Backend):
    """The benchmark backend over a RayExecutor's actors.

    Each level of a measurement is owned by one actor (levels dealt round-robin), and every arm of the
    measurement has a worker on every actor: a round sends each actor its levels at once, so the levels run
    on all GPUs in parallel while each paired comparison (baseline and variant at one level, one round) stays
    on one GPU.  Each actor imports the kernel from its own copy of the package, sent by the driver when the
    arm opens (the live source for a variant, the baseline snapshot for a baseline during a source patch).
    An actor that dies loses only the round in flight (its rows were never stored): a new actor takes its
    place, the arms are reopened and set up there, and the round runs again.
    """

    def __init__(self, ex):
        from kinv.agent.tools import backends

        self.ex = ex
        self.inner = backends.get_backend(ex.backend)  # the driver's view: name, copy bandwidth, description
        self.name, self.loud = self.inner.name, self.inner.loud
        self.arms: dict[int, RemoteArm] = {}
        self.owner: dict[str, int] = {}
        self.levels: dict[str, object] = {}
        self.losses: list[str] = []
        self.on_loss = None  # callable(line): the running workstream records the loss (run_plan sets it)
        self._next = 0

    def copy_bandwidth(self):
        return self.inner.copy_bandwidth()

    def describe(self) -> str:
        return f"{self.inner.describe()} on {self.ex.width} Ray actors ({', '.join(self.ex.places)})"

    # -- arms ------------------------------------------------------------------------------------------
    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant", judge_path=None):
        from pathlib import Path

        from kinv.agent.tools.files.snapshot import package_files
        from kinv.agent.tools.worker import hashes
        from kinv.kernels.adapter import get_adapter

        adapter = get_adapter(kernel)
        if pythonpath:  # the baseline snapshot: its directory is named by its source hash
            src, src_hash = Path(pythonpath[0]) / Path(*adapter.package_name().split(".")), Path(pythonpath[0]).name
        else:
            src, src_hash = adapter.package_dir(), hashes.kernel_hash(kernel)
        spec = {"name": name, "kernel": kernel, "config": config, "env": dict(env), "replica": replica,
                "partner": partner, "role": role, "files": package_files(src), "src_hash": src_hash,
                "package": adapter.package_name(), "snapshot_arm": bool(pythonpath)}  # fmt: skip
        self._next += 1
        aid = self._next

        def send(i):
            return self.ex.actors[i].open_arm.remote(aid, spec)

        # every actor starts its worker now, and the caller's next open starts the next arm's alongside: the
        # handle waits only when it is first used (RemoteArm.resolve)
        arm = RemoteArm(aid, spec, self, [(i, send(i), lambda i=i: send(i)) for i in range(self.ex.width)])
        self.arms[aid] = arm  # registered at once: an actor replaced meanwhile reopens it too
        return arm

    def close_arm(self, arm: RemoteArm) -> None:
        if self.arms.pop(arm.aid, None) is None:
            return
        try:  # an open still in flight finishes first (the actor runs one call at a time), then closes
            self.ex.ray.wait([a.close_arm.remote(arm.aid) for a in self.ex.actors], num_returns=self.ex.width,
                             timeout=60)  # fmt: skip
        except Exception:  # noqa: BLE001 - a dead actor has closed its workers with it
            pass

    def close(self) -> None:
        for arm in list(self.arms.values()):
            self.close_arm(arm)
        super().close()

    # -- levels ----------------------------------------------------------------------------------------
    def _own(self, levels) -> dict[int, list]:
        for lv in levels:
            if lv.key not in self.owner:
                self.owner[lv.key] = len(self.owner) % self.ex.width
            self.levels[lv.key] = lv
        by: dict[int, list] = {}
        for lv in levels:
            by.setdefault(self.owner[lv.key], []).append(lv)
        return by

    def prepare(self, arms, levels) -> None:
        for a in arms:
            a.resolve()
        by = self._own(levels)
        refs = {i: self.ex.actors[i].setup_arms.remote([a.aid for a in arms], [lv.to_dict() for lv in lvs])
                for i, lvs in by.items()}  # fmt: skip
        for i, ref in refs.items():
            got = self._get(i, ref, lambda i=i: self.ex.actors[i].setup_arms.remote(
                [a.aid for a in arms], [lv.to_dict() for lv in by[i]]))  # fmt: skip
            for a in arms:  # each level's set-up record, as the actor's local arm returned it
                a.setups.update(got.get("setups", {}).get(a.aid, {}))

    def sample_round(self, arms, levels, round_index, orders):
        by = self._own(levels)

        def send(i):
            part = [(lv.to_dict(), [arms[j].aid for j in orders[lv.key]]) for lv in by[i]]
            return self.ex.actors[i].sample_part.remote(part, round_index, self.ex.places[i])

        refs = {i: send(i) for i in by}
        out: dict[str, dict[int, dict]] = {}
        for i, ref in refs.items():
            got = self._get(i, ref, lambda i=i: send(i))["samples"]
            for lv in by[i]:
                by_aid = got[lv.key]
                out[lv.key] = {j: by_aid[arms[j].aid] for j in orders[lv.key]}
        return out

    # -- calls, errors, losses ---------------------------------------------------------------------------
    def _get(self, i: int, ref, again):
        """The result of a call on actor ``i``; an error the actor reports is raised here as its own kind; a
        dead actor is replaced (its arms reopened and set up) and the call made again."""
        from ray.exceptions import ActorDiedError, RayActorError


        while True:
            try:
                got = self.ex.ray.get(ref)
                break
            except (RayActorError, ActorDiedError) as exc:
                loss = self.ex.replace(i, f"during a measurement ({type(exc).__name__}); its round runs again")
                self.losses.append(loss)
                if self.on_loss:
                    self.on_loss(loss)
                self._revive(i)
                ref = again()
        if isinstance(got, dict) and "error" in got:
            kind = {"VariantFailed": VariantFailed, "NoRecording": NoRecording}.get(got["error"],
                                                                                             BackendError)
            raise kind(got["message"])
        return got

    def _revive(self, i: int) -> None:
        """A new actor ``i``: the open arms get workers there, set up at the levels it owns."""
        actor = self.ex.actors[i]
        for aid, arm in self.arms.items():
            self._get(i, actor.open_arm.remote(aid, arm.spec), lambda aid=aid, arm=arm: self.ex.actors[i]
                      .open_arm.remote(aid, arm.spec))  # fmt: skip
        mine = [lv.to_dict() for k, lv in self.levels.items() if self.owner.get(k) == i]
        if self.arms and mine:
            ids = list(self.arms)
            self._get(i, actor.setup_arms.remote(ids, mine), lambda: self.ex.actors[i].setup_arms.remote(ids, mine))
