"""The measurement protocol: how every kinv measurement takes its samples and what it makes of them.

One module owns what a live investigation, ``kinv bench``, ``kinv noise``, a campaign's screening, the Ray
executor and the recorder (benchmarks/record.py) must agree on, so that a replayed measurement sees the
statistics a live one does:

* **rounds and seeds**: round r of every arm draws its inputs from :func:`backends.base.round_seed` (r), so the data are
  common to a round's arms (and cancel in its paired log-ratio); the memory placement is each arm's own,
  re-drawn every sample;
* **arm order**: two arms alternate in ABBA order (:func:`kinv.agent.stats.abba_order`), more arms are
  rotated by the round (:func:`rotated`); :func:`round_order` picks the order of a round;
* **paired effects with intervals**: the sequential A/B (:func:`run_ab`, agent.stats.run_sequential) and a
  screening's estimate (:func:`screen_effect`) use one estimator, agent.stats.paired_effect;
* **outliers**: an A/A's outlier samples are winsorized by agent.noise.aa_noise, and the paired
  estimator is robust to the rest (Hodges-Lehmann from 12 rounds on);
* **the GPU-second ledger**: every sample carries ``gpu_s``; :func:`gpu_seconds` is the one sum of them;
* **lost samples**: a sample a backend could not take (``lost``: a command that failed, hung or printed no
  metric) drops that level of that round for every arm, with one recorded event; an arm that loses more than
  :data:`LOST_SHARE` of a level's rounds (and at least :data:`LOST_MIN`) fails (:func:`check_lost`).

Every loop here stores each round's samples together (a killed run resumes from the committed rounds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kinv.agent import noise, stats
from kinv.agent.tools.backends.base import Arm, Backend, harness_hash, reference_hash
from kinv.kernels.adapter import Level

LOST_SHARE = 0.25
"""The share of a level's rounds an arm may lose (a command that failed, hung or printed no metric) before it fails."""
LOST_MIN = 3
"""An arm fails for lost samples only once it has lost at least this many at a level."""


def rotated(items: Sequence, round_index: int) -> list:
    """``items`` rotated left by the round: each item is timed first in turn, so slow drifts spread over all."""
    k = round_index % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def round_order(n_arms: int, round_index: int, abba: bool = False) -> list[int]:
    """The order in which a round times arms ``0..n_arms-1``: ABBA for a pair (``abba``), else rotated."""
    if abba:
        return [0 if who == "A" else 1 for who in stats.abba_order(round_index)]
    return rotated(list(range(n_arms)), round_index)


def gpu_seconds(samples: Iterable[dict]) -> float:
    """The GPU-second ledger: the GPU time the samples (stored rows or backend samples) spent."""
    return sum(s.get("gpu_s") or 0.0 for s in samples)


def sequential_plan(settings, max_rounds: int | None = None) -> stats.SequentialPlan:
    """The sequential A/B of a plan's ``stats:`` settings (agent.models.Stats); ``max_rounds`` caps its rounds
    (``kinv bench --rounds``), the quick look never later than the cap.  The graph, ``kinv bench`` and an
    adoption's confirming A/B all build their plan here."""
    cap = settings.max_rounds if max_rounds is None else max_rounds
    return stats.SequentialPlan(quick_rounds=min(settings.quick_rounds, cap), step_rounds=settings.step_rounds,
                                max_rounds=cap, conf=settings.conf)  # fmt: skip


def look_conf(plan) -> float:
    """Per-look confidence of a plan's intervals (Bonferroni over looks, levels and variants)."""
    return stats.look_confidence(sequential_plan(plan.stats), len(plan.levels()), len(plan.variants))


def noise_bands(plan, levels: list[Level], acc: dict[str, list[list[float]]]) -> list:
    """The A/A's analysis at each level (agent.noise.aa_noise: outliers winsorized, the arm offset tested)
    at the plan's thresholds, round cap and per-look confidence; ``acc`` is what :func:`run_aa` returned."""
    s, look = plan.stats, look_conf(plan)
    return [noise.aa_noise(acc[lv.key], lv.key, s.threshold_at(lv.label), s.max_rounds, look) for lv in levels]


def screen_effect(base_us: Sequence[float], cand_us: Sequence[float], level: str,
                  conf: float = 0.95) -> dict:  # fmt: skip
    """A screening's paired estimate at one level: ``{"gain", "ci_low", "ci_high", "n"}``, the candidate's
    throughput change over the incumbent (``gain = expm1(effect)``) and its ``conf`` interval, from the
    A/B's estimator (agent.stats.paired_effect).  One round has no interval (its bounds are None)."""
    if len(base_us) < 2:
        g = math.expm1(math.log(base_us[0] / cand_us[0]))
        return {"gain": g, "ci_low": None, "ci_high": None, "n": len(base_us)}
    e = stats.paired_effect(base_us, cand_us, level, threshold=0.0, conf=conf)
    return {"gain": math.expm1(e.effect), "ci_low": math.expm1(e.ci_low), "ci_high": math.expm1(e.ci_high),
            "n": e.n}  # fmt: skip


