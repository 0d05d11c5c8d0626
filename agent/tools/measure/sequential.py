"""The sequential A/B with every rule: the one way kinv decides a verdict between two arms.

The workstream graph, ``kinv bench --variant`` and an adoption's confirming A/B (the one whose verdict decides what
is written into the live file) all call :func:`run`, and nothing else decides a verdict from the round loop
(:func:`kinv.agent.tools.measure.protocol.run_ab`).  In order:

1. **the correctness gate** for both arms (skipped only where the caller ran it already in this run: the graph's
   gate node), judged by the judge, a process that never imported the variant (agent/tools/worker/judge.py);
2. **the environment check** of each arm's own process, as it starts;
3. **the A/A offsets** the intervals widen by (a caller without an A/A says so: the rule is then skipped, in words);
4. **the sequential rounds** (paired ABBA, sequential looks), every other process kinv started stopped while an
   arm is timed; the outputs that each arm's first and last samples' timed replays left, and a drawn share of the
   others', judged on the inputs those replays read (a refused one: the variant is incorrect);
5. **the integrity check**: every sample was timed under the baseline's harness and reference;
6. **the plausibility rule**: no level faster than the roofline of the card's ceilings (measured on the card by the
   judge), no level whose timed working set fits in L2, no sample whose yardstick beat the card's copy, no
   sample timed beside other GPU work (NVML);
7. **the verdict and the ledger**, stored on the experiment with which rules ran and which were skipped.

A rule a path skips is named in :attr:`Outcome.skipped`, stored with the experiment and shown by its close-out.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kinv.agent.errors import Incorrect, NoRecording, Tampered, VariantFailed
from kinv.agent.tools.backends.base import Backend
from kinv.agent.tools.measure import correctness, envcheck, plausibility, protocol
from kinv.agent.tools.worker.hashes import harness_hash, kernel_reference_hash
from kinv.kernels.adapter import Level, get_adapter

YARD_MARGIN = 1.08
"""A sample's yardstick (a fixed device copy timed with the sample's own events) may read at most this much above
the card's copy of the same size measured by the judge: beyond, the timer that read it is not to be believed."""

RULES = ("correctness gate", "environment check", "A/A offsets", "sequential rounds", "timed outputs checked",
         "integrity", "plausibility", "yardstick", "no other GPU work")  # fmt: skip


@dataclass
class Outcome:
    """What the A/B decided, and how."""

    verdict: str  # the statistics' verdict (accept, reject, mixed, ...) or void / incorrect / crashed / failed / ...
    reason: str
    result: object | None = None  # agent.stats.SequentialResult when the rounds ran to a verdict
    kind: str | None = None  # None: timed to a verdict (possibly void); else why there is none
    void: str | None = None
    gpu_s: float = 0.0  # the ledger: the GPU seconds of every stored sample of the experiment
    spent_s: float = 0.0  # GPU seconds spent in this call
    rounds: int = 0
    skipped: list[str] = field(default_factory=list)
    ceilings: dict = field(default_factory=dict)
    verified: list[list[str]] = field(default_factory=list)  # [arm, level, which capture] the judge passed

    @property
    def decided(self) -> bool:
        """Timed to a verdict that stands (not void, not failed)."""
        return self.kind is None and self.void is None


def failure_kind(result: dict) -> tuple[str, str]:
    """Name a failed correctness check: crashed, failed to compile or launch, or incorrect."""
    reason = result.get("reason") or "failed"
    if result.get("crashed"):
        return "crashed", reason
    if reason.startswith("launch failed"):
        return "failed", f"failed to compile or launch: {reason.removeprefix('launch failed: ')}"
    if result.get("judge_failed"):
        return "failed", reason
    return "incorrect", f"incorrect: {reason}"


def integrity(store, exp: int, baseline: dict) -> str | None:
    """A verdict is void when its samples were taken under a benchmark harness or a reference (and metric
    definitions) other than the baseline's: the variant changed what it is judged by."""
    samples = store.samples(exp)
    for key, column, what in (("harness", "harness_hash", "benchmark harness"),
                              ("reference", "reference_hash", "reference")):  # fmt: skip
        seen = sorted({str(s[column]) for s in samples} - {baseline[key]})
        if seen:
            return f"void: the {what} changed during the run (hash {', '.join(seen)}, baseline {baseline[key]})"
    return None


YARD_PAIR_MARGIN = 0.03
"""The variant's yardsticks at a level may read at most this much faster (median over its samples) than the
baseline's in the same rounds: the honest spread between two workers' yardsticks is under 1% (H100, 256 MiB)."""


