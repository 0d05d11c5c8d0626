"""Noise-aware A/B statistics for kernel timing investigations.

Everything here is pure numpy + scipy.  The A/A's analysis (:func:`aa_noise`, :func:`check_aa`) and the one
I/O, :func:`recorded_noise_residuals`, live in agent/tools/measure/noise.py.

Model and conventions
---------------------
A *sample* is a per-launch kernel time in microseconds (the median of >= 20 CUDA-graph replays).  Timing
noise is treated as multiplicative, so every comparison is made on log times.  A measurement *round* times
the baseline (A) and the variant (B) back to back at one level, in ABBA order (:func:`abba_order`), and
yields one *paired log-ratio*::

    d = log(t_base / t_variant)        d > 0  <=>  variant faster  <=>  throughput improved

Clock drift that hits both members of a round (boost clock, temperature, a neighbour's load) multiplies
both times by the same factor and cancels in ``d``; an order effect (the second member of a round running
warmer) flips sign between ABBA rounds and cancels in the mean over an even number of rounds.  The
throughput ratio variant/base is ``exp(d)``.

Under the null hypothesis (the variant is the baseline) ``t_base`` and ``t_variant`` are exchangeable, so
``d`` is *symmetric* about 0 however skewed the raw timing noise is (slow outliers are commoner than fast
ones); with a real multiplicative effect it is symmetric about the effect.  The intervals rely on that
symmetry and on nothing else about the noise's shape:

* the intervals of :mod:`kinv.agent.tools.measure.intervals`: Student t on the mean of ``d`` below
  ``HL_MIN_ROUNDS`` (12) rounds, the Hodges-Lehmann estimate with the exact Wilcoxon signed-rank interval from
  then on (that module says why each holds at the sequential correction's per-look error rates).

The noise band uses a robust scale of ``d`` (biweight midvariance), from the core of the distribution,
without outliers inflating it.

Replicates and variance components
----------------------------------
A *replicate* is one round: both arms re-set (the worker frees its inputs, outputs and scratch, allocates
new ones at a new placement behind a random-size pad, and captures its CUDA graph again), given the same
input data (the round's seed), and timed back to back in ABBA order.  Its paired log-ratio is

    d_r = delta + (u_base - u_variant) + (e_base,r - e_variant,r)

with three parts:

* ``delta``: the variant's true effect at that level;
* ``e``: round-to-round noise -- timing jitter, what the clock does between the two members of a round,
  and (since every round re-sets its arms) the memory placement drawn for that round.  Variance
  ``sigma^2`` per arm; independent across rounds, so ``d`` has variance ``2 sigma^2``;
* ``u``: a persistent per-worker offset that survives re-setting (the old harness's fixed placement was
  one, worth up to ~1% at small batch).  Variance ``tau^2``; it does NOT average away over rounds, so
  the A/B's between-arm offset has variance ``2 tau^2`` whatever the number of rounds.

Rounds on one fixed allocation are *not* replicates (their ``u`` is one draw): that pseudo-replication is
what made identical configs look 1.3% apart before the harness re-set every sample.

Decision pipeline
-----------------
1. A/A (agent/tools/measure/noise.py): ``aa_arms`` baseline workers in every one of ``aa_rounds`` rounds, same protocol as
   the A/B; a robust two-way analysis (outliers winsorized and reported) estimates ``sigma`` and ``tau``,
   and stops the run only when two workers of the same config are confidently further apart than ``T``.
2. The practical threshold ``T`` is the plan's, per level (default 1%).  It is also the equivalence margin.
   The A/A may warn that a level cannot be decided at ``T`` within the round cap; it never moves ``T``.
3. The A/B runs sequentially (:func:`run_sequential`): a quick look after ``quick_rounds`` (8), then a look
   every ``step_rounds`` (4) while some level is undecided, up to ``max_rounds`` (32).  Each look computes
   every level's interval at :func:`look_confidence` -- Bonferroni over looks x levels x the workstream's
   variants (the cross-variant multiplicity rule; #3a: 1 - 0.05/105 = 99.952%) -- and widens it by the
   offset component: ``half = sqrt(half_rounds^2 + (z * sqrt(2) tau)^2)`` (:func:`paired_effect`).
4. Each level is classified (:func:`classify`): improved when the interval excludes 0 and the estimate
   reaches ``T``; regressed in the mirror case; equivalent when the interval lies inside ``+/-T``;
   undecided otherwise.  The levels combine into the variant's verdict (:func:`variant_verdict`).

Error rates, simulated over the shipped recordings' noise (kernels/recordings/) with planted per-arm placement offsets re-drawn every
round (SD 0.25-0.75%), 1,000 investigations per condition (``benchmarks/verdict_simulation.py``, figures in
``benchmarks/RESULTS.md``): false claims under the null 0.0% at every offset SD (target <= 1%); a true
+/-1.5% (1.5 T) decided in the right direction at 98.2-100% of levels for offset SD <= 0.5%, 94.0-99.4% at
0.75% (b1 is the one level under 95%); wrong-direction verdicts 0; mean rounds 14-18 at +/-1.5%, 26-32 under
the null.  With one fixed allocation per worker instead (offset drawn once), the same rules still make a
false claim in 15% of null investigations (54% without the offset component): the harness must re-set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kinv.agent.tools.measure.intervals import _check_conf, _pct, _z_quantile, effect_interval, paired_log_ratios

LEVEL_VERDICTS = ("improved", "regressed", "equivalent", "undecided")
VARIANT_VERDICTS = ("accept", "reject", "mixed", "inconclusive")

DEFAULT_THRESHOLD = 0.01
"""Default practical threshold (relative): a change under 1% is not worth a config change.  The plan fixes
the threshold per level; the data never move it."""



# --------------------------------------------------------------------------------------------------
# A/B: per-level effect and verdict
# --------------------------------------------------------------------------------------------------


@dataclass
class Effect:
    """The paired effect of a variant at one level.

    ``effect`` is the estimated centre of the paired log-ratios ``log(t_base / t_variant)`` (their mean, or
    the Hodges-Lehmann estimate from ``HL_MIN_ROUNDS`` rounds on): positive = variant faster = throughput
    improved; ``ratio = exp(effect)`` is the throughput ratio variant/base.  ``ci_low`` and
    ``ci_high`` bound ``effect``; ``verdict`` is one of :data:`LEVEL_VERDICTS` (:func:`classify`).
    """

    level: str
    n: int
    effect: float
    ci_low: float
    ci_high: float
    ratio: float
    threshold: float
    verdict: str
    conf: float = 0.95
    offset_sd: float = 0.0


def classify(effect: float, ci_low: float, ci_high: float, threshold: float) -> str:
    """A level's verdict from its effect, interval and practical threshold ``T``.

    * improved   : ``ci_low > 0`` and ``effect >= T`` -- significantly faster, and by a practical amount
    * regressed  : ``ci_high < 0`` and ``effect <= -T`` -- the mirror image
    * equivalent : ``-T < ci_low`` and ``ci_high < T`` -- any change is confidently inside the threshold
    * undecided  : anything else (more rounds needed)

    The four are mutually exclusive (equivalence needs ``effect <= ci_high < T``).  Requiring the interval
    to exclude 0 bounds the false-claim rate by the interval's error rate; requiring the point estimate to
    reach ``T`` keeps a real but tiny change (or a lucky quick look) from counting as a gain.  Equivalence is
    the two one-sided tests (TOST) procedure read off the same interval.
    """
    if ci_low > 0.0 and effect >= threshold:
        return "improved"
    if ci_high < 0.0 and effect <= -threshold:
        return "regressed"
    if -threshold < ci_low and ci_high < threshold:
        return "equivalent"
    return "undecided"


def paired_effect(
    base_us: Sequence[float],
    variant_us: Sequence[float],
    level: str,
    threshold: float,
    conf: float = 0.95,
    method: str = "auto",
    offset_sd: float = 0.0,
) -> Effect:
    """Paired effect of the variant over the baseline at one level, from rounds of (base, variant) times.

    With ``d_i = log(base_i / variant_i)``, the effect and its two-sided ``conf`` interval come from
    :func:`effect_interval`: the mean and Student-t interval for fewer than ``HL_MIN_ROUNDS`` rounds, the
    Hodges-Lehmann estimate and exact Wilcoxon signed-rank interval from then on -- both valid under
    heavy-tailed noise because ``d`` is symmetric (module docstring).  In a sequential investigation pass
    the per-look confidence of :func:`look_confidence`, not the nominal one.  The verdict follows
    :func:`classify`.

    ``offset_sd`` is the SD of the between-arm offset the A/A measured (:func:`aa_noise`): a constant
    that this pair of workers carries through every round.  It is a second variance component, added to
    each side of the rounds' interval in quadrature at the same confidence::

        half = sqrt(half_rounds^2 + (z_{(1+conf)/2} * offset_sd)^2)

    so rounds can shrink the first part, never the second.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be non-negative, got {threshold}")
    if offset_sd < 0 or not math.isfinite(offset_sd):
        raise ValueError(f"offset_sd must be a finite non-negative number, got {offset_sd}")
    d = paired_log_ratios(base_us, variant_us)
    m, lo, hi = effect_interval(d, conf=conf, method=method)
    if offset_sd > 0:
        zo = _z_quantile(0.5 + conf / 2.0) * offset_sd
        lo, hi = m - math.hypot(m - lo, zo), m + math.hypot(hi - m, zo)
    return Effect(
        level=level,
        n=int(d.size),
        effect=m,
        ci_low=lo,
        ci_high=hi,
        ratio=math.exp(m),
        threshold=float(threshold),
        verdict=classify(m, lo, hi, threshold),
        conf=conf,
        offset_sd=offset_sd,
    )


