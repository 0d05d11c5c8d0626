"""Benchmark backends behind one interface, and the measurement loops that use them.

* ``cuda``: each variant ("arm") is a worker subprocess with its own
  environment and config (``agent/tools/bench_worker.py``): CUDA-graph replay,
  L2 rotation, correctness before timing, crash isolation.
* ``replay``: serves samples that the cuda backend recorded on a real GPU
  (``kernels/recordings/<gpu>/*.jsonl.gz``), selected by kernel, config hash,
  level and workload, so a whole investigation runs without a GPU.  It says
  so loudly, and refuses a config or level it has no recording of.
* ``auto``: cuda when a GPU is visible, replay otherwise.

Rounds pair the arms: in round r the baseline and the variant are measured
back to back, in ABBA order, so slow drifts hit both alike.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kinv.agent.tools import bench_worker
from kinv.agent.tools.worker_client import WorkerCrashed, WorkerError, WorkerProcess
from kinv.kernels.adapter import KERNELS_DIR, Level, get_adapter
from kinv.kernels.errors import BadInput, KinvError
from kinv.kernels.launch_config import config_hash, describe

BACKENDS = ("auto", "cuda", "replay")
RECORDINGS = KERNELS_DIR / "recordings"
ROUND_SEED0 = 1000
"""Round r of every arm draws its inputs from seed ROUND_SEED0 + r: the data are common to a round's arms
(and cancel in its paired log-ratio); the memory placement is each arm's own, re-drawn every round."""


class BackendError(KinvError, RuntimeError):
    """A backend cannot serve this request; one line, names what is valid."""


class NoRecording(BackendError, BadInput):
    """Replay cannot serve what was asked (a level, an env value, a config): bad input, exit 2."""


class NoDevice(BackendError, BadInput):
    """The backend asked for cannot run here (--backend cuda without a GPU): bad input, exit 2."""


class VariantFailed(BackendError):
    """The variant's worker crashed or the variant failed its gate: the variant's failure, not kinv's."""


def harness_hash() -> str:
    """Hash of the timing harness (the worker's own file)."""
    return bench_worker.harness_hash()


def reference_hash(kernel: str) -> str:
    """Hash of the kernel's reference and metric definitions as they are on disk now."""
    return bench_worker.reference_hash(get_adapter(kernel))


def kernel_hash(kernel: str) -> str:
    """Hash of the kernel's source files as they are on disk now (a source patch changes it)."""
    return bench_worker.kernel_source_hash(get_adapter(kernel))


