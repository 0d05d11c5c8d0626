"""The benchmark backend interface: an :class:`Arm` is one variant under measurement, a :class:`Backend`
opens arms and times them in rounds.

The arm contract, which every backend honours (cuda, replay, ray):

* ``Backend.open(...)`` returns an arm with ``fingerprint`` (the device it runs on) and ``env_seen`` (the
  environment its worker saw);
* ``Arm.setup(level)`` prepares a level and returns its set-up record: at least ``correct`` and
  ``derived_env``; it raises :class:`VariantFailed` when the variant crashes or is incorrect there;
* ``Arm.sample(level, round_index)`` returns one sample: at least ``us``, ``replays`` and ``gpu_s``; round r
  draws its inputs from :func:`round_seed` (r);
* ``Arm.close()`` stops what the arm started.

The rounds and their order belong to the measurement protocol (agent/tools/measure/protocol.py), not
to a backend; a backend only says how one round is timed (:meth:`Backend.sample_round`).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from kinv.kernels.adapter import KERNELS_DIR, Level
from kinv.kernels.launch_config import config_hash

RECORDINGS = KERNELS_DIR / "recordings"

ROUND_SEED0 = 1000
"""Round r of every arm draws its inputs from seed ROUND_SEED0 + r: the data are common to a round's arms
(and cancel in its paired log-ratio); the memory placement is each arm's own, re-drawn every round."""


def round_seed(round_index: int) -> int:
    """The input seed of round ``round_index``, the same for every arm of the round."""
    return ROUND_SEED0 + round_index

def gpu_visible() -> bool:
    if os.environ.get("KINV_FORCE_NO_GPU"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@dataclass
class Arm(ABC):
    """One variant under measurement: a config in its own environment."""

    name: str
    kernel: str
    config: dict
    env: dict
    fingerprint: dict = field(default_factory=dict)
    env_seen: dict = field(default_factory=dict)
    setups: dict = field(default_factory=dict)

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)

    @abstractmethod
    def setup(self, level: Level) -> dict:
        """Prepare a level: derived env, resources, correctness, graph."""

    @abstractmethod
    def sample(self, level: Level, round_index: int) -> dict:
        """One sample at a level: at least us, replays, gpu_s."""

    def verify(self, level: Level, why: str) -> bool:
        """Check what this arm last timed at ``level`` against the judge, on new inputs written into the timed
        buffers (``why``: which round, for the record); raises :class:`Incorrect` when the judge refuses it.
        False where there is nothing to check (a recording replayed; a command's own run)."""
        return False

    def close(self) -> None:
        pass