def yardstick_flags(samples: list[dict], ceilings: dict, names: dict[str, str]) -> dict[str, str]:
    """``{level: why}`` for every level with a sample whose yardstick read faster than the card copies (the judge's
    copy and yardstick, whichever is higher, times :data:`YARD_MARGIN`), or whose variant's yardsticks read faster
    than its baseline's in the same rounds (by more than :data:`YARD_PAIR_MARGIN`)."""
    import statistics

    limit = max(ceilings.get("yard_gbps") or 0.0, ceilings.get("copy_gbps") or 0.0)
    out: dict[str, str] = {}
    by: dict[tuple[str, str], list[float]] = {}
    for s in samples:
        g = s.get("yard_gbps")
        if not g:
            continue
        by.setdefault((s["level"], s["arm"]), []).append(g)
        if limit and g > YARD_MARGIN * limit and s["level"] not in out:
            out[s["level"]] = (f"the {names.get(s['arm'], s['arm'])} arm's yardstick read {g:,.0f} GB/s in round "
                               f"{s['round'] + 1}, above what this card copies ({limit:,.0f} GB/s): the timer that "
                               "timed it is not to be believed")  # fmt: skip
    for (level, arm), ys in by.items():
        base = by.get((level, "A"))
        if arm != "B" or not base or level in out:
            continue
        ratio = statistics.median(ys) / statistics.median(base)
        if ratio > 1 + YARD_PAIR_MARGIN:
            out[level] = (f"the {names.get('B', 'variant')} arm's yardstick read {ratio - 1:.1%} faster than the "
                          f"{names.get('A', 'baseline')} arm's in the same rounds (the same copy, the same card): its "
                          "timer is not to be believed")  # fmt: skip
    return out


def foreign_flags(samples: list[dict], names: dict[str, str]) -> dict[str, str]:
    """``{level: why}`` for every level with a sample that saw other GPU work beside it even after it was timed
    again (NVML, agent/tools/worker/neighbours.py): its time is not the kernel's alone."""
    out: dict[str, str] = {}
    for s in samples:
        if s.get("foreign") and s["level"] not in out:
            out[s["level"]] = (f"the {names.get(s['arm'], s['arm'])} arm's round {s['round'] + 1} was timed beside "
                               f"other work on the GPU ({s['foreign']})")  # fmt: skip
    return out


def matrix_peak(ceilings: dict, fallback: float | None) -> tuple[float | None, str]:
    """The matrix peak the plausibility rule uses: the best measured on the card, else the device table's constant
    (said as such)."""
    measured = [v for v in (ceilings.get("matrix_tflops") or {}).values() if v]
    if measured:
        return max(measured), "measured on this card"
    return fallback, "a constant from the device table, not measured here" if fallback else "none known"


