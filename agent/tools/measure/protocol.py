"""The measurement protocol: how every kinv measurement takes its samples and what it makes of them.

One module owns what a live investigation, ``kinv bench``, ``kinv noise``, a campaign's screening, the Ray
executor and the recorder (benchmarks/record.py) must agree on, so that a replayed measurement sees the
statistics a live one does:

* **rounds and seeds**: round r of every arm draws its inputs from :func:`backends.base.round_seed` (r), so the data are
  common to a round's arms (and cancel in its paired log-ratio); the memory placement is each arm's own,
  re-drawn every sample;
* **arm order**: two arms alternate in ABBA order (:func:`kinv.agent.tools.measure.stats.abba_order`), more arms are
  rotated by the round (:func:`rotated`); :func:`round_order` picks the order of a round;
* **paired effects with intervals**: the sequential A/B (:func:`run_ab`, agent.stats.run_sequential) and a
  screening's estimate (:func:`screen_effect`) use one estimator, agent.stats.paired_effect;
* **outliers**: an A/A's outlier samples are winsorized by agent.noise.aa_noise, and the paired
  estimator is robust to the rest (Hodges-Lehmann from 12 rounds on);
* **the round loop**: :class:`RoundLoop` takes every round of every measurement (the A/A, the A/B, a screening's
  shard, ``kinv bench`` of a config, the recorder);
* **the GPU-second ledger**: every sample carries ``gpu_s``; :class:`Ledger` counts every sample a loop took,
  kept or lost, and reads the same figure back from kinv.db for the budgets and the close-out;
* **lost samples**: a sample a backend could not take (``lost``: a command that failed, hung or printed no
  metric) drops that level of that round for every arm, with one recorded event; an arm that loses more than
  :data:`LOST_SHARE` of a level's rounds (and at least :data:`LOST_MIN`) fails (:func:`check_lost`).

The A/A and the A/B store each round's samples together (a killed run resumes from the committed rounds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kinv.agent.tools.backends.base import Arm, Backend
from kinv.agent.tools.measure import noise, stats
from kinv.agent.tools.worker.hashes import harness_hash, kernel_reference_hash
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
    """The GPU time the samples (stored rows or backend samples) spent; a sample without one counts 0."""
    return sum(s.get("gpu_s") or 0.0 for s in samples)


@dataclass
class Ledger:
    """THE GPU-second ledger: what a measurement's samples spent, kept or not.

    A sample that is stored carries its ``gpu_s`` in kinv.db's samples; a level of a round that lost a sample is
    kept by nobody, and its GPU seconds (the lost sample's and its partners') go on the round's first
    ``sample.lost`` event (:func:`record_lost`).  The round loop fills a ledger as it samples
    (:meth:`RoundLoop.take`), and :meth:`of` reads the same figure back from kinv.db: the workstream's budget,
    the close-out's ledger and a campaign's budget all take it from here, so a run that loses samples gets one
    figure everywhere."""

    gpu_s: float = 0.0  # every sample taken: stored, dropped with its level's round, or lost
    kept: int = 0  # samples stored
    lost: int = 0  # samples lost (a command that failed, hung or printed no metric)

    def book(self, samples: Iterable[dict], kept: bool) -> float:
        """Count ``samples`` (stored when ``kept``, else dropped with their level's round); returns their GPU s."""
        samples = list(samples)
        spent = gpu_seconds(samples)
        self.gpu_s += spent
        if kept:
            self.kept += len(samples)
        self.lost += sum(1 for s in samples if s.get("lost"))
        return spent

    def __add__(self, other: Ledger) -> Ledger:
        return Ledger(self.gpu_s + other.gpu_s, self.kept + other.kept, self.lost + other.lost)

    @classmethod
    def of(cls, store, experiments: Sequence[int] = (), workstreams: Sequence[str] = ()) -> Ledger:
        """The ledger of these experiments' (or these workstreams' every experiment's) samples, as kinv.db has it."""
        kept_s, kept, unkept_s, lost = store.ledger_sums(list(experiments), list(workstreams))
        return cls(kept_s + unkept_s, kept, lost)


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
# THE round loop: every measurement takes its samples here
# --------------------------------------------------------------------------- #
def sample_in_turn(arms: Sequence, levels: Sequence[Level], round_index: int,
                   orders: dict[str, list[int]]) -> dict[str, dict[int, dict]]:  # fmt: skip
    """One round taken in this process: at each level, arm ``j`` for ``j`` in ``orders[level]`` (what
    ``Backend.sample_round`` does unless a backend spreads a round over several GPUs)."""
    return {lv.key: {j: arms[j].sample(lv, round_index) for j in orders[lv.key]} for lv in levels}


@dataclass
class Round:
    """One round of a loop: ``got[level][j]`` is arm ``j``'s sample at that level, taken in ``order``."""

    index: int  # the round the samples drew their inputs for (round_seed)
    order: list[int]
    got: dict[str, dict[int, dict]]
    whole: bool = True  # a lost sample drops its level of the round for every arm (else only the lost arm's)

    def lost(self, level: str) -> list[int]:
        """The arms whose sample at ``level`` was lost (a command that failed, hung or printed no metric)."""
        got = self.got.get(level, {})
        return [j for j in self.order if j in got and got[j].get("lost")]

    def kept(self, level: str) -> dict[int, dict]:
        """The samples of ``level`` this round keeps, in the order taken: none once one is lost and the round is
        kept whole (an A/A's or an A/B's), else every sample that was not lost (a screening's)."""
        got = self.got.get(level, {})
        if self.whole and self.lost(level):
            return {}
        return {j: got[j] for j in self.order if j in got and not got[j].get("lost")}

    def unkept(self, level: str) -> list[dict]:
        """The samples of ``level`` taken this round and not kept (their GPU seconds are still spent)."""
        kept = self.kept(level)
        return [s for j, s in self.got.get(level, {}).items() if j not in kept]


class RoundLoop:
    """THE round loop of every measurement: the A/A and the A/B (:func:`run_aa`, :func:`run_ab`), a screening's
    shard (agent/tools/runners/screening.py), ``kinv bench`` of a config (agent/tools/runners/bench.py) and the recorder
    (benchmarks/record.py).

    Round r times every arm of ``arms`` at every level of ``levels`` in :func:`round_order` (ABBA for a pair
    when ``abba``, else rotated by r), drawing the inputs of round ``round0 + r`` (:func:`round_seed`), through
    ``sample_round`` (a backend's ``sample_round``; :func:`sample_in_turn` by default); every sample it takes is
    booked in :attr:`ledger`.  ``arms`` is the caller's list: arms opened at the first round, or dropped after a
    round, are seen by the next.  The loop stores nothing: each caller's ``on_round`` stores the round."""

    def __init__(self, arms: list, levels: Sequence[Level], *, abba: bool = False, whole: bool = True,
                 round0: int = 0, sample_round: Callable | None = None, ledger: Ledger | None = None,
                 order: Callable[[int], list[int]] | None = None) -> None:  # fmt: skip
        self.arms, self.levels, self.abba, self.whole, self.round0 = arms, list(levels), abba, whole, round0
        self.sample_round = sample_round or sample_in_turn
        self.ledger = Ledger() if ledger is None else ledger
        self.order = order  # the arms a round times, in its order (the recorder's pairs); else round_order

    def take(self, r: int) -> Round:
        """Round ``r`` of every arm at every level, booked in the ledger."""
        order = self.order(r) if self.order else round_order(len(self.arms), r, abba=self.abba)
        got = self.sample_round(self.arms, self.levels, self.round0 + r, {lv.key: order for lv in self.levels})
        rnd = Round(self.round0 + r, order, got, self.whole)
        for lv in self.levels:
            self.ledger.book(rnd.kept(lv.key).values(), kept=True)
            self.ledger.book(rnd.unkept(lv.key), kept=False)
        return rnd

    def run(self, rounds: Iterable[int], on_round: Callable[[Round], bool | None]) -> Ledger:
        """Take each round of ``rounds`` and hand it to ``on_round``; the loop stops when the rounds run out or
        ``on_round`` returns True (its stop rule).  The sequential A/B's stop rule (agent.stats.run_sequential)
        asks for one round at a time instead: :func:`run_ab` hands it :meth:`take`."""
        for r in rounds:
            if on_round(self.take(r)):
                break
        return self.ledger


def sample_row(exp_id, arm, level: Level, round_index: int, tag: str, s: dict, backend: str,
               hashes: tuple[str, str], device: str | None) -> dict:  # fmt: skip
    """The stored row of one sample."""
    return {
        "experiment": exp_id, "round": round_index, "arm": tag, "level": level.key, "config_hash": arm.config_hash,
        "us": s["us"], "replays": s.get("replays"), "gpu_s": s.get("gpu_s"), "harness_hash": hashes[0],
        "reference_hash": hashes[1], "env": {"seen": arm.env_seen, "derived": s.get("derived_env", {})},
        "backend": backend, "device": device, "place": s.get("place"), "yard_gbps": s.get("yard_gbps"),
        "refresh_us": s.get("refresh_us"), "foreign": s.get("foreign") or None, "t": time.time(),
    }  # fmt: skip


def lost_events(store, ws: str | None, exp_id, level: Level, rnd: Round, names: Sequence[str]) -> None:
    """One ``sample.lost`` event for each lost sample of ``level`` in round ``rnd``; the first carries the GPU
    seconds of the level's samples this round did not keep (the ledger reads them back: :meth:`Ledger.of`)."""
    unkept = gpu_seconds(rnd.unkept(level.key))
    for i, j in enumerate(rnd.lost(level.key)):
        store.event(ws, "sample.lost", f"round {rnd.index}: {rnd.got[level.key][j]['lost']}",
                    {"experiment": exp_id, "arm": names[j], "level": level.key, "round": rnd.index,
                     "gpu_s": unkept if i == 0 else 0.0})  # fmt: skip


def record_lost(store, exp_id, level: Level, rnd: Round, arms: Sequence[Arm], lost: dict[str, int]) -> bool:
    """Record the lost samples of one level of one round (one event each) and count them in ``lost``; True when
    the level has any (its round is dropped for every arm).  Raises VariantFailed once :func:`check_lost` says."""
    gone = rnd.lost(level.key)
    if not gone:
        return False
    exp = store.experiment(exp_id) if exp_id is not None else None
    lost_events(store, exp["workstream"] if exp else None, exp_id, level, rnd, [a.name for a in arms])
    lost[level.key] = lost.get(level.key, 0) + 1
    check_lost(arms[gone[0]], level, lost[level.key], rnd.index + 1, rnd.got[level.key][gone[0]]["lost"])
    return True


def check_lost(arm: Arm, level: Level, n_lost: int, rounds: int, last: str) -> None:
    """Fail the arm once it has lost more than :data:`LOST_SHARE` of ``level``'s rounds (and at least
    :data:`LOST_MIN`): its numbers no longer describe it."""
    from kinv.agent.errors import VariantFailed

    if n_lost >= LOST_MIN and n_lost > LOST_SHARE * rounds:
        raise VariantFailed(f"{arm.name} lost {n_lost} of {rounds} samples at {level.key} (more than "
                            f"{LOST_SHARE:.0%}); the last: {last}")  # fmt: skip


def store_round(store, exp_id, backend: Backend, arms: Sequence[Arm], rnd: Round, levels: Sequence[Level],
                tags: Sequence[str], lost: dict[str, int], device: str | None) -> dict[str, list[float]]:  # fmt: skip
    """Store one round of an A/A or an A/B: its lost samples recorded (their level dropped for every arm), the
    others' rows committed together (a killed run resumes from the committed rounds).  Every row carries the
    harness and reference hashes as they are on disk during the round (a variant that changes either is caught).
    Returns ``{level: [us of arm j]}`` of the levels kept."""
    hashes = (harness_hash(), kernel_reference_hash(arms[0].kernel))
    rows, out = [], {}
    for level in levels:
        if record_lost(store, exp_id, level, rnd, arms, lost):
            continue
        kept = rnd.kept(level.key)
        for j, s in kept.items():
            rows.append(sample_row(exp_id, arms[j], level, rnd.index, tags[j], s, backend.name, hashes,
                                   device_of(store, s, device)))  # fmt: skip
        out[level.key] = [kept[j]["us"] for j in range(len(arms))]
    store.add_samples(rows)  # the round's samples commit together
    return out


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
           rounds: int, n_arms: int, on_round: Callable | None = None,
           pythonpath: list[str] | None = None) -> tuple[dict[str, list[list[float]]], float]:  # fmt: skip
    """The A/A: ``n_arms`` workers of ``config`` timed at every level in every round, in an order rotated by the
    round; arm j is stored as ``A<j>`` (rounds already stored for ``exp_id`` are reused: a killed run resumes).
    ``pythonpath``: a kernel package snapshot every arm imports (a revision's, ``kinv regress``).
    Returns ``({level: [times of arm j]}, GPU s spent in this call)``.  The graph's noise node and ``kinv noise``
    both run this."""
    tags = [f"A{j}" for j in range(n_arms)]
    backend.experiment = exp_id
    done = stored_rounds(store, exp_id, tags)
    acc: dict[str, list[list[float]]] = {lv.key: [[] for _ in range(n_arms)] for lv in levels}
    arms: list[Arm] = []
    lost: dict[str, int] = {}
    loop = RoundLoop(arms, levels, sample_round=backend.sample_round)

    def to_take():
        for r in range(rounds):
            if r in done:
                for lv, times in done[r].items():
                    for j, us in enumerate(times):
                        acc[lv][j].append(us)
                continue
            if not arms:
                specs = [((tags[j], kernel, config, env), {"replica": j, **({"pythonpath": pythonpath} if pythonpath
                                                                           else {})}) for j in range(n_arms)]  # fmt: skip
                arms.extend(open_arms(backend, specs))
                backend.prepare(arms, levels)
            yield r

    def stored(rnd: Round) -> None:
        kept = store_round(store, exp_id, backend, arms, rnd, levels, tags, lost, store.device(arms[0].fingerprint))
        for lv, times in kept.items():  # the A/A's rounds stay whole: a level with a lost sample is dropped
            for j, us in enumerate(times):
                acc[lv][j].append(us)
        if on_round:
            on_round(rnd.index)

    try:
        loop.run(to_take(), stored)
    finally:
        for a in arms:
            a.close()
    return acc, loop.ledger.gpu_s


