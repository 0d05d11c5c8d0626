"""Tests of agent/stats.py: unit behaviour, and the error rates of the whole A/A -> sequential A/B pipeline.

The simulations follow what kinv does on a GPU:

* each investigation first runs an A/A (the baseline against itself, 32 rounds per level) and takes its noise
  band from :func:`noise_band` and its threshold from :func:`practical_threshold`;
* then a sequential A/B through :func:`run_sequential` over 5 levels, the sample function timing the two
  arms in :func:`abba_order`.

Per-sample timing noise is either shaped like recorded samples (:func:`recorded_noise_residuals`, rescaled
to a CV of 0.3%) or, when nothing is recorded, a heavy-tailed mixture: 95% Gaussian with CV 0.3% and 5%
outliers 3-10x wider, 80% of them slow.  Every scenario is also run with plain Gaussian noise.  On top of
the per-sample noise, each round's clock drift (CV 1%, far above the per-sample noise) multiplies both arms
of the round alike, and whichever arm runs second in a round is 0.1% slower (a warm-up/order effect).

"The noise band" a true effect is measured in is the band of the noise model itself, from
:func:`noise_band` on a 20000-round A/A; each investigation's own 32-round A/A estimates it with error, and
that error is part of what the rates below include.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from agent.stats import (
    HL_MIN_ROUNDS,
    LEVEL_VERDICTS,
    VARIANT_VERDICTS,
    Effect,
    HarnessBroken,
    NoiseBand,
    SequentialPlan,
    abba_order,
    check_aa,
    classify,
    look_confidence,
    noise_band,
    paired_effect,
    practical_threshold,
    recorded_noise_residuals,
    robust_scale,
    run_sequential,
    sequential_decision,
    variant_verdict,
)

LEVELS = ["b1", "b8", "b32", "b64", "b96"]
BASE_US = np.array([25.6, 31.0, 52.0, 80.0, 110.0])  # per-level baseline kernel times
CV = 0.003  # per-sample timing noise of the simulations (coefficient of variation)
DRIFT_CV = 0.01  # per-round clock drift shared by both arms of a round
ORDER_EFFECT = 0.001  # the arm timed second in a round runs this much slower
AA_ROUNDS = 32
N_INV = 1000

Noise = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


# --------------------------------------------------------------------------------------------------
# noise models and the simulated pipeline
# --------------------------------------------------------------------------------------------------


def gaussian_noise(cv: float = CV) -> Noise:
    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.normal(0.0, cv, shape)

    return draw


def heavy_tailed_noise(cv: float = CV) -> Noise:
    """95% N(0, cv) + 5% outliers with scale 3-10x cv, 80% of them slow (positive residual)."""

    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        core = rng.normal(0.0, cv, shape)
        outlier = rng.random(shape) < 0.05
        scale = rng.uniform(3.0, 10.0, shape) * cv
        sign = np.where(rng.random(shape) < 0.8, 1.0, -1.0)
        return np.where(outlier, sign * np.abs(rng.normal(0.0, 1.0, shape)) * scale, core)

    return draw


def shaped_noise(cv: float = CV) -> tuple[str, Noise]:
    """Noise shaped like the recordings when there are any (rescaled to ``cv``), else the heavy-tailed mixture."""
    residuals = recorded_noise_residuals()
    if residuals is None or residuals.size < 50:
        return "heavy-tailed mixture", heavy_tailed_noise(cv)
    scaled = residuals * (cv / max(robust_scale(residuals), 1e-12))

    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return np.clip(rng.choice(scaled, size=shape), -0.5, None)

    return f"recorded residuals (n={residuals.size})", draw


def simulate_times(
    rng: np.random.Generator,
    noise: Noise,
    n_inv: int,
    rounds: int,
    log_effect: float,
    abba: bool = True,
    order_effect: float = ORDER_EFFECT,
) -> tuple[np.ndarray, np.ndarray]:
    """Base and variant times, shape (investigations, levels, rounds); variant = base * exp(-log_effect).

    Both arms of a round share that round's drift; the arm timed second (per :func:`abba_order`, or always B
    when ``abba`` is False) is ``order_effect`` slower.
    """
    shape = (n_inv, len(LEVELS), rounds)
    drift = np.exp(rng.normal(0.0, DRIFT_CV, shape))
    b_second = np.array([abba_order(r)[1] == "B" if abba else True for r in range(rounds)])
    slow_a = np.where(b_second, 1.0, 1.0 + order_effect)
    slow_b = np.where(b_second, 1.0 + order_effect, 1.0)
    t = BASE_US[None, :, None] * drift
    base = t * (1.0 + noise(rng, shape)) * slow_a
    variant = t * math.exp(-log_effect) * (1.0 + noise(rng, shape)) * slow_b
    return base, variant


def reference_band(noise: Noise, seed: int = 12345) -> float:
    """The noise model's own band: noise_band() on one very long A/A."""
    base, base2 = simulate_times(np.random.default_rng(seed), noise, 1, 20000, 0.0)
    return noise_band(base[0, 0], base2[0, 0], "reference").band


