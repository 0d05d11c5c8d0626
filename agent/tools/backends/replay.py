"""The replay backend: serves samples that the cuda backend recorded on a real GPU
(``kernels/recordings/<gpu>/*.jsonl.gz``), selected by kernel, config hash, level and workload, so a whole
investigation runs without a GPU.  It says so loudly, and refuses a config or level it has no recording of.

A kernel with no recording there is looked for in its adapter's own package (``<package>/recordings/<gpu>/
*.jsonl.gz``): a plugin ships its recordings beside its configs.  The banner, the copy bandwidth and the sidecars
are then that kernel's recordings' own."""

from __future__ import annotations

import os
from pathlib import Path

from kinv.agent.errors import BackendError, NoRecording
from kinv.agent.tools.backends.base import RECORDINGS, Arm, Backend
from kinv.agent.tools.backends.replay_index import Recording
from kinv.agent.tools.worker.hashes import kernel_hash
from kinv.kernels.adapter import Level, get_adapter
from kinv.kernels.launch_config import config_hash, describe, effective

COMPILED = "compiled.json"  # beside the recordings: {kernel: {config hash: {level key: compiled figures}}}
PROFILES = "profiles.json"  # beside the recordings: {kernel: {config hash: {level key: profile figures}}}


_SIDECARS: dict[tuple, dict] = {}  # (file, size, mtime) -> its parsed content: arms set up at every level read it


def sidecar(directory: Path, kernel: str, name: str = COMPILED) -> dict:
    """What was recorded beside the samples (benchmarks/record_compiled.py) for ``kernel``: the compiled figures
    (``name=COMPILED``) or the profiles (``PROFILES``), by config hash and level key; ``{}`` without them.  Parsed
    once per process while the file is unchanged."""
    import json

    f = Path(directory) / name
    if not f.is_file():
        return {}
    st = f.stat()
    key = (str(f), st.st_size, st.st_mtime_ns)
    if key not in _SIDECARS:
        _SIDECARS[key] = json.loads(f.read_text())
    return _SIDECARS[key].get(get_adapter(kernel).name, {})


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
        figs = sidecar(self.rec.files[0].parent, self.kernel).get(config_hash(self.config), {}).get(level.key)
        if figs:
            s["compiled"] = figs
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
        self.directory = directory.resolve()
        files = sorted(directory.rglob("*.jsonl.gz"))
        if not files:
            raise NoRecording(f"replay backend: no recordings under {directory}"
                              + (" (set by KINV_RECORDINGS)" if os.environ.get("KINV_RECORDINGS") else "")
                              + "; point KINV_RECORDINGS at a directory of *.jsonl.gz recordings, or record them "
                              "with benchmarks/record.py")
        self.files = files
        self._by_kernel: dict[str, Recording] = {}
        self._use(Recording.first_header(files))  # the samples are read per kernel (for_kernel)

    def _use(self, header: dict, where: Path | None = None) -> None:
        """The banner and the copy bandwidth of the recordings being served: ``header``'s (a kernel's first, once
        one is asked for; ``where``: its own recordings directory, when they come from there)."""
        self.header = header
        fp = header["fingerprint"]
        self.loud = (
            f"REPLAY backend: no GPU is measured; serving samples recorded on {fp.get('gpu')} "
            f"({fp.get('sms')} SMs, torch {fp.get('torch')}, triton {fp.get('triton')})"
            + (f" from the kernel's own recordings ({where})" if where else "")
        )

    def for_kernel(self, kernel: str) -> Recording:
        adapter = get_adapter(kernel)
        name = adapter.name
        if name not in self._by_kernel:
            try:
                self._by_kernel[name] = Recording.load(self.files, name)
            except NoRecording as exc:
                own = adapter.package_dir() / "recordings"
                files = sorted(own.rglob("*.jsonl.gz")) if own.is_dir() and own.resolve() != self.directory else []
                try:
                    self._by_kernel[name] = Recording.load(files, name)
                except BackendError:  # NoRecording (other kernels' recordings there) or none at all
                    raise NoRecording(f"{exc}; nor are there any in the kernel's own {own}") from None
        rec = self._by_kernel[name]
        own = rec.files[0].parent if rec.files[0] not in self.files else None
        self._use(rec.headers[0], own)
        return rec

    def open(self, name, kernel, config, env, replica=None, pythonpath=None, partner=None, role="variant", judge_path=None) -> Arm:
        rec = self.for_kernel(kernel)
        recorded = rec.headers[0].get("kernel_hash")
        # a snapshot (a baseline's, a revision's) is named by its kernel source hash: it must be the recorded one too
        source = Path(pythonpath[0]).name if pythonpath else kernel_hash(kernel)
        if recorded and source != recorded:
            where = f" in {pythonpath[0]}" if pythonpath else ""
            raise NoRecording(f"replay has no recording of this {kernel} source (sha {source}{where}; recorded "
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
        return self.header.get("copy_gbps")

    def ceilings(self) -> dict:
        """The ceilings recorded with the samples (copy bandwidth; the yardstick and matrix peak where the
        recording has them); a matrix peak it lacks falls back to the device table's constant, said so."""
        gpu = (self.header.get("fingerprint") or {}).get("gpu") or "the recording's GPU"
        return {"copy_gbps": self.copy_bandwidth(), "yard_gbps": self.header.get("yard_gbps"),
                "matrix_tflops": self.header.get("matrix_tflops") or {}, "measured": False,
                "source": f"replayed: recorded on {gpu}, not measured here"}  # fmt: skip

    def profile(self, adapter, config: dict, level: Level, env: dict) -> tuple[dict | None, str, float]:
        rec = sidecar(self.for_kernel(adapter.name).files[0].parent, adapter.name, PROFILES)
        if not rec:
            return None, f"replay has no recorded profiles of {adapter.name}; the profile step was skipped", 0.0
        got = rec.get(config_hash(config), {}).get(level.key)
        if not got:
            return None, f"replay has no recorded profile of {describe(config)} at {level.key}", 0.0
        return got, "", 0.0

    def compiled(self, kernel: str, config: dict, env: dict, levels: list[Level]) -> dict | None:
        got = sidecar(self.for_kernel(kernel).files[0].parent, kernel).get(config_hash(config), {})
        out = {lv.key: got[lv.key] for lv in levels if lv.key in got}
        return out or None
