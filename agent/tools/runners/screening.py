"""Screening a batch of candidates against one incumbent worker, on one GPU: the unit a campaign spreads.

``screen_shard`` touches no store: it opens the arms (a worker per config on the GPU this process sees, or the
replay's recorded workers), times every arm at every level in every round on the protocol's round loop
(agent.tools.protocol.RoundLoop, its order rotated by the round), and returns a :class:`Shard`: the sample rows,
each candidate as a :class:`~kinv.agent.store.screened.Screened` (measured: its paired per-level change against the
incumbent *of the same GPU*; or failed), the lost samples and the ledger.  The campaign's driver stores them and
tells the optimizer; the same function runs in-process (one GPU) or inside a Ray actor that holds one GPU
(agent/tools/runners/executor.py).  Results from different GPUs meet only as these per-GPU paired effects, never as pooled
raw times.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kinv.agent.errors import IncumbentFailed
from kinv.agent.store.screened import Screened
from kinv.agent.tools.measure.protocol import Ledger, RoundLoop, sample_row, screen_effect


@dataclass
class Shard:
    """What a shard measured: the sample rows to store, each candidate's outcome (measured or failed), the lost
    samples' events to record, and its ledger (every sample it took, lost ones included)."""

    rows: list[dict]
    screened: list[Screened]
    lost: list[dict] = field(default_factory=list)  # a sample.lost event's data each (the first of a level's
    ledger: Ledger = field(default_factory=Ledger)  # round carries the GPU s it did not keep)
    fingerprint: dict | None = None
    where: str = "local"

    @property
    def gains(self) -> dict[str, dict[str, float]]:
        return {s.config_hash: s.gains for s in self.screened if s.status == "measured"}

    @property
    def intervals(self) -> dict[str, dict[str, list[float | None]]]:
        return {s.config_hash: s.gain_ci for s in self.screened if s.status == "measured"}

    @property
    def failed(self) -> dict[str, str]:
        return {s.config_hash: s.reason for s in self.screened if s.status == "failed"}

    @property
    def gpu_s(self) -> float:
        return self.ledger.gpu_s

    def __getitem__(self, name: str):
        """A part read by its name (``shard["gains"]``)."""
        return getattr(self, name)