def gpu_visible() -> bool:
    if os.environ.get("KINV_FORCE_NO_GPU"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# --------------------------------------------------------------------------- #
# interface
# --------------------------------------------------------------------------- #
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

    def close(self) -> None:
        pass


class Backend(ABC):
    name: str = ""
    loud: str = ""

    @abstractmethod
    def open(self, name: str, kernel: str, config: dict, env: dict, replica: int | None = None,
             pythonpath: list[str] | None = None, partner: dict | None = None,
             role: str = "variant") -> Arm:  # fmt: skip
        """Start an arm.  ``replica`` j names arm j of an A/A (independent workers of one config);
        ``partner`` is the config this arm is compared with in an A/B and ``role`` its side ("base" or
        "variant"): the replay backend serves the rounds recorded for that very pair; ``pythonpath`` puts a kernel source snapshot first (the
        baseline arm while a source patch is live)."""

    def copy_bandwidth(self) -> float | None:
        return None

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


# --------------------------------------------------------------------------- #
# cuda
# --------------------------------------------------------------------------- #
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
            r = self.worker.request("sample", key=s["key"], seed=ROUND_SEED0 + round_index)
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
            raise NoDevice("--backend cuda: no CUDA GPU visible; use --backend replay to serve samples recorded on an H200")
        self._copy = None

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant") -> Arm:
        return CudaArm(name, kernel, config, env, pythonpath)

    def copy_bandwidth(self) -> float:
        if self._copy is None:
            with WorkerProcess(label="copy") as w:
                self._copy = w.request("copy_bandwidth", mib=2048)["gbps"]
        return self._copy


# --------------------------------------------------------------------------- #
# replay
# --------------------------------------------------------------------------- #
class Recording:
    """All recorded samples of one directory (benchmarks/record.py), indexed by slot and level.

    A slot is ``(kind, pair, role)``: ``("ab", <variant config hash>, "base" | "variant")`` for the two
    workers of one variant's A/B (each variant has a baseline worker of its own), ``("aa", "aa", "A<j>")``
    for arm j of the A/A, and ``("sw", <config hash>, "R<j>")`` for worker j of a config in a campaign
    sweep (benchmarks/record.py --sweep: every config of the space timed in every round, so any two form a
    pair).  A pair recorded as such is served from its own file; any other pair of sweep configs from the
    sweep, base from R0 and variant from R1, so both sides of a pair always come from one recording session.  A cell maps recorded round -> sample row.  Each file records one kernel (its
    header says which); a Recording serves one kernel, :meth:`for_kernel` picks it.
    """

    def __init__(self, files: list[Path], kernel: str | None = None):
        self.files = files
        self.headers: list[dict] = []
        self.cells: dict[tuple[str, str, str, str], dict[int, dict]] = {}
        self.configs: dict[str, dict] = {}
        self.kernels: set[str] = set()
        # the configs of each sweep session (file), oldest first: a pair is served from one session only
        self.sweeps: list[set[str]] = []
        sweep_ix: int | None = None
        for f in files:
            with gzip.open(f, "rt") as fh:
                header = None
                for line in fh:
                    row = json.loads(line)
                    kind = row.get("type")
                    if kind == "header":
                        if row.get("version", 1) < 2:
                            raise BackendError(f"{f} is a version-1 recording (one fixed allocation per worker, "
                                               "rounds wrapped around); re-record it with benchmarks/record.py")
                        header = row
                        self.kernels.add(row.get("kernel", ""))
                        if kernel is not None and row.get("kernel") != kernel:
                            break  # another kernel's recording
                        self.headers.append(row)
                        for cfg in row.get("configs", {}).values():
                            self.configs[config_hash(cfg)] = cfg
                        sweep_ix = None
                        if row.get("sweep"):
                            sweep_ix = len(self.sweeps)
                            self.sweeps.append(set())
                    elif kind == "sample" and header is not None:
                        pair = row["pair"]
                        if row["kind"] == "sw" and sweep_ix is not None:
                            # one config may be in several sweeps: its workers are kept apart per session
                            self.sweeps[sweep_ix].add(pair)
                            pair = f"{pair}@{sweep_ix}"
                        key = (row["kind"], pair, row["role"], row["level"])
                        self.cells.setdefault(key, {})[row["round"]] = row
        if not self.headers:
            if kernel is not None and self.kernels:
                raise NoRecording(f"replay has no recording of kernel {kernel!r}; recorded kernels: "
                                  f"{', '.join(sorted(self.kernels))} (record it on a GPU: benchmarks/record.py)")
            raise BackendError(f"no recordings found in {', '.join(map(str, files)) or RECORDINGS}")

    @property
    def fingerprint(self) -> dict:
        return self.headers[0]["fingerprint"]

    def in_sweep(self, chash: str) -> bool:
        return any(chash in hashes for hashes in self.sweeps)

    def _session(self, chash: str, partner_hash: str | None) -> int | None:
        """The sweep session that serves ``chash`` (with ``partner_hash``, one that holds both): the oldest
        such, so a newer recording never changes which workers serve a pair an older one already served."""
        order = sorted(range(len(self.sweeps)), key=lambda i: self._sweep_created(i))
        for i in order:
            if chash in self.sweeps[i] and (partner_hash is None or partner_hash in self.sweeps[i]):
                return i
        return None

    def _sweep_created(self, i: int) -> float:
        sweeps = [h for h in self.headers if h.get("sweep")]
        return float(sweeps[i].get("created") or 0.0)

    @property
    def slots(self) -> set[tuple[str, str, str]]:
        if not hasattr(self, "_slots"):
            self._slots = {k[:3] for k in self.cells}
        return self._slots

    def sweep_slot(self, chash: str, partner_hash: str | None, replica: int | None, role: str):
        """The sweep worker that serves this arm, or None when the sweep does not cover it."""
        i = self._session(chash, partner_hash)
        if i is None:
            return None
        j = replica if replica is not None else (1 if role == "variant" and partner_hash is not None else 0)
        slot = ("sw", f"{chash}@{i}", f"R{j}")
        if slot not in self.slots:
            have = sorted(k[2] for k in self.slots if k[:2] == ("sw", f"{chash}@{i}"))
            raise NoRecording(f"replay has {len(have)} sweep workers of {describe(self.configs[chash])}; worker "
                              f"{j} was asked for (lower stats.aa_arms to {len(have)})")  # fmt: skip
        return slot

    def slot_for(self, chash: str, partner_hash: str | None, replica: int | None,
                 role: str = "variant", partner_cfg: dict | None = None) -> tuple[str, str, str]:
        """The recorded slot that serves an arm of config ``chash``; NoRecording names what exists (the
        partner by its label: ``partner_cfg`` when the recording does not hold it)."""
        try:
            return self._pair_slot(chash, partner_hash, replica, role, partner_cfg)
        except NoRecording:
            slot = self.sweep_slot(chash, partner_hash, replica, role)
            if slot is None:
                raise
            return slot

    def _pair_slot(self, chash, partner_hash, replica, role, partner_cfg=None) -> tuple[str, str, str]:
        if partner_hash is None and replica is None and self.in_sweep(chash):
            return self.sweep_slot(chash, None, None, role)  # a lone arm (kinv bench, a screening): a sweep's worker
        if chash not in self.configs:
            known = ", ".join(f"{describe(c)} ({h})" for h, c in sorted(self.configs.items()))
            raise NoRecording(f"replay has no recording of config {chash}; recorded configs: {known}")
        if replica is not None:
            slot = ("aa", "aa", f"A{replica}")
            if not any(k[:3] == slot for k in self.cells):
                arms = sorted({k[2] for k in self.cells if k[0] == "aa"})
                raise NoRecording(f"replay has no A/A arm {replica}; recorded A/A arms: {', '.join(arms) or 'none'} "
                                  "(lower stats.aa_arms)")
            return slot
        if partner_hash is not None and partner_hash == chash and self._aa_hash() == chash:
            # the same config on both sides (a source-only variant): two independent workers of it, the A/A's
            return ("aa", "aa", "A0" if role == "base" else "A1")
        if partner_hash is not None:
            if role == "variant" and ("ab", chash, "variant") in {k[:3] for k in self.cells}:
                return ("ab", chash, "variant")
            if role == "base" and ("ab", partner_hash, "base") in {k[:3] for k in self.cells}:
                return ("ab", partner_hash, "base")
            pairs = ", ".join(describe(self.configs[k[1]]) for k in sorted({k[:3] for k in self.cells})
                              if k[0] == "ab" and k[2] == "variant" and k[1] in self.configs)
            other = self.configs.get(partner_hash) or partner_cfg
            raise NoRecording(f"replay has no A/B of {describe(self.configs[chash])} against "
                              f"{describe(other) if other else 'config ' + partner_hash}"
                              f"; recorded A/B variants: {pairs}")
        # a lone arm (kinv bench): the config's own variant worker, else A/A arm 0
        for slot in (("ab", chash, "variant"), ("aa", "aa", "A0")):
            if slot in {k[:3] for k in self.cells} and (slot[0] == "ab" or self._aa_hash() == chash):
                return slot
        raise NoRecording(f"replay has no lone recording of {describe(self.configs[chash])}")

    def _aa_hash(self) -> str | None:
        row = next((c for k, c in self.cells.items() if k[0] == "aa"), None)
        return next(iter(row.values()))["config_hash"] if row else None

    def levels(self, slot: tuple[str, str, str]) -> list[str]:
        return sorted({k[3] for k in self.cells if k[:3] == slot})

    def cell(self, slot: tuple[str, str, str], level_key: str) -> dict[int, dict]:
        cell = self.cells.get((*slot, level_key))
        if cell:
            return cell
        raise NoRecording(f"replay has no recording at {level_key}; recorded levels: {', '.join(self.levels(slot))}")


class ReplayArm(Arm):
    def __init__(self, name, kernel, config, env, recording: Recording, slot):
        """``slot`` is the recorded slot, or a function of the level giving it (a level-conditional config
        runs a different config at each level)."""
        super().__init__(name=name, kernel=kernel, config=config, env=env)
        self.rec = recording
        self.slot_at = slot if callable(slot) else (lambda _level, _s=slot: _s)
        self.fingerprint = recording.fingerprint
        self.env_seen = dict(recording.headers[0].get("env", {}))

    def setup(self, level: Level) -> dict:
        cell = self.rec.cell(self.slot_at(level), level.key)
        first = cell[min(cell)]
        s = {"level": level.key, "derived_env": first.get("derived_env", {}), "rounds_recorded": len(cell),
             "correct": True, "replayed": True}  # fmt: skip
        self.setups[level.key] = s
        return s

    def sample(self, level: Level, round_index: int) -> dict:
        cell = self.rec.cell(self.slot_at(level), level.key)
        row = cell.get(round_index)
        if row is None:  # never wrap around: a re-used round is not an independent replicate
            raise NoRecording(f"replay has {len(cell)} recorded rounds of {describe(self.config)} at {level.key}; "
                              f"round {round_index + 1} was asked for: set stats.max_rounds / aa_rounds to at most "
                              f"{len(cell)}, or record more rounds (benchmarks/record.py)")
        return {
            "us": row["us"], "replays": row["replays"], "gpu_s": row["gpu_s"], "t": row["t"],
            "derived_env": row.get("derived_env", {}), "harness_hash": self.rec.headers[0]["harness_hash"],
            "recorded_round": row["round"], "env_seen": row.get("env", {}),
        }  # fmt: skip


class ReplayBackend(Backend):
    name = "replay"

    def __init__(self, directory: Path | None = None):
        directory = Path(directory or os.environ.get("KINV_RECORDINGS") or RECORDINGS)
        files = sorted(directory.rglob("*.jsonl.gz"))
        if not files:
            raise NoRecording(f"replay backend: no recordings under {directory}"
                              + (" (set by KINV_RECORDINGS)" if os.environ.get("KINV_RECORDINGS") else "")
                              + "; point KINV_RECORDINGS at a directory of *.jsonl.gz recordings, or record them "
                              "with benchmarks/record.py")
        self.files = files
        self.recording = Recording(files)
        self._by_kernel: dict[str, Recording] = {}
        fp = self.recording.fingerprint
        self.loud = (
            f"REPLAY backend: no GPU is measured; serving samples recorded on {fp.get('gpu')} "
            f"({fp.get('sms')} SMs, torch {fp.get('torch')}, triton {fp.get('triton')})"
        )

    def for_kernel(self, kernel: str) -> Recording:
        name = get_adapter(kernel).name
        if name not in self._by_kernel:
            self._by_kernel[name] = Recording(self.files, name)
        return self._by_kernel[name]

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant") -> Arm:
        rec = self.for_kernel(kernel)
        recorded = rec.headers[0].get("kernel_hash")
        if recorded and pythonpath is None and kernel_hash(kernel) != recorded:
            raise NoRecording(f"replay has no recording of this {kernel} source (sha {kernel_hash(kernel)}; recorded "
                              f"{recorded}): a source change must be measured on a GPU (--backend cuda)")
        recorded_env = rec.headers[0].get("env", {})
        for k, v in env.items():
            if recorded_env.get(k) != str(v):
                raise NoRecording(f"replay has no recording with {k}={v!r}; the recordings ran with {k}={recorded_env.get(k)!r}")
        # a partner that only the sweep serves (level-conditional, never recorded as such): this arm comes from
        # that sweep too, so both sides of the pair are of one recording session
        sweep_partner = bool(partner and partner.get("overrides") and config_hash(partner) not in rec.configs)
        try:  # a config (level-conditional or not) recorded as such: its own slot
            if sweep_partner:
                raise NoRecording(f"replay has no recording of {describe(partner)} as such")
            slot = rec.slot_for(config_hash(config), config_hash(partner) if partner else None, replica, role,
                                partner)
            return ReplayArm(name, kernel, config, env, rec, slot)
        except NoRecording:
            if not config.get("overrides") and not (partner or {}).get("overrides"):
                raise
        # a level-conditional config: at each level the sweep's worker of the config that runs there
        from kinv.agent.tools.space import effective

        adapter = get_adapter(kernel)

        def slot_at(level: Level):
            mine = config_hash(effective(adapter, config, level))
            other = config_hash(effective(adapter, partner, level)) if partner else None
            slot = rec.sweep_slot(mine, other, replica, role)
            if slot is None:
                if other is not None and rec.in_sweep(mine) and rec.in_sweep(other):
                    raise NoRecording(f"replay has no one recording session that holds both {describe(config)} and "
                                      f"{describe(partner)} at {level.key} (a pair is never served across sessions): "
                                      "measure it on a GPU (--backend cuda)")  # fmt: skip
                raise NoRecording(f"replay has no recording of {describe(config)} at {level.key} (a level-conditional "
                                  "config is served level by level from a sweep recording): measure it on a GPU "
                                  "(--backend cuda), which can record it for replay, or on replay time a recorded "
                                  "config (kinv bench --config FILE)")  # fmt: skip
            return slot

        return ReplayArm(name, kernel, config, env, rec, slot_at)

    def preflight(self, kernel: str, env: dict, levels: list[Level], arms: list[tuple[tuple, dict]] = ()) -> None:
        rec = self.for_kernel(kernel)
        recorded_env = rec.headers[0].get("env", {})
        for k, v in env.items():
            if recorded_env.get(k) != str(v):
                raise NoRecording(f"replay has no recording with {k}={v!r}; the recordings ran with {k}={recorded_env.get(k)!r}")
        have = {k[3] for k in rec.cells}
        for lv in levels:
            if lv.key not in have:
                raise NoRecording(f"replay has no recording at {lv.key}; recorded levels: {', '.join(sorted(have))}")
        for args, kwargs in arms:
            arm = self.open(*args, **kwargs)
            for lv in levels:
                rec.cell(arm.slot_at(lv), lv.key)

    def copy_bandwidth(self) -> float | None:
        return self.recording.headers[0].get("copy_gbps")


def get_backend(name: str) -> Backend:
    """Resolve ``auto|cuda|replay``; auto says which it picked through ``.loud``."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "auto":
        return CudaBackend() if gpu_visible() else ReplayBackend()
    return CudaBackend() if name == "cuda" else ReplayBackend()


# --------------------------------------------------------------------------- #
# measurement loops (they store every sample)
# --------------------------------------------------------------------------- #
def _sample_row(exp_id, arm: Arm, level: Level, round_index: int, tag: str, s: dict, backend: str,
                hashes: tuple[str, str], device: str | None) -> dict:  # fmt: skip
    return {
        "experiment": exp_id, "round": round_index, "arm": tag, "level": level.key, "config_hash": arm.config_hash,
        "us": s["us"], "replays": s.get("replays"), "gpu_s": s.get("gpu_s"), "harness_hash": hashes[0],
        "reference_hash": hashes[1], "env": {"seen": arm.env_seen, "derived": s.get("derived_env", {})},
        "backend": backend, "device": device, "place": s.get("place"), "t": time.time(),
    }  # fmt: skip


@dataclass
class PairedRounds:
    """Samples of two arms, paired by round: level -> (a_us list, b_us list)."""

    a: dict[str, list[float]] = field(default_factory=dict)
    b: dict[str, list[float]] = field(default_factory=dict)
    gpu_s: float = 0.0
    rounds: int = 0

    def add(self, level: str, a_us: float, b_us: float) -> None:
        self.a.setdefault(level, []).append(a_us)
        self.b.setdefault(level, []).append(b_us)


def paired_round(store, exp_id, backend: Backend, arm_a: Arm, arm_b: Arm, levels: list[Level], round_index: int,
                 acc: PairedRounds, device: str | None, tags=("A", "B")) -> dict[str, tuple[float, float]]:  # fmt: skip
    """One round: every level, A then B on even rounds, B then A on odd (ABBA).

    Every sample carries the harness and reference hashes as they are on disk during the round
    (a variant that changes either is caught).  Returns ``{level: (a_us, b_us)}`` of this round,
    the shape agent.stats.run_sequential wants.
    """
    from kinv.agent.stats import abba_order

    hashes = (harness_hash(), reference_hash(arm_a.kernel))
    rows, pairs = [], {}
    order = [0 if who == "A" else 1 for who in abba_order(round_index)]
    got = backend.sample_round([arm_a, arm_b], levels, round_index, {lv.key: order for lv in levels})
    for level in levels:
        for j in order:
            s = got[level.key][j]
            acc.gpu_s += s.get("gpu_s") or 0.0
            rows.append(_sample_row(exp_id, (arm_a, arm_b)[j], level, round_index, tags[j], s, backend.name, hashes,
                                    _device_of(store, s, device)))  # fmt: skip
        a_us, b_us = got[level.key][0]["us"], got[level.key][1]["us"]
        acc.add(level.key, a_us, b_us)
        pairs[level.key] = (a_us, b_us)
    store.add_samples(rows)  # the round's samples commit together
    acc.rounds = round_index + 1
    return pairs


def aa_round(store, exp_id, backend: Backend, arms: list[Arm], levels: list[Level], round_index: int,
             acc: dict[str, list[list[float]]], device: str | None) -> float:  # fmt: skip
    """One A/A round: every arm at every level, in an order rotated by the round.  Arm j is stored as
    ``A<j>``; ``acc[level][j]`` collects its times.  Returns the GPU seconds spent."""
    hashes = (harness_hash(), reference_hash(arms[0].kernel))
    rows, gpu_s = [], 0.0
    k = round_index % len(arms)
    order = list(range(len(arms)))[k:] + list(range(len(arms)))[:k]
    got = backend.sample_round(arms, levels, round_index, {lv.key: order for lv in levels})
    for level in levels:
        per = acc.setdefault(level.key, [[] for _ in arms])
        for j in order:
            s = got[level.key][j]
            gpu_s += s.get("gpu_s") or 0.0
            per[j].append(s["us"])
            rows.append(_sample_row(exp_id, arms[j], level, round_index, f"A{j}", s, backend.name, hashes,
                                    _device_of(store, s, device)))  # fmt: skip
    store.add_samples(rows)  # the round's samples commit together
    return gpu_s


def _device_of(store, s: dict, default: str | None) -> str | None:
    """The device row of a sample: the GPU that timed it when the backend says so (Ray), else the arm's."""
    return store.device(s["fingerprint"]) if s.get("fingerprint") else default


def open_arms(backend: Backend, specs: list[tuple[tuple, dict]]) -> list[Arm]:
    """``backend.open(*args, **kwargs)`` for each spec, all at once (a worker's start, imports and CUDA context
    take seconds, and the arms of a measurement need not wait for each other).  If any fails, the others are
    closed and the first failure, in spec order, is raised."""
    from concurrent.futures import ThreadPoolExecutor

    if len(specs) == 1:
        return [backend.open(*specs[0][0], **specs[0][1])]

    def one(spec):
        try:
            return backend.open(*spec[0], **spec[1]), None
        except Exception as exc:  # noqa: BLE001 - re-raised below, in spec order
            return None, exc

    with ThreadPoolExecutor(len(specs)) as pool:
        got = list(pool.map(one, specs))
    failed = next((exc for _a, exc in got if exc is not None), None)
    if failed is not None:
        for a, _exc in got:
            if a is not None:
                a.close()
        raise failed
    return [a for a, _exc in got]


def stored_rounds(store, exp_id: int, tags: list[str]) -> dict[int, dict[str, list[float]]]:
    """Rounds of an experiment already committed: round -> level -> [time of each tag] (complete rounds only)."""
    by: dict = {}
    for s in store.samples(exp_id):
        by.setdefault(s["round"], {}).setdefault(s["level"], {})[s["arm"]] = s["us"]
    return {r: {lv: [v[t] for t in tags] for lv, v in levels.items()} for r, levels in by.items()
            if all(all(t in v for t in tags) for v in levels.values())}  # fmt: skip


def run_aa(store, exp_id: int, backend: Backend, kernel: str, config: dict, env: dict, levels: list[Level],
           rounds: int, n_arms: int, on_round: Callable | None = None) -> tuple[dict[str, list[list[float]]], float]:  # fmt: skip
    """The A/A: ``n_arms`` workers of ``config`` timed at every level in every round (rounds already stored
    for ``exp_id`` are reused: a killed run resumes).  Returns ``({level: [times of arm j]}, GPU s spent)``.
    The graph's noise node and ``kinv noise`` both run this."""
    done = stored_rounds(store, exp_id, [f"A{j}" for j in range(n_arms)])
    acc: dict[str, list[list[float]]] = {lv.key: [[] for _ in range(n_arms)] for lv in levels}
    arms: list[Arm] = []
    gpu_s = 0.0
    try:
        for r in range(rounds):
            if r in done:
                for lv, times in done[r].items():
                    for j, us in enumerate(times):
                        acc[lv][j].append(us)
                continue
            if not arms:
                arms = open_arms(backend, [((f"A{j}", kernel, config, env), {"replica": j}) for j in range(n_arms)])
                backend.prepare(arms, levels)
            gpu_s += aa_round(store, exp_id, backend, arms, levels, r, acc, store.device(arms[0].fingerprint))
            if on_round:
                on_round(r)
    finally:
        for a in arms:
            a.close()
    return acc, gpu_s


def run_ab(store, exp_id: int, backend: Backend, kernel: str, base_cfg: dict, var_cfg: dict, env: dict,
           levels: list[Level], thresholds: dict[str, float], plan, offset_sd: dict[str, float] | None = None,
           n_variants: int = 1, base_pythonpath: list[str] | None = None, on_open: Callable | None = None,
           on_round: Callable | None = None, names: tuple[str, str] = ("baseline", "variant")):  # fmt: skip
    """The sequential A/B of ``var_cfg`` against ``base_cfg`` (agent.stats.run_sequential over paired ABBA
    rounds; committed rounds of ``exp_id`` are reused).  ``on_open(arm)`` sees every arm once it has started
    (the env check).  Returns ``(SequentialResult, GPU s spent in this call)``.  The graph's measure node
    and ``kinv bench --variant`` both run this."""
    from kinv.agent import stats

    done = {r: {lv: tuple(v) for lv, v in lvs.items()} for r, lvs in stored_rounds(store, exp_id, ["A", "B"]).items()}
    arms: list[Arm] = []
    acc = PairedRounds()

    def start() -> None:
        arms.extend(open_arms(backend, [
            ((names[0], kernel, base_cfg, env), {"pythonpath": base_pythonpath, "partner": var_cfg, "role": "base"}),
            ((names[1], kernel, var_cfg, env), {"partner": base_cfg})]))  # fmt: skip
        for a in arms:
            if on_open:
                on_open(a)
        backend.prepare(arms, levels)

    def sample_fn(r: int) -> dict:
        if r in done:
            return done[r]
        if not arms:
            start()
        pairs = paired_round(store, exp_id, backend, arms[0], arms[1], levels, r, acc, store.device(arms[0].fingerprint))
        if on_round:
            on_round(r)
        return pairs

    try:
        res = stats.run_sequential(sample_fn, [lv.key for lv in levels], thresholds, plan, offset_sd=offset_sd,
                                   n_variants=n_variants)  # fmt: skip
    finally:
        for a in arms:
            a.close()
    return res, acc.gpu_s


def verdict_rows(result) -> list[dict]:
    """Rows of the verdicts table from an agent.stats.SequentialResult."""
    rows = []
    for level, e in result.effects.items():
        base_us, var_us = result.samples.get(level, ([], []))
        rows.append({"level": level, "n": e.n, "base_us": statistics.median(base_us) if base_us else None,
                     "variant_us": statistics.median(var_us) if var_us else None, "effect": e.effect,
                     "ci_low": e.ci_low, "ci_high": e.ci_high, "ratio": e.ratio, "threshold": e.threshold,
                     "verdict": e.verdict, "conf": e.conf, "offset_sd": e.offset_sd})  # fmt: skip
    return rows


def measure_config(store, exp_id, backend: Backend, kernel: str, config: dict, env: dict, levels: list[Level],
                   samples: int = 5, on_level: Callable | None = None) -> list[dict]:  # fmt: skip
    """``kinv bench`` of one config: per level µs, GB/s, fraction of copy bandwidth, throughput in the adapter's
    unit; all stored."""
    adapter = get_adapter(kernel)
    copy = backend.copy_bandwidth()
    hashes = (harness_hash(), reference_hash(kernel))
    arm = backend.open("config", kernel, config, env)
    device = store.device(arm.fingerprint) if arm.fingerprint else None
    out = []
    try:
        for level in levels:
            setup = arm.setup(level)
            rows, us = [], []
            for r in range(samples):
                s = arm.sample(level, r)
                us.append(s["us"])
                rows.append(_sample_row(exp_id, arm, level, r, "A", s, backend.name, hashes, device))
            store.add_samples(rows)
            med = statistics.median(us)
            gbps = adapter.bytes_moved(level) / (med * 1e-6) / 1e9
            m = {"level": level.key, "config": describe(config), "us": med, "gbps": gbps,
                 "frac_copy": gbps / copy if copy else None, "throughput": adapter.throughput(level, med),
                 "throughput_unit": adapter.throughput_unit, "tflops": adapter.flops(level) / (med * 1e-6) / 1e12,
                 "copy_gbps": copy, "n": samples,
                 "cv": statistics.pstdev(us) / statistics.mean(us) if len(us) > 1 else 0.0,
                 "derived_env": setup.get("derived_env", {})}  # fmt: skip
            peer = adapter.peer(level, (arm.fingerprint or {}).get("gpu"))
            if peer:  # a reference figure of the kernel a user would pick instead (not measured here)
                m.update(peer=peer["peer"], peer_us=peer["us"], vs_peer=peer["us"] / med)
            store.add_measurements(exp_id, [{k: v for k, v in m.items() if k not in ("cv", "derived_env", "tflops", "peer", "peer_us", "vs_peer")}])
            out.append(m)
            if on_level:
                on_level(m)
    finally:
        arm.close()
    return out