def abba_order(round_index: int) -> tuple[str, str]:
    """Which arm to time first in a round: ``("A", "B")`` for even rounds, ``("B", "A")`` for odd ones.

    Over rounds 0..3 this is A B | B A | A B | B A, so a linear drift within a round or a fixed "second one
    runs warmer" effect enters the paired log-ratios with alternating sign and cancels in pairs of rounds.
    """
    if round_index < 0:
        raise ValueError(f"round_index must be non-negative, got {round_index}")
    return ("A", "B") if round_index % 2 == 0 else ("B", "A")


# --------------------------------------------------------------------------------------------------
# sequential plan
# --------------------------------------------------------------------------------------------------


@dataclass
class SequentialPlan:
    """Rounds for a sequential A/B: a quick look, then looks every ``step_rounds`` up to ``max_rounds``.

    ``conf`` is the *overall* confidence: the chance that any level, at any look, gets an interval that
    misses its true effect is at most ``1 - conf`` (see :func:`look_confidence`).
    """

    quick_rounds: int = 8
    step_rounds: int = 4
    max_rounds: int = 32
    conf: float = 0.95

    def __post_init__(self) -> None:
        if self.quick_rounds < 2 or self.step_rounds < 1 or self.max_rounds < self.quick_rounds:
            raise ValueError(f"bad plan {self}: need quick_rounds >= 2, step_rounds >= 1, max >= quick")
        _check_conf(self.conf)

    def look_rounds(self) -> list[int]:
        """Round counts at which the plan looks: quick_rounds, +step_rounds, ..., max_rounds."""
        looks = [self.quick_rounds]
        while looks[-1] < self.max_rounds:
            looks.append(min(looks[-1] + self.step_rounds, self.max_rounds))
        return looks

    @property
    def n_looks(self) -> int:
        return len(self.look_rounds())