def run_ab(store, exp_id: int, backend: Backend, kernel: str, base_cfg: dict, var_cfg: dict, env: dict,
           levels: list[Level], thresholds: dict[str, float], plan, offset_sd: dict[str, float] | None = None,
           n_variants: int = 1, base_pythonpath: list[str] | None = None, on_open: Callable | None = None,
           on_round: Callable | None = None, names: tuple[str, str] = ("baseline", "variant"),
           var_env: dict | None = None, before_close: Callable | None = None,
           var_pythonpath: list[str] | None = None):  # fmt: skip
    """The sequential A/B of ``var_cfg`` against ``base_cfg`` (agent.stats.run_sequential over paired ABBA
    rounds; committed rounds of ``exp_id`` are reused).  The baseline arm runs in ``env``, the variant's in
    ``var_env`` (default ``env``: a variant over environment variables gives its own).  ``base_pythonpath`` and
    ``var_pythonpath`` put a kernel package snapshot first on each arm's import path (the variant's: another
    revision's snapshot, ``kinv regress``; else the source on disk).  ``on_open(arm)`` sees
    every arm once it has started (the env check); ``before_close(arms)`` sees them once the rounds are done (the
    last captures' check).  Returns ``(SequentialResult, GPU s spent in this call)``.  Only the sequential A/B with
    every rule (agent/tools/measure/sequential.py) calls this: nobody else decides a verdict from its rounds."""
    backend.experiment = exp_id
    done = {r: {lv: tuple(v) for lv, v in lvs.items()} for r, lvs in stored_rounds(store, exp_id, ["A", "B"]).items()}
    arms: list[Arm] = []
    lost: dict[str, int] = {}
    loop = RoundLoop(arms, levels, abba=True, sample_round=backend.sample_round)

    def start() -> None:
        judged = {"judge_path": base_pythonpath} if base_pythonpath else {}  # the judge never imports the variant
        arms.extend(open_arms(backend, [
            ((names[0], kernel, base_cfg, env), {"pythonpath": base_pythonpath, "partner": var_cfg, "role": "base",
                                                 **judged}),
            ((names[1], kernel, var_cfg, env if var_env is None else var_env), {"partner": base_cfg,
                                                                                "pythonpath": var_pythonpath,
                                                                                **judged})]))  # fmt: skip
        for a in arms:
            if on_open:
                on_open(a)
        backend.prepare(arms, levels)

    def sample_fn(r: int) -> dict:  # the sequential rule asks for one round at a time
        if r in done:
            return done[r]
        if not arms:
            start()
        kept = store_round(store, exp_id, backend, arms, loop.take(r), levels, ("A", "B"), lost,
                           store.device(arms[0].fingerprint))  # fmt: skip
        if on_round:
            on_round(r)
        return {lv: (a_us, b_us) for lv, (a_us, b_us) in kept.items()}

    try:
        res = stats.run_sequential(sample_fn, [lv.key for lv in levels], thresholds, plan, offset_sd=offset_sd,
                                   n_variants=n_variants)  # fmt: skip
        if arms and before_close:
            before_close(arms)
    finally:
        if arms:  # what the compiler made of each arm, and what its timing read (kept before the arms go)
            from kinv.agent.tools.backends.compiled import compiled_of

            compiled = compiled_of({"base": arms[0].setups, "variant": arms[1].setups})
            timed = {lv: {k: s[k] for k in ("working_set", "l2_bytes") if s.get(k)} for lv, s in arms[1].setups.items()}
            if compiled or any(timed.values()):
                store.merge_resources(exp_id, compiled=compiled, timed=timed)
            also = {"base": getattr(arms[0], "also", None), "variant": getattr(arms[1], "also", None)}
            if also["base"] or also["variant"]:  # what a command printed besides its metric (its samples here)
                store.merge_resources(exp_id, also=also)
        for a in arms:
            a.close()
    return res, loop.ledger.gpu_s