# --------------------------------------------------------------------------- #
# measurement loops (they store every sample)
# --------------------------------------------------------------------------- #
def sample_row(exp_id, arm, level: Level, round_index: int, tag: str, s: dict, backend: str,
               hashes: tuple[str, str], device: str | None) -> dict:  # fmt: skip
    """The stored row of one sample."""
    return {
        "experiment": exp_id, "round": round_index, "arm": tag, "level": level.key, "config_hash": arm.config_hash,
        "us": s["us"], "replays": s.get("replays"), "gpu_s": s.get("gpu_s"), "harness_hash": hashes[0],
        "reference_hash": hashes[1], "env": {"seen": arm.env_seen, "derived": s.get("derived_env", {})},
        "backend": backend, "device": device, "place": s.get("place"), "yard_gbps": s.get("yard_gbps"),
        "t": time.time(),
    }  # fmt: skip


def record_lost(store, exp_id, level: Level, round_index: int, samples: list[tuple[Arm, dict]],
                lost: dict[str, int]) -> bool:  # fmt: skip
    """Record the lost samples of one level of one round (one event each) and count them in ``lost``; True when
    the level has any (its round is dropped for every arm).  Raises VariantFailed once :func:`check_lost` says."""
    gone = [(arm, s) for arm, s in samples if s.get("lost")]
    if not gone:
        return False
    exp = store.experiment(exp_id) if exp_id is not None else None
    for arm, s in gone:
        store.event(exp["workstream"] if exp else None, "sample.lost", f"round {round_index}: {s['lost']}",
                    {"experiment": exp_id, "arm": arm.name, "level": level.key, "round": round_index})  # fmt: skip
    lost[level.key] = lost.get(level.key, 0) + 1
    check_lost(gone[0][0], level, lost[level.key], round_index + 1, gone[0][1]["lost"])
    return True


def check_lost(arm: Arm, level: Level, n_lost: int, rounds: int, last: str) -> None:
    """Fail the arm once it has lost more than :data:`LOST_SHARE` of ``level``'s rounds (and at least
    :data:`LOST_MIN`): its numbers no longer describe it."""
    from kinv.agent.tools.backends.base import VariantFailed

    if n_lost >= LOST_MIN and n_lost > LOST_SHARE * rounds:
        raise VariantFailed(f"{arm.name} lost {n_lost} of {rounds} samples at {level.key} (more than "
                            f"{LOST_SHARE:.0%}); the last: {last}")  # fmt: skip


@dataclass
class PairedRounds:
    """Samples of two arms, paired by round: level -> (a_us list, b_us list).  A level of a round with a lost
    sample has no pair (``lost`` counts them per level)."""

    a: dict[str, list[float]] = field(default_factory=dict)
    b: dict[str, list[float]] = field(default_factory=dict)
    gpu_s: float = 0.0
    rounds: int = 0
    lost: dict[str, int] = field(default_factory=dict)

    def add(self, level: str, a_us: float, b_us: float) -> None:
        self.a.setdefault(level, []).append(a_us)
        self.b.setdefault(level, []).append(b_us)


def paired_round(store, exp_id, backend: Backend, arm_a: Arm, arm_b: Arm, levels: list[Level], round_index: int,
                 acc: PairedRounds, device: str | None, tags=("A", "B")) -> dict[str, tuple[float, float]]:  # fmt: skip
    """One round: every level, A then B on even rounds, B then A on odd (ABBA).

    Every sample carries the harness and reference hashes as they are on disk during the round
    (a variant that changes either is caught).  Returns ``{level: (a_us, b_us)}`` of this round,
    the shape agent.stats.run_sequential wants; a level with a lost sample is left out.
    """
    hashes = (harness_hash(), reference_hash(arm_a.kernel))
    rows, pairs = [], {}
    order = round_order(2, round_index, abba=True)
    got = backend.sample_round([arm_a, arm_b], levels, round_index, {lv.key: order for lv in levels})
    for level in levels:
        acc.gpu_s += sum(got[level.key][j].get("gpu_s") or 0.0 for j in order)
        if record_lost(store, exp_id, level, round_index, [((arm_a, arm_b)[j], got[level.key][j]) for j in order],
                       acc.lost):  # fmt: skip
            continue
        for j in order:
            s = got[level.key][j]
            rows.append(sample_row(exp_id, (arm_a, arm_b)[j], level, round_index, tags[j], s, backend.name, hashes,
                                    device_of(store, s, device)))  # fmt: skip
        a_us, b_us = got[level.key][0]["us"], got[level.key][1]["us"]
        acc.add(level.key, a_us, b_us)
        pairs[level.key] = (a_us, b_us)
    store.add_samples(rows)  # the round's samples commit together
    acc.rounds = round_index + 1
    return pairs