def look_confidence(plan: SequentialPlan, n_levels: int = 1, n_variants: int = 1) -> float:
    """Confidence of each interval at each look: Bonferroni over the looks, the levels and the variants.

    ``conf_look = 1 - (1 - plan.conf) / (n_looks * n_levels * n_variants)``; the default plan (looks at
    8, 12, ..., 32 rounds) over 5 levels and the 3 variants of #3a gives ``1 - 0.05 / 105 = 0.99952``.
    Counting the workstream's variants is the cross-variant multiplicity rule: the 95% holds for the
    whole workstream, not for each variant on its own.  By the union bound the chance that *any*
    interval of the investigation misses its level's true effect is at most ``1 - plan.conf``, however the
    looks are correlated and whenever the investigation stops; a false "improved" or "regressed" needs such a
    miss, so the chance of any false claim anywhere is at most ``(1 - plan.conf) / 2`` (one-sided).  Stopping
    early only removes looks, which keeps the bound.  Bonferroni is conservative (the looks share data), and
    the practical threshold on top of it makes false claims rarer still; the cost is a quick look that only
    decides very clear cases.
    """
    if n_levels < 1 or n_variants < 1:
        raise ValueError("n_levels and n_variants must be >= 1")
    return 1.0 - (1.0 - plan.conf) / (plan.n_looks * n_levels * n_variants)