def run(store, exp_id: int, backend: Backend, kernel: str, base_cfg: dict, var_cfg: dict, *, env: dict,
        levels: list[Level], thresholds: dict[str, float], seq, var_env: dict | None = None,
        offset_sd: dict[str, float] | None = None, n_variants: int = 1, base_pythonpath: list[str] | None = None,
        names: tuple[str, str] = ("baseline", "variant"), ws: str | None = None, gated: bool = False,
        baseline_hashes: dict | None = None, check_device: str | None = None, matrix_fallback: float | None = None,
        on_round: Callable | None = None, on_gate: Callable | None = None, t0: float | None = None,
        var_pythonpath: list[str] | None = None) -> Outcome:  # fmt: skip
    """The sequential A/B of ``var_cfg`` against ``base_cfg`` with every rule (the module's docstring), stored on
    experiment ``exp_id``.  ``gated``: the caller ran this run's gate on both arms already (the graph's gate
    nodes).  ``base_pythonpath`` / ``var_pythonpath``: a kernel package snapshot each arm imports (gate and rounds
    alike) instead of the source on disk; the judge always imports the baseline's.  Never raises for the variant's failure: the outcome says it (``kind``)."""
    t0 = time.time() if t0 is None else t0
    adapter = get_adapter(kernel)
    var_env = env if var_env is None else var_env
    hashes = baseline_hashes or {"harness": harness_hash(), "reference": kernel_reference_hash(kernel)}
    skipped: list[str] = []
    device = check_device or {"cuda": "cuda", "command": "command"}.get(backend.name, "cpu")

    def stop(kind: str, reason: str, void: str | None = None, spent: float = 0.0) -> Outcome:
        ledger = protocol.Ledger.of(store, [exp_id]).gpu_s
        verdict = "void" if void else kind
        why = (void if reason in void else f"{void} (and then {kind}: {reason})") if void else reason
        timed = bool(store.sample_count(exp_id))
        store.update_experiment(exp_id, status="done" if timed and void else "rejected", verdict=verdict,
                                reason=why, gpu_s=ledger, wall_s=time.time() - t0, finished=time.time(),
                                void_reason=void)  # fmt: skip
        store.merge_resources(exp_id, rules={"skipped": skipped})
        return Outcome(verdict, why, kind=kind, void=void, gpu_s=ledger, spent_s=spent, skipped=skipped)

    # 1. the correctness gate, both arms, judged out of the variant's reach
    backend.experiment = exp_id
    if not gated:
        seed = random.SystemRandom().randrange(2**31)
        for who, cfg, arm_env, path in (("baseline", base_cfg, env, base_pythonpath),
                                             ("variant", var_cfg, var_env, var_pythonpath)):
            if on_gate:
                on_gate(who)
            result = backend.check(kernel, cfg, levels, seed=seed, device=device, env=arm_env, pythonpath=path,
                                   judge_path=base_pythonpath)  # fmt: skip
            if who == "variant":
                correctness.record(store, ws, exp_id, result)
            if not result["ok"]:
                kind, why = failure_kind(result)
                return stop(kind, f"the {names[0] if who == 'baseline' else names[1]} arm: {why}")
    if offset_sd is None:
        skipped.append("A/A offsets: no A/A measured this pair's per-worker offsets, so the intervals assume none")

    # 2-4. the environment check as each arm starts; the rounds; the timed captures checked by the judge
    verified: list[list[str]] = []
    checks_s = [0.0]  # wall seconds the timed captures' checks took (worker and judge)

    def on_open(arm) -> None:
        envcheck.check_worker(store, ws, exp_id, var_env if arm.name == names[1] else env, arm.env_seen)

    def last_captures(arms) -> None:
        for arm in arms:
            verify = getattr(arm, "verify", None)  # an arm on another host (Ray) is checked where it runs, or not
            for lv in levels if verify else ():
                verify(lv, "the last round")
            verified.extend([arm.name, lv, why] for lv, why in getattr(arm, "verified", []))
            checks_s[0] += getattr(arm, "verify_s", 0.0)

    try:
        res, spent = protocol.run_ab(store, exp_id, backend, kernel, base_cfg, var_cfg, env, levels, thresholds, seq,
                                     offset_sd=offset_sd or {}, n_variants=n_variants, base_pythonpath=base_pythonpath,
                                     on_open=on_open, on_round=on_round, names=names, var_env=var_env,
                                     before_close=last_captures, var_pythonpath=var_pythonpath)  # fmt: skip
    except Incorrect as exc:
        return stop("incorrect", f"incorrect: {exc}", integrity(store, exp_id, hashes))
    except Tampered as exc:
        return stop("tampered", str(exc), str(exc))
    except (VariantFailed, NoRecording) as exc:
        kind = "not measured" if isinstance(exc, NoRecording) else "failed"
        return stop(kind, str(exc), integrity(store, exp_id, hashes))

    # 5-6. integrity, then plausibility against the card's own ceilings and the yardsticks

    rows = verdict_rows(res)
    store.add_verdicts(exp_id, rows)
    samples = store.samples(exp_id)
    ledger = protocol.Ledger.of(store, [exp_id]).gpu_s
    ceilings = backend.ceilings()
    peak, peak_source = matrix_peak(ceilings, matrix_fallback)
    ceilings = {**ceilings, "matrix_peak": peak, "matrix_source": peak_source}
    if not any(s.get("yard_gbps") for s in samples):
        skipped.append(f"yardstick: the {backend.name} backend's samples carry none")
    if backend.name == "cuda":
        from kinv.agent.tools.backends.cuda import watch_note

        if watch_note():
            skipped.append(f"no other GPU work: {watch_note()}; other processes kinv started were still stopped "
                           "while each arm was timed")  # fmt: skip
    if not verified and backend.name != "cuda":
        skipped.append(f"timed outputs checked: the {backend.name} backend replays or runs no capture to check")
    void = integrity(store, exp_id, hashes)
    label = {lv.key: lv.label for lv in levels}
    if not void:
        timed = (json.loads(store.experiment(exp_id).get("resources") or "{}")).get("timed")
        flagged = plausibility.flags(adapter, levels, rows, ceilings.get("copy_gbps"), peak, timed)
        tag = {"A": names[0], "B": names[1]}
        for lv, why in [*yardstick_flags(samples, ceilings, tag).items(), *foreign_flags(samples, tag).items()]:
            flagged[lv] = f"{flagged[lv]}; {why}" if lv in flagged else why
        if flagged:
            void = plausibility.void_reason(flagged, label)
            store.event(ws, "implausible", void, {"experiment": exp_id, "levels": sorted(flagged)})
    verdict, reason = ("void", void) if void else (res.verdict, res.reason)
    store.update_experiment(exp_id, status="done", verdict=verdict, reason=reason, rounds=res.rounds, gpu_s=ledger,
                            wall_s=time.time() - t0, finished=time.time(), void_reason=void or None)  # fmt: skip
    store.merge_resources(exp_id, ceilings=ceilings, rules={"skipped": skipped, "verified": verified,
                                                           "verify_s": round(checks_s[0], 3)})
    return Outcome(verdict, reason, result=res, void=void, gpu_s=ledger, spent_s=spent, rounds=res.rounds,
                   skipped=skipped, ceilings=ceilings, verified=verified)  # fmt: skip


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


__all__ = ["RULES", "YARD_MARGIN", "YARD_PAIR_MARGIN", "Outcome", "failure_kind", "foreign_flags", "integrity",
           "matrix_peak", "run", "verdict_rows", "yardstick_flags"]