def aa_round(store, exp_id, backend: Backend, arms: list[Arm], levels: list[Level], round_index: int,
             acc: dict[str, list[list[float]]], device: str | None, lost: dict[str, int] | None = None) -> float:  # fmt: skip
    """One A/A round: every arm at every level, in an order rotated by the round.  Arm j is stored as
    ``A<j>``; ``acc[level][j]`` collects its times (a level with a lost sample is dropped from the round, counted
    in ``lost``).  Returns the GPU seconds spent."""
    lost = {} if lost is None else lost
    hashes = (harness_hash(), reference_hash(arms[0].kernel))
    rows, gpu_s = [], 0.0
    order = round_order(len(arms), round_index)
    got = backend.sample_round(arms, levels, round_index, {lv.key: order for lv in levels})
    for level in levels:
        per = acc.setdefault(level.key, [[] for _ in arms])
        gpu_s += sum(got[level.key][j].get("gpu_s") or 0.0 for j in order)
        if record_lost(store, exp_id, level, round_index, [(arms[j], got[level.key][j]) for j in order], lost):
            continue  # the A/A's rounds stay whole: the level's round is dropped for every arm
        for j in order:
            s = got[level.key][j]
            per[j].append(s["us"])
            rows.append(sample_row(exp_id, arms[j], level, round_index, f"A{j}", s, backend.name, hashes,
                                    device_of(store, s, device)))  # fmt: skip
    store.add_samples(rows)  # the round's samples commit together
    return gpu_s


def device_of(store, s: dict, default: str | None) -> str | None:
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
    gpu_s, lost = 0.0, {}
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
            gpu_s += aa_round(store, exp_id, backend, arms, levels, r, acc, store.device(arms[0].fingerprint), lost)
            if on_round:
                on_round(r)
    finally:
        for a in arms:
            a.close()
    return acc, gpu_s


def run_ab(store, exp_id: int, backend: Backend, kernel: str, base_cfg: dict, var_cfg: dict, env: dict,
           levels: list[Level], thresholds: dict[str, float], plan, offset_sd: dict[str, float] | None = None,
           n_variants: int = 1, base_pythonpath: list[str] | None = None, on_open: Callable | None = None,
           on_round: Callable | None = None, names: tuple[str, str] = ("baseline", "variant"),
           var_env: dict | None = None, before_close: Callable | None = None):  # fmt: skip
    """The sequential A/B of ``var_cfg`` against ``base_cfg`` (agent.stats.run_sequential over paired ABBA
    rounds; committed rounds of ``exp_id`` are reused).  The baseline arm runs in ``env``, the variant's in
    ``var_env`` (default ``env``: a variant over environment variables gives its own).  ``on_open(arm)`` sees
    every arm once it has started (the env check); ``before_close(arms)`` sees them once the rounds are done (the
    last captures' check).  Returns ``(SequentialResult, GPU s spent in this call)``.  Only the sequential A/B with
    every rule (agent/tools/sequential.py) calls this: nobody else decides a verdict from its rounds."""
    done = {r: {lv: tuple(v) for lv, v in lvs.items()} for r, lvs in stored_rounds(store, exp_id, ["A", "B"]).items()}
    arms: list[Arm] = []
    acc = PairedRounds()

    def start() -> None:
        judged = {"judge_path": base_pythonpath} if base_pythonpath else {}  # the judge never imports the variant
        arms.extend(open_arms(backend, [
            ((names[0], kernel, base_cfg, env), {"pythonpath": base_pythonpath, "partner": var_cfg, "role": "base",
                                                 **judged}),
            ((names[1], kernel, var_cfg, env if var_env is None else var_env), {"partner": base_cfg, **judged})]))  # fmt: skip
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
        if arms and before_close:
            before_close(arms)
    finally:
        if arms:  # what the compiler made of each arm, and what its timing read (kept before the arms go)
            from kinv.agent.tools.resources import compiled_of

            compiled = compiled_of({"base": arms[0].setups, "variant": arms[1].setups})
            timed = {lv: {k: s[k] for k in ("working_set", "l2_bytes") if s.get(k)} for lv, s in arms[1].setups.items()}
            if compiled or any(timed.values()):
                store.merge_resources(exp_id, compiled=compiled, timed=timed)
            also = {"base": getattr(arms[0], "also", None), "variant": getattr(arms[1], "also", None)}
            if also["base"] or also["variant"]:  # what a command printed besides its metric (its samples here)
                store.merge_resources(exp_id, also=also)
        for a in arms:
            a.close()
    return res, acc.gpu_s