def sequential_decision(effects: dict[str, Effect], rounds_done: int, plan: SequentialPlan) -> str:
    """``"continue"`` while some level is undecided and the budget (``max_rounds``) allows, else ``"stop"``.

    The per-look intervals must come from :func:`look_confidence` for the error rates to hold across looks.
    """
    if rounds_done >= plan.max_rounds:
        return "stop"
    if any(e.verdict == "undecided" for e in effects.values()):
        return "continue"
    return "stop"


def level_names(keys: Iterable[str]) -> tuple[str, dict[str, str]]:
    """``(common, {key: short})``: the ``/``-separated segments every level key shares (the varying ones
    shown as ``*``), and each key's varying segments, so a table puts the common part in its title and keeps
    its rows narrow: ``b1``, ``b8`` for ``v4flash/h16/p64/ctx4096/b1``, ...; ``t1``, ``t8`` for
    ``t1/e32/k8/h7168/n4096``, ...  With one key, or keys of different shapes, the last segment varies."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return "", {}
    parts = [k.split("/") for k in keys]
    width = len(parts[0])
    if len(keys) > 1 and all(len(p) == width for p in parts):
        vary = [i for i in range(width) if len({p[i] for p in parts}) > 1]
    else:
        vary = [width - 1] if all(p[:-1] == parts[0][:-1] for p in parts) else list(range(width))
    if len(vary) == width:
        return "", {k: k for k in keys}
    common = "/".join("*" if i in vary else seg for i, seg in enumerate(parts[0]))
    return common, {k: "/".join(p[i] for i in vary) for k, p in zip(keys, parts)}


def _levels_text(effects: Iterable[Effect], short: dict[str, str] | None = None) -> str:
    return ", ".join(f"{(short or {}).get(e.level, e.level)} ({_pct(e.effect)})" for e in effects)


def variant_verdict(effects: dict[str, Effect], budget_exhausted: bool) -> tuple[str, str]:
    """Combine the levels' verdicts into ``(verdict, one-line reason)``; verdict in :data:`VARIANT_VERDICTS`.

    In order:

    * mixed        : improved at some level(s) and regressed at others -- a candidate for a level-conditional
      config (undecided levels cannot undo that).
    * reject       : regressed at some level(s) and improved nowhere; or equivalent at every level ("no gain
      beyond the noise band").
    * accept       : improved at >= 1 level, and every other level improved or equivalent.  An undecided level
      blocks acceptance even when the budget is spent: it may hide a regression.
    * inconclusive : anything else -- some level still undecided with nothing decisive elsewhere (or with
      gains elsewhere that cannot be accepted yet).  ``budget_exhausted`` only changes the reason's wording.
    """
    if not effects:
        raise ValueError("no levels to judge")
    by = {v: [e for e in effects.values() if e.verdict == v] for v in LEVEL_VERDICTS}
    unknown = [e.level for e in effects.values() if e.verdict not in LEVEL_VERDICTS]
    if unknown:
        raise ValueError(f"unknown level verdicts at {unknown}")
    short = level_names(effects)[1]  # reasons name levels by what varies (b1, b8, ...)
    imp, reg, eq, und = by["improved"], by["regressed"], by["equivalent"], by["undecided"]
    if imp and reg:
        return "mixed", (
            f"improved at {_levels_text(imp, short)} but regressed at {_levels_text(reg, short)}: "
            "candidate for a level-conditional config"
        )
    if reg:
        return "reject", f"regressed at {_levels_text(reg, short)}, improved nowhere"
    if len(eq) == len(effects):
        return "reject", "equivalent at every level: no gain beyond the noise band"
    if imp and not und:
        rest = f"; equivalent at {', '.join(short[e.level] for e in eq)}" if eq else ""
        return "accept", f"improved at {_levels_text(imp, short)}{rest}; regressed nowhere"
    when = "after the full budget" if budget_exhausted else "so far (more rounds needed)"
    und_text = f"undecided at {_levels_text(und, short)} {when}"
    if imp:
        # a practical regression (an effect at or below -T) is ruled out where the interval's lower bound clears -T
        open_ = [e for e in und if e.ci_low <= -e.threshold]
        if not open_:
            return "inconclusive", (f"improved at {_levels_text(imp, short)} but {und_text}: a regression beyond the "
                                    "threshold is ruled out there, a gain of the threshold is not shown")
        return "inconclusive", (f"improved at {_levels_text(imp, short)} but {und_text}: a regression is not ruled "
                                f"out at {', '.join(short.get(e.level, e.level) for e in open_)}")
    return "inconclusive", und_text + ", no level improved or regressed"


@dataclass
class SequentialResult:
    """Outcome of :func:`run_sequential`.

    ``looks`` lists ``(rounds, {level: verdict})`` at every look, ``quick_look`` is the first of them,
    ``conf_per_look`` the corrected per-look confidence, and ``samples`` the raw ``(base_us, variant_us)``
    lists per level.
    """

    effects: dict[str, Effect]
    rounds: int
    verdict: str
    reason: str
    looks: list[tuple[int, dict[str, str]]]
    quick_look: dict[str, str]
    conf_per_look: float
    samples: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)


def run_sequential(
    sample_fn: Callable[[int], Mapping[str, tuple[float, float]]],
    levels: list[str],
    thresholds: dict[str, float],
    plan: SequentialPlan,
    offset_sd: Mapping[str, float] | None = None,
    n_variants: int = 1,
) -> SequentialResult:
    """Run a sequential A/B to a verdict.

    ``sample_fn(round_index)`` measures ONE round and returns ``{level: (base_us, variant_us)}`` for every
    level (the caller times the two arms in :func:`abba_order`); a level left out lost its sample that round.  The loop runs ``plan.quick_rounds`` rounds,
    looks (every level classified by :func:`paired_effect` at :func:`look_confidence`), and then keeps adding
    ``plan.step_rounds`` rounds and looking while :func:`sequential_decision` says ``"continue"``.  The
    verdict is :func:`variant_verdict` of the last look.
    """
    if not levels:
        raise ValueError("no levels")
    missing = [lv for lv in levels if lv not in thresholds]
    if missing:
        raise ValueError(f"no threshold for levels {missing}")
    conf_look = look_confidence(plan, len(levels), n_variants)
    offset_sd = offset_sd or {}
    base: dict[str, list[float]] = {lv: [] for lv in levels}
    variant: dict[str, list[float]] = {lv: [] for lv in levels}
    looks: list[tuple[int, dict[str, str]]] = []
    effects: dict[str, Effect] = {}
    rounds = 0
    for target in plan.look_rounds():
        while rounds < target:
            got = sample_fn(rounds)
            for lv in levels:
                if lv not in got:  # a lost sample: this round has no pair at lv
                    continue
                b, v = got[lv]
                base[lv].append(float(b))
                variant[lv].append(float(v))
            rounds += 1
        effects = {lv: paired_effect(base[lv], variant[lv], lv, thresholds[lv], conf=conf_look,
                                     offset_sd=offset_sd.get(lv, 0.0)) for lv in levels}  # fmt: skip
        looks.append((rounds, {lv: e.verdict for lv, e in effects.items()}))
        if sequential_decision(effects, rounds, plan) == "stop":
            break
    verdict, reason = variant_verdict(effects, budget_exhausted=rounds >= plan.max_rounds)
    return SequentialResult(
        effects=effects,
        rounds=rounds,
        verdict=verdict,
        reason=reason,
        looks=looks,
        quick_look=dict(looks[0][1]),
        conf_per_look=conf_look,
        samples={lv: (base[lv], variant[lv]) for lv in levels},
    )