def run_investigations(
    noise: Noise,
    log_effect: float,
    seed: int,
    n_inv: int = N_INV,
    plan: SequentialPlan | None = None,
    threshold_override: float | None = None,
    abba: bool = True,
) -> list:
    """A/A then sequential A/B, ``n_inv`` times; returns the SequentialResults."""
    plan = plan or SequentialPlan()
    rng = np.random.default_rng(seed)
    aa_a, aa_a2 = simulate_times(rng, noise, n_inv, AA_ROUNDS, 0.0)
    base, variant = simulate_times(rng, noise, n_inv, plan.max_rounds, log_effect, abba=abba)
    results = []
    for i in range(n_inv):
        if threshold_override is None:
            bands = [noise_band(aa_a[i, j], aa_a2[i, j], lv) for j, lv in enumerate(LEVELS)]
            check_aa(bands)
            thresholds = {b.level: practical_threshold(b.band) for b in bands}
        else:
            thresholds = dict.fromkeys(LEVELS, threshold_override)

        def sample(r: int, i: int = i) -> dict[str, tuple[float, float]]:
            return {lv: (base[i, j, r], variant[i, j, r]) for j, lv in enumerate(LEVELS)}

        results.append(run_sequential(sample, LEVELS, thresholds, plan))
    return results


def regressed_somewhere(res) -> bool:
    return any(e.verdict == "regressed" for e in res.effects.values())


def false_claim(res) -> bool:
    return any(e.verdict in ("improved", "regressed") for e in res.effects.values())


NOISE_MODELS = {"shaped": shaped_noise, "gaussian": lambda: ("gaussian", gaussian_noise())}


# --------------------------------------------------------------------------------------------------
# simulated error rates of the whole pipeline
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["shaped", "gaussian"])
def test_no_true_effect_is_accepted_or_called_a_regression_at_most_1_percent(model):
    name, noise = NOISE_MODELS[model]()
    results = run_investigations(noise, 0.0, seed=101 if model == "shaped" else 102)
    accepted = sum(r.verdict == "accept" for r in results) / len(results)
    rejected_as_regressed = sum(r.verdict == "reject" and regressed_somewhere(r) for r in results) / len(results)
    any_claim = sum(false_claim(r) for r in results) / len(results)
    verdicts = {v: sum(r.verdict == v for r in results) for v in VARIANT_VERDICTS}
    msg = (
        f"{name} noise, no true effect, {len(results)} investigations: accepted {accepted:.1%}, "
        f"rejected as regressed {rejected_as_regressed:.1%}, any level improved/regressed {any_claim:.1%}; "
        f"verdicts {verdicts}; mean rounds {np.mean([r.rounds for r in results]):.1f}"
    )
    assert accepted + rejected_as_regressed <= 0.01, msg
    assert any_claim <= 0.01, msg
    # and the usual outcome is the honest one: "equivalent at every level: no gain beyond the noise band"
    no_gain = sum(r.reason.startswith("equivalent at every level") for r in results) / len(results)
    assert no_gain >= 0.95, f"{msg}; rejected as no gain {no_gain:.1%}"