def screen_shard(backend: str, kernel: str, env: dict, incumbent: dict, candidates: dict[str, dict],
                 levels: list[dict], rounds: int, round0: int, exp: int, where: str = "local") -> Shard:  # fmt: skip
    """Time ``candidates`` (config hash -> config) against ``incumbent`` in ``rounds`` rounds from ``round0``, on
    the protocol's round loop (agent.tools.protocol.RoundLoop: every arm at every level, rotated by the round).

    Each measured candidate's change is the protocol's paired estimate (agent.tools.protocol.screen_effect)
    against the incumbent's samples of the same rounds, with its 95% interval (None bounds after a single
    round).  A lost sample leaves that arm without a pair in its round (the others keep theirs); a candidate
    whose worker fails is dropped from the shard, failed with the reason.
    """
    from kinv.agent.errors import NoRecording, VariantFailed
    from kinv.agent.tools.runners import bench
    from kinv.agent.tools.worker.hashes import harness_hash, kernel_reference_hash
    from kinv.kernels.adapter import get_adapter

    _fault("screen", where)
    be = bench.get_backend(backend)
    adapter = get_adapter(kernel)
    lvs = [adapter.level(d) for d in levels]

    def start(args):
        name, cfg = args
        try:  # a candidate over environment variables carries them under "env" (agent/campaign/screen.py)
            arm = be.open(name, kernel, {k: v for k, v in cfg.items() if k != "env"}, {**env, **cfg.get("env", {})})
            for lv in lvs:
                arm.setup(lv)
            return arm, None
        except (VariantFailed, NoRecording) as exc:  # replay has no recording of it: not measured
            return None, str(exc)

    names = [("incumbent", incumbent)] + [(f"C:{h}", cfg) for h, cfg in candidates.items()]
    with ThreadPoolExecutor(min(8, len(names))) as pool:
        started = list(pool.map(start, names))
    failed: dict[str, str] = {}
    try:
        inc, err = started[0]
        if inc is None:
            raise IncumbentFailed(f"the incumbent's worker failed on {where}: {err}")
        keys, arms = ["incumbent"], [inc]  # the loop's arms, and whose each is (dropped together)
        for h, (arm, err) in zip(candidates, started[1:]):
            if arm is None:
                failed[h] = err
            else:
                keys.append(h)
                arms.append(arm)
        hashes = (harness_hash(), kernel_reference_hash(kernel))
        times = {h: {lv.key: ([], []) for lv in lvs} for h in keys[1:]}  # (incumbent, candidate) per paired round

        def sample_round(arms_now, levels, round_index, orders):
            """Each arm in turn at each level; a candidate whose worker fails is not asked again."""
            out = {}
            for lv in levels:
                out[lv.key] = {}
                for j in orders[lv.key]:
                    if keys[j] in failed:
                        continue
                    try:
                        out[lv.key][j] = arms_now[j].sample(lv, round_index)
                    except VariantFailed as exc:
                        if j == 0:
                            raise IncumbentFailed(f"the incumbent's worker failed on {where}: {exc}") from None
                        failed[keys[j]] = str(exc)
            return out

        rows, lost = [], []
        place = None if where == "local" else where  # which GPU timed it (a Ray actor's)

        def stored(rnd) -> None:
            for lv in lvs:
                kept = rnd.kept(lv.key)
                for j, smp in kept.items():
                    tag = "I" if j == 0 else f"C{keys[j][:6]}"
                    rows.append(sample_row(exp, arms[j], lv, rnd.index, tag, {**smp, "place": place}, be.name, hashes,
                                           None))  # fmt: skip
                unkept = sum(s.get("gpu_s") or 0.0 for s in rnd.unkept(lv.key))
                for i, j in enumerate(rnd.lost(lv.key)):
                    lost.append({"experiment": exp, "arm": keys[j], "level": lv.key, "round": rnd.index,
                                 "why": rnd.got[lv.key][j]["lost"], "gpu_s": unkept if i == 0 else 0.0})  # fmt: skip
                if 0 in kept:
                    for j in kept:
                        if j:
                            times[keys[j]][lv.key][0].append(kept[0]["us"])
                            times[keys[j]][lv.key][1].append(kept[j]["us"])
            for j in reversed(range(1, len(arms))):  # a failed candidate leaves the loop
                if keys[j] in failed:
                    keys.pop(j)
                    arms.pop(j).close()

        loop = RoundLoop(arms, lvs, whole=False, round0=round0, sample_round=sample_round)
        loop.run(range(rounds), stored)
        screened = []
        for h in keys[1:]:
            est = {k: screen_effect(a, b, k) for k, (a, b) in times[h].items()}
            screened.append(Screened(config_hash=h, status="measured", gains={k: e["gain"] for k, e in est.items()},
                                     gain_ci={k: [e["ci_low"], e["ci_high"]] for k, e in est.items()},
                                     measured_on=where))  # fmt: skip
        screened += [Screened(config_hash=h, status="failed", reason=why) for h, why in failed.items()]
        return Shard(rows, screened, lost, loop.ledger, inc.fingerprint, where)
    finally:
        for arm, _err in started:
            if arm is not None:
                arm.close()
        if hasattr(be, "servers"):  # a command's servers live as long as the shard
            be.servers.close()


def _fault(point: str, where: str) -> None:
    """A planted actor death for the tests: KINV_EXECUTOR_FAULT=<point>:<where, or its start> kills the process
    that runs that shard or round, once (a marker file beside it makes the second attempt live)."""
    spec = os.environ.get("KINV_EXECUTOR_FAULT", "")
    if not spec or not f"{point}:{where}".startswith(spec):  # "sample:actor1@" matches actor 1 on any GPU
        return
    marker = os.environ.get("KINV_EXECUTOR_FAULT_MARKER")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
    os._exit(17)
