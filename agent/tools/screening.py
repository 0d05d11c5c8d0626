"""Screening a batch of candidates against one incumbent worker, on one GPU: the unit a campaign spreads.

``screen_shard`` touches no store: it opens the arms (a worker per config on the GPU this process sees, or the
replay's recorded workers), times every arm at every level in every round in an order rotated by the round
(agent/tools/protocol.py), and returns the sample rows, each candidate's paired per-level change against the incumbent *of the same
GPU*, and what failed.  The campaign's driver stores the rows and tells the optimizer; the same function runs
in-process (one GPU) or inside a Ray actor that holds one GPU (agent/tools/executor.py).  Results from
different GPUs meet only as these per-GPU paired effects, never as pooled raw times.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from kinv.kernels.errors import KinvError


class IncumbentFailed(KinvError, RuntimeError):
    """The incumbent's own worker failed: the shard has no reference to pair its candidates with."""


def screen_shard(backend: str, kernel: str, env: dict, incumbent: dict, candidates: dict[str, dict],
                 levels: list[dict], rounds: int, round0: int, exp: int, where: str = "local") -> dict:  # fmt: skip
    """Time ``candidates`` (config hash -> config) against ``incumbent`` in ``rounds`` rounds from ``round0``.

    Returns ``{"rows": [...], "gains": {hash: {level: change}}, "intervals": {hash: {level: [low, high]}},
    "failed": {hash: why}, "gpu_s": float, "fingerprint": {...}, "where": where}``: each change is the
    protocol's paired estimate (agent.tools.protocol.screen_effect), with its 95% interval (None bounds after
    a single round).  A candidate whose worker fails is dropped from the shard.
    """
    from kinv.agent.tools import bench, protocol
    from kinv.agent.tools.backends import base
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
        except (base.VariantFailed, base.NoRecording) as exc:  # replay has no recording of it: not measured
            return None, str(exc)

    names = [("incumbent", incumbent)] + [(f"C:{h}", cfg) for h, cfg in candidates.items()]
    with ThreadPoolExecutor(min(8, len(names))) as pool:
        started = list(pool.map(start, names))
    failed: dict[str, str] = {}
    try:
        inc, err = started[0]
        if inc is None:
            raise IncumbentFailed(f"the incumbent's worker failed on {where}: {err}")
        arms = {}
        for h, (arm, err) in zip(candidates, started[1:]):
            if arm is None:
                failed[h] = err
            else:
                arms[h] = arm
        hashes = (base.harness_hash(), base.reference_hash(kernel))
        times = {h: {lv.key: ([], []) for lv in lvs} for h in arms}  # (incumbent, candidate) per paired round
        rows, gpu = [], 0.0
        for r in range(rounds):
            ri = round0 + r
            for lv in lvs:
                got, lost = {}, set()
                order = [("incumbent", "I", inc)] + [(h, f"C{h[:6]}", a) for h, a in arms.items()]
                for key, tag, a in protocol.rotated(order, r):
                    try:
                        smp = a.sample(lv, ri)
                    except base.VariantFailed as exc:
                        if key == "incumbent":
                            raise IncumbentFailed(f"the incumbent's worker failed on {where}: {exc}") from None
                        failed[key] = str(exc)
                        continue
                    if smp.get("lost"):  # a command's failed run: this round has no pair for it at this level
                        lost.add(key)
                        gpu += smp.get("gpu_s") or 0.0
                        continue
                    got[key] = smp
                    place = None if where == "local" else where  # which GPU timed it (a Ray actor's)
                    rows.append(protocol.sample_row(exp, a, lv, ri, tag, {**smp, "place": place}, be.name, hashes,
                                                    None))  # fmt: skip
                gpu += protocol.gpu_seconds(got.values())
                for h in list(arms):
                    if h in got and "incumbent" in got:
                        times[h][lv.key][0].append(got["incumbent"]["us"])
                        times[h][lv.key][1].append(got[h]["us"])
                    elif h not in got and h not in lost:
                        arms.pop(h).close()
        est = {h: {k: protocol.screen_effect(a, b, k) for k, (a, b) in times[h].items()} for h in arms}
        gains = {h: {k: e["gain"] for k, e in by.items()} for h, by in est.items()}
        intervals = {h: {k: [e["ci_low"], e["ci_high"]] for k, e in by.items()} for h, by in est.items()}
        return {"rows": rows, "gains": gains, "intervals": intervals, "failed": failed, "gpu_s": gpu,
                "fingerprint": inc.fingerprint, "where": where}  # fmt: skip
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