@pytest.mark.parametrize("model", ["shaped", "gaussian"])
@pytest.mark.parametrize("direction", [+1, -1], ids=["faster", "slower"])
def test_true_effect_of_three_noise_bands_is_detected_at_least_95_percent(model, direction):
    name, noise = NOISE_MODELS[model]()
    band = reference_band(noise)
    seed = {("shaped", 1): 201, ("shaped", -1): 202, ("gaussian", 1): 203, ("gaussian", -1): 204}[model, direction]
    results = run_investigations(noise, direction * 3.0 * band, seed=seed)
    if direction > 0:
        detected = sum(r.verdict == "accept" for r in results) / len(results)
        wrong = sum(regressed_somewhere(r) for r in results) / len(results)
    else:
        detected = sum(r.verdict == "reject" and regressed_somewhere(r) for r in results) / len(results)
        wrong = sum(any(e.verdict == "improved" for e in r.effects.values()) for r in results) / len(results)
    verdicts = {v: sum(r.verdict == v for r in results) for v in VARIANT_VERDICTS}
    msg = (
        f"{name} noise, true effect {'+' if direction > 0 else '-'}3 x band ({3 * band:.2%}), "
        f"{len(results)} investigations: detected {detected:.1%}, wrong direction {wrong:.1%}; "
        f"verdicts {verdicts}; mean rounds {np.mean([r.rounds for r in results]):.1f}"
    )
    assert detected >= 0.95, msg
    assert wrong == 0.0, msg


@pytest.mark.parametrize("model", ["shaped", "gaussian"])
def test_repeated_looks_do_not_inflate_the_false_significance_rate(model):
    """With the practical threshold switched off (T = 0, pure significance), the chance that ANY level at ANY
    of the 8 looks is called improved/regressed without a true effect stays under 1 - conf = 5%.  The same
    data judged at an uncorrected 95% per look would cross far more often: that is what the correction buys.
    """
    name, noise = NOISE_MODELS[model]()
    plan = SequentialPlan()
    results = run_investigations(noise, 0.0, seed=301 if model == "shaped" else 302, threshold_override=0.0)
    corrected = sum(any(v in ("improved", "regressed") for _, vs in r.looks for v in vs.values()) for r in results)
    corrected /= len(results)
    naive = 0
    for r in results:
        crossed = False
        for rounds in plan.look_rounds():
            for base_us, variant_us in r.samples.values():
                e = paired_effect(base_us[:rounds], variant_us[:rounds], "x", threshold=0.0, conf=plan.conf)
                crossed |= e.verdict != "undecided"
        naive += crossed
    naive /= len(results)
    msg = (
        f"{name} noise, T=0: any false significance over {plan.n_looks} looks x {len(LEVELS)} levels: "
        f"{corrected:.1%} with per-look conf {look_confidence(plan, len(LEVELS)):.5f}, "
        f"{naive:.1%} at an uncorrected {plan.conf:.0%} per look"
    )
    assert corrected <= 1.0 - plan.conf, msg
    assert naive > 2 * (1.0 - plan.conf), msg


def test_seed_story_small_gain_inside_a_5_percent_band_is_never_accepted():
    """The story kinv comes from: noise of +/-5%, a quick look showing +0.6%.  Simulated 300 times with a
    real +0.6% gain, the quick look never says "improved" and the variant is never accepted."""
    noise = heavy_tailed_noise(cv=0.018)
    band = reference_band(noise)
    assert 0.04 < band < 0.07, f"story noise band {band:.2%}, expected about 5%"
    results = run_investigations(noise, math.log(1.006), seed=401, n_inv=300)
    quick_improved = sum(any(v == "improved" for v in r.quick_look.values()) for r in results) / len(results)
    accepted = sum(r.verdict == "accept" for r in results) / len(results)
    verdicts = {v: sum(r.verdict == v for r in results) for v in VARIANT_VERDICTS}
    msg = f"band {band:.2%}, true +0.6%: quick look improved {quick_improved:.1%}, accepted {accepted:.1%}, {verdicts}"
    assert quick_improved == 0.0, msg
    assert accepted == 0.0, msg