class Backend(ABC):
    name: str = ""
    loud: str = ""
    #: the experiment whose arms and checks are being run (the measurement sets it): a backend that keeps what its
    #: runs print files it under this id, so no later experiment's run overwrites an earlier one's
    experiment: int | None = None
    #: what a sample's ``gpu_s`` is, in the close-out's words ("GPU time"; a command's: its runs' wall time)
    time_word: str = "GPU time"
    #: what one sample is, as the close-out's noise section says it
    each_sample: str = ("every sample re-sets its worker (fresh inputs, outputs and scratch at a new memory "
                        "placement, the graph captured again)")

    @abstractmethod
    def open(self, name: str, kernel: str, config: dict, env: dict, replica: int | None = None,
             pythonpath: list[str] | None = None, partner: dict | None = None,
             role: str = "variant", judge_path: list[str] | None = None) -> Arm:  # fmt: skip
        """Start an arm (``judge_path``: where the judge of its outputs imports from, the baseline snapshot while a
        source patch is live).  ``replica`` j names arm j of an A/A (independent workers of one config);
        ``partner`` is the config this arm is compared with in an A/B and ``role`` its side ("base" or
        "variant"): the replay backend serves the rounds recorded for that very pair; ``pythonpath`` puts a kernel source snapshot first (the
        baseline arm while a source patch is live)."""

    def copy_bandwidth(self) -> float | None:
        return None

    def ceilings(self) -> dict:
        """The ceilings the roofline and the plausibility rule use: ``{copy_gbps, yard_gbps, matrix_tflops: {dtype:
        TFLOP/s}, measured, source}``.  Here the backend's copy bandwidth and no matrix peak, not measured on a
        card (the cuda backend measures them; replay reads the recording's)."""
        return {"copy_gbps": self.copy_bandwidth(), "yard_gbps": None, "matrix_tflops": {}, "measured": False,
                "source": f"the {self.name} backend measures no ceiling"}  # fmt: skip

    def compiled(self, kernel: str, config: dict, env: dict, levels: list[Level]) -> dict | None:
        """The compiler's resources of ``config`` at each level (:func:`~kinv.agent.tools.backends.compiled.compiled_figures`
        by level key), compiled without timing; ``None`` where this backend has no compiler (or no record of one)."""
        return None

    def profile(self, adapter, config: dict, level: Level, env: dict) -> tuple[dict | None, str, float]:
        """Profile ``config`` at ``level`` (:mod:`kinv.agent.tools.backends.profile`): ``(figures or None, why not, GPU
        seconds)``.  Here: no profiler."""
        return None, f"the {self.name} backend has no profiler; the profile step was skipped", 0.0

    def close(self) -> None:
        """Stop what the backend keeps between measurements (kept check processes; the cuda backend's workers)."""
        from kinv.agent.tools.worker import pool as worker_pool

        worker_pool.CHECKERS.close()

    def warm(self, kernel: str, env: dict, n: int) -> None:
        """Begin starting ``n`` arms' processes for ``kernel`` in ``env`` now, so that arms opened later find
        them ready (the cuda backend: workers start while a correctness check runs).  Nothing to do here."""

    def check(self, kernel: str, config: dict, levels: list[Level], *, seed: int, device: str, env: dict,
              pythonpath: list[str] | None = None, judge_path: list[str] | None = None) -> dict:  # fmt: skip
        """The correctness gate for ``config`` at ``levels`` (:func:`~kinv.agent.tools.worker.gate.check`'s
        result), crash-isolated in a child process that sees ``env``: one kept from an earlier check of this
        run with the same environment, import path and kernel source when :meth:`check_pool` has one (a
        passed check leaves its process for the next; a failed one ends it), else one of its own.  That process
        launches and saves the outputs; the judge (agent/tools/worker/judge.py), started from ``judge_path`` (the
        baseline snapshot while a source patch is live), computes the reference and compares."""
        from kinv.agent.tools.worker import gate, judge
        from kinv.agent.tools.worker import pool as worker_pool

        pool = self.check_pool(device)
        judge.warm(device, judge_path)  # the judge starts while the check launches
        if pool is not None:
            result = worker_pool.check_in_worker(pool, kernel, config, levels, seed=seed, device=device, env=env,
                                                 pythonpath=pythonpath)  # fmt: skip
        else:
            result = gate.check_isolated(kernel, config, levels, seed=seed, device=device, env=env,
                                                pythonpath=pythonpath)  # fmt: skip
        # the check's process launched and saved; the judge, which never imported the kernel, compares
        return judge.settle(kernel, result, judge_path)

    def check_pool(self, device: str):
        """Where checks on ``device`` keep their processes: on CPU one pool per process (the interpreter's
        imports take seconds), None with ``KINV_REUSE_WORKERS=0``."""
        from kinv.agent.tools.worker import pool as worker_pool

        return worker_pool.CHECKERS if device == "cpu" and worker_pool.reuse() else None

    def describe(self) -> str:
        return self.name

    def preflight(self, kernel: str, env: dict, levels: list[Level], arms: list[tuple[tuple, dict]] = ()) -> None:
        """Refuse, before anything is written, a measurement this backend cannot serve: raises NoRecording
        naming what is missing.  ``arms`` are :meth:`open` argument specs as :func:`open_arms` takes them
        (checked at every level); without them only what every arm needs (env, levels).  A GPU serves
        anything: nothing to check."""

    def prepare(self, arms: list[Arm], levels: list[Level]) -> None:
        """Set up every arm at every level (a backend spread over GPUs sets up each level where it runs)."""
        for a in arms:
            for lv in levels:
                a.setup(lv)

    def sample_round(self, arms: list[Arm], levels: list[Level], round_index: int,
                     orders: dict[str, list[int]]) -> dict[str, dict[int, dict]]:  # fmt: skip
        """One round: at each level, arm ``j`` for ``j`` in ``orders[level]``.  Returns ``{level: {j: sample}}``.
        Here every level in turn, in this process; the Ray backend times each level on the GPU that owns it,
        its levels on several GPUs at once, and both arms of a level always on that one GPU."""
        out: dict[str, dict[int, dict]] = {}
        for lv in levels:
            out[lv.key] = {j: arms[j].sample(lv, round_index) for j in orders[lv.key]}
        return out