def test_abba_order_cancels_a_strong_order_effect():
    """A 2% "second one runs slower" effect, no true effect: with ABBA rounds it cancels and nothing is
    claimed; timing A before B every round would turn it into a spurious 2% regression."""
    noise = heavy_tailed_noise()
    rates = {}
    for abba in (True, False):
        rng = np.random.default_rng(501)
        n_inv, plan = 200, SequentialPlan()
        base, variant = simulate_times(rng, noise, n_inv, plan.max_rounds, 0.0, abba=abba, order_effect=0.02)
        aa_a, aa_a2 = simulate_times(rng, noise, n_inv, AA_ROUNDS, 0.0)
        claims = 0
        for i in range(n_inv):
            thresholds = {
                lv: practical_threshold(noise_band(aa_a[i, j], aa_a2[i, j], lv).band) for j, lv in enumerate(LEVELS)
            }

            def sample(r: int, b: np.ndarray = base[i], v: np.ndarray = variant[i]) -> dict[str, tuple[float, float]]:
                return {lv: (b[j, r], v[j, r]) for j, lv in enumerate(LEVELS)}

            claims += false_claim(run_sequential(sample, LEVELS, thresholds, plan))
        rates[abba] = claims / n_inv
    msg = f"false claims with a 2% order effect: ABBA {rates[True]:.1%}, always A-then-B {rates[False]:.1%}"
    assert rates[True] <= 0.01, msg
    assert rates[False] >= 0.5, msg


# --------------------------------------------------------------------------------------------------
# A/A: noise band and the harness check
# --------------------------------------------------------------------------------------------------


def _aa(noise: Noise, rounds: int, seed: int, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    a, a2 = simulate_times(np.random.default_rng(seed), noise, 1, rounds, offset)
    return a[0, 0], a2[0, 0]


def test_noise_band_matches_the_noise_and_ignores_outliers():
    gauss = reference_band(gaussian_noise())
    expected = 1.96 * math.sqrt(2) * CV  # 95% half-width of a difference of two N(0, CV) log noises
    assert abs(gauss / expected - 1) < 0.05, f"Gaussian band {gauss:.3%}, expected {expected:.3%}"
    heavy = reference_band(heavy_tailed_noise())
    assert heavy < 1.25 * gauss, f"5% outliers inflated the band from {gauss:.3%} to {heavy:.3%}"
    a, a2 = _aa(heavy_tailed_noise(), AA_ROUNDS, seed=7)
    nb = noise_band(a, a2, "b8")
    assert isinstance(nb, NoiseBand) and nb.level == "b8" and nb.n_pairs == AA_ROUNDS
    assert nb.equivalent and nb.ci_low < 0 < nb.ci_high, nb
    # the raw per-sample CV carries the 1% round drift that pairing removes; the band does not
    assert nb.cv > 2 * CV and nb.band < 2.5 * 1.96 * math.sqrt(2) * CV, nb


@pytest.mark.parametrize("model", ["shaped", "gaussian"])
def test_aa_check_rarely_cries_wolf(model):
    name, noise = NOISE_MODELS[model]()
    rng = np.random.default_rng(8)
    a, a2 = simulate_times(rng, noise, 400, AA_ROUNDS, 0.0)
    broken = 0
    for i in range(a.shape[0]):
        try:
            check_aa([noise_band(a[i, j], a2[i, j], lv) for j, lv in enumerate(LEVELS)])
        except HarnessBroken:
            broken += 1
    assert broken / a.shape[0] <= 0.01, f"{name} noise: healthy harness flagged broken in {broken / 400:.1%} of 400"


def test_aa_with_a_systematically_slower_second_arm_breaks_the_harness():
    noise = heavy_tailed_noise()
    bands = []
    for j, lv in enumerate(LEVELS):
        a, a2 = _aa(noise, AA_ROUNDS, seed=20 + j, offset=math.log(1 / 1.10) if lv == "b32" else 0.0)
        bands.append(noise_band(a, a2, lv))
    assert [b.equivalent for b in bands] == [True, True, False, True, True], bands
    with pytest.raises(HarnessBroken, match=r"A/A at level b32 came out .*the harness is broken") as err:
        check_aa(bands)
    assert err.value.levels == ["b32"]
    assert "b8" not in str(err.value)
    check_aa([b for b in bands if b.level != "b32"])  # the healthy levels pass


def test_noise_band_rejects_too_few_or_unpaired_samples():
    with pytest.raises(ValueError):
        noise_band([10.0, 10.1], [10.0, 10.2], "b1")
    with pytest.raises(ValueError):
        noise_band([10.0, 10.1, 10.2], [10.0, 10.2], "b1")
    with pytest.raises(ValueError):
        noise_band([10.0, -1.0, 10.2], [10.0, 10.2, 10.1], "b1")


# --------------------------------------------------------------------------------------------------
# unit behaviour
# --------------------------------------------------------------------------------------------------


def test_abba_order_alternates():
    assert [abba_order(r) for r in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    assert abba_order(31) == ("B", "A")


@pytest.mark.parametrize("band", [0.0, 0.001, 0.004, 0.005, 0.02, 0.05, 0.3])
def test_practical_threshold_is_max_of_1_percent_and_twice_the_band_and_never_inside_the_band(band):
    assert practical_threshold(band) == pytest.approx(max(0.01, 2 * band))
    assert practical_threshold(band) >= band
    assert practical_threshold(band, k=0.5) >= band  # even a k below 1 never puts the threshold inside the noise
    assert practical_threshold(band, min_threshold=0.0, k=2.0) == pytest.approx(2 * band)


def test_paired_effect_sign_and_ratio():
    rng = np.random.default_rng(1)
    base = 50.0 * (1 + rng.normal(0, 0.002, 12))
    variant = base / 1.05 * (1 + rng.normal(0, 0.002, 12))  # 5% faster
    e = paired_effect(base, variant, "b64", threshold=0.01)
    assert isinstance(e, Effect) and e.level == "b64" and e.n == 12
    assert e.effect > 0 and e.ci_low > 0 and e.verdict == "improved", e
    assert e.ratio == pytest.approx(1.05, rel=0.005) and e.ratio == pytest.approx(math.exp(e.effect))
    r = paired_effect(variant, base, "b64", threshold=0.01)  # swapped: the variant is 5% slower
    assert r.effect < 0 and r.verdict == "regressed" and r.ratio < 1, r
    same = paired_effect(base, base * (1 + rng.normal(0, 0.002, 12)), "b64", threshold=0.01)
    assert same.verdict == "equivalent", same


def test_paired_effect_interval_is_the_t_interval_on_the_mean_for_few_rounds():
    base = np.array([100.0, 101.0, 99.5, 100.5, 100.2])
    variant = np.array([98.0, 99.5, 98.0, 98.3, 98.9])
    d = np.log(base / variant)
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    e = paired_effect(base, variant, "b1", threshold=0.01)
    assert e.effect == pytest.approx(d.mean())
    assert (e.ci_low, e.ci_high) == pytest.approx((d.mean() - half, d.mean() + half))


@pytest.mark.parametrize("conf", [0.95, 1 - 0.05 / 40])
def test_paired_effect_from_12_rounds_is_the_exact_wilcoxon_interval(conf):
    """From HL_MIN_ROUNDS rounds the interval is exactly the set of shifts the exact two-sided Wilcoxon
    signed-rank test does not reject at 1 - conf, around the Hodges-Lehmann estimate."""
    rng = np.random.default_rng(11)
    d = rng.standard_t(2, 16) * 0.003 + 0.01  # heavy tails
    base = np.full(16, 60.0)
    e = paired_effect(base, base / np.exp(d), "b96", threshold=0.01, conf=conf)
    walsh = [(d[i] + d[j]) / 2 for i in range(16) for j in range(i, 16)]
    assert e.effect == pytest.approx(np.median(walsh))
    eps = 1e-9
    for edge in (e.ci_low, e.ci_high):
        inside = edge + (eps if edge == e.ci_low else -eps)
        outside = edge - (eps if edge == e.ci_low else -eps)
        assert stats.wilcoxon(d - inside, method="exact").pvalue > 1 - conf
        assert stats.wilcoxon(d - outside, method="exact").pvalue <= 1 - conf
    assert HL_MIN_ROUNDS == 12


def test_one_wild_round_does_not_hide_a_clear_gain():
    """20 rounds of a 5% gain with one round 30% off (a preempted replay): still improved at the per-look
    confidence, where the t-interval on the mean would be blown wide open."""
    rng = np.random.default_rng(12)
    base = 40.0 * (1 + rng.normal(0, 0.003, 20))
    variant = base / 1.05 * (1 + rng.normal(0, 0.003, 20))
    variant[5] *= 1.30
    conf = look_confidence(SequentialPlan(), len(LEVELS))
    e = paired_effect(base, variant, "b32", threshold=0.02, conf=conf)
    assert e.verdict == "improved" and e.ratio == pytest.approx(1.05, rel=0.01), e
    assert paired_effect(base, variant, "b32", threshold=0.02, conf=conf, method="t").verdict == "undecided"


def test_classify_rules():
    assert classify(0.05, 0.01, 0.09, 0.03) == "improved"
    assert classify(0.02, 0.01, 0.029, 0.03) == "equivalent"  # real but below the threshold
    assert classify(0.02, 0.01, 0.04, 0.03) == "undecided"  # significant, but may or may not matter
    assert classify(0.05, -0.01, 0.11, 0.03) == "undecided"  # big estimate, not significant
    assert classify(-0.05, -0.09, -0.01, 0.03) == "regressed"
    assert classify(0.0, -0.02, 0.02, 0.03) == "equivalent"
    assert set(LEVEL_VERDICTS) == {"improved", "regressed", "equivalent", "undecided"}


def test_seed_story_quick_look_of_plus_0_6_percent_in_a_5_percent_band_is_not_improved():
    """Four rounds averaging +0.6% under +/-5% noise: not a gain, at nominal or per-look confidence."""
    band = 0.05
    threshold = practical_threshold(band)
    assert threshold == pytest.approx(0.10)
    sd = band / 1.96  # spread of a single paired log-ratio for a 5% band
    d = np.array([1.0, -1.0, 0.5, -0.5]) * sd + math.log(1.006)
    base = np.full(4, 40.0)
    variant = base / np.exp(d)
    for conf in (0.95, look_confidence(SequentialPlan(), len(LEVELS))):
        e = paired_effect(base, variant, "b8", threshold=threshold, conf=conf)
        assert e.ratio == pytest.approx(1.006, rel=1e-6)
        assert e.verdict in ("undecided", "equivalent"), e
    # even with almost no spread, +0.6% is under the practical threshold: equivalent, never improved
    tight = paired_effect(base, base / 1.006 * np.array([1, 1.0001, 0.9999, 1]), "b8", threshold=threshold)
    assert tight.verdict == "equivalent", tight


def _eff(level: str, verdict: str, effect: float = 0.0) -> Effect:
    return Effect(level, 8, effect, effect - 0.01, effect + 0.01, math.exp(effect), 0.02, verdict)


def _effects(**verdicts: str) -> dict[str, Effect]:
    sign = {"improved": 0.05, "regressed": -0.05}
    return {lv: _eff(lv, v, sign.get(v, 0.0)) for lv, v in verdicts.items()}


def test_variant_verdict_accept():
    v, why = variant_verdict(_effects(b1="improved", b8="equivalent", b32="improved"), budget_exhausted=False)
    assert v == "accept" and "improved at b1" in why and "b32" in why and "regressed nowhere" in why, why


def test_variant_verdict_reject_on_regression_and_on_no_effect():
    v, why = variant_verdict(_effects(b1="regressed", b8="equivalent", b32="undecided"), budget_exhausted=False)
    assert v == "reject" and "regressed at b1" in why, why
    v, why = variant_verdict(_effects(b1="equivalent", b8="equivalent"), budget_exhausted=False)
    assert (v, why) == ("reject", "equivalent at every level: no gain beyond the noise band")


def test_variant_verdict_mixed():
    v, why = variant_verdict(_effects(b1="improved", b8="regressed", b32="undecided"), budget_exhausted=True)
    assert v == "mixed" and "improved at b1" in why and "regressed at b8" in why and "level-conditional" in why, why


def test_variant_verdict_inconclusive():
    v, why = variant_verdict(_effects(b1="equivalent", b8="undecided"), budget_exhausted=True)
    assert v == "inconclusive" and "undecided at b8" in why and "full budget" in why, why
    # a gain elsewhere does not excuse an undecided level: it may hide a regression
    v, why = variant_verdict(_effects(b1="improved", b8="undecided"), budget_exhausted=True)
    assert v == "inconclusive" and "regression is not ruled out" in why, why
    v, why = variant_verdict(_effects(b1="undecided"), budget_exhausted=False)
    assert v == "inconclusive" and "more rounds" in why, why
    assert set(VARIANT_VERDICTS) == {"accept", "reject", "mixed", "inconclusive"}


def test_sequential_decision_continues_only_while_undecided_and_within_budget():
    plan = SequentialPlan()
    assert plan.look_rounds() == [4, 8, 12, 16, 20, 24, 28, 32]
    assert look_confidence(plan, 5) == pytest.approx(1 - 0.05 / 40)
    undecided = _effects(b1="improved", b8="undecided")
    assert sequential_decision(undecided, 4, plan) == "continue"
    assert sequential_decision(undecided, 32, plan) == "stop"
    assert sequential_decision(_effects(b1="improved", b8="equivalent"), 4, plan) == "stop"


def test_run_sequential_records_looks_and_stops_when_decided():
    plan = SequentialPlan(quick_rounds=4, step_rounds=4, max_rounds=12)
    calls = []

    def sample(r: int) -> dict[str, tuple[float, float]]:
        calls.append(r)
        wobble = 1 + 0.001 * (-1) ** r
        return {"b1": (20.0 * wobble, 20.0 / 1.10 * wobble), "b8": (30.0 * wobble, 30.0 * wobble * 1.0001)}

    res = run_sequential(sample, ["b1", "b8"], {"b1": 0.02, "b8": 0.02}, plan)
    assert calls == list(range(res.rounds))
    assert res.looks[0][0] == 4 and res.quick_look == res.looks[0][1]
    assert res.verdict == "accept" and res.effects["b1"].verdict == "improved", res.reason
    assert res.effects["b8"].verdict == "equivalent"
    assert res.rounds == res.looks[-1][0] <= 12
    assert res.conf_per_look == pytest.approx(1 - 0.05 / (3 * 2))

    def undecided(r: int) -> dict[str, tuple[float, float]]:
        return {"b1": (20.0, 20.0 * (1.2 if r % 2 else 0.8))}  # +/-20% swings: never decided

    res = run_sequential(undecided, ["b1"], {"b1": 0.02}, plan)
    assert res.rounds == 12 and [n for n, _ in res.looks] == [4, 8, 12]
    assert res.verdict == "inconclusive" and "full budget" in res.reason


# --------------------------------------------------------------------------------------------------
# recorded noise
# --------------------------------------------------------------------------------------------------


def test_recorded_noise_residuals_reads_jsonl_and_gz(tmp_path):
    assert recorded_noise_residuals(tmp_path) is None  # nothing recorded
    assert recorded_noise_residuals(tmp_path / "missing") is None
    rows = [{"level": "b1", "config_hash": "abc", "kind": "ab", "us": u} for u in (10.0, 10.1, 9.9, 10.2)]
    rows += [{"level": "b8", "config_hash": "abc", "kind": "aa", "us": [20.0, 20.4, 19.6]}]
    rows += [{"level": "b32", "config_hash": "abc", "kind": "ab", "us": 5.0}]  # a one-sample cell: skipped
    sub = tmp_path / "mla_decode" / "2024"
    sub.mkdir(parents=True)
    (sub / "run1.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n\nnot json\n")
    with gzip.open(sub / "run2.jsonl.gz", "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows[4:]) + "\n")
    res = recorded_noise_residuals(tmp_path)
    assert res is not None and res.size == 7
    cell_b1 = np.array([10.0, 10.1, 9.9, 10.2]) / 10.05 - 1
    np.testing.assert_allclose(np.sort(res), np.sort(np.concatenate([cell_b1, [0.0, 0.02, -0.02]])), atol=1e-12)
