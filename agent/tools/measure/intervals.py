"""The intervals of the A/B statistics: the paired log-ratios of a level's rounds, the centre of them and its
interval, and a robust scale.  Pure numpy + scipy; the model they rest on (multiplicative noise, paired
ABBA rounds, ``d = log(t_base / t_variant)`` symmetric about the effect) is in
:mod:`kinv.agent.tools.measure.stats`' docstring.

* with fewer than ``HL_MIN_ROUNDS`` (12) rounds, the Student-t interval on the mean of ``d``.  For symmetric
  noise the t statistic's tails are no heavier than Student's -- heavy tails make it conservative, not
  liberal -- so it stays valid even at the tiny per-look error rates of the sequential correction
  (simulated with 5% outliers 3-10x wider: 0.3-0.7x the nominal rate; shaped like the shipped
  recordings' noise: 0.3-0.5x).  What it loses under outliers is power: one wild round widens it for the rest of the run.
* from ``HL_MIN_ROUNDS`` rounds on, the Hodges-Lehmann estimate (median of the Walsh averages
  ``(d_i + d_j) / 2``, ``i <= j``) with the exact Wilcoxon signed-rank interval.  Under symmetry its coverage
  is exact whatever the tails (distribution-free), it has 95% of the t-interval's efficiency on Gaussian
  noise and far more under outliers.  Below 12 rounds the signed-rank interval cannot reach the per-look
  confidence of the default plan (its smallest attainable two-sided level is ``2 / 2**n``), hence the t part.
  Each look's interval is valid on its own, which is all the sequential (union-bound) correction needs.
  (Should a variant change the *shape* of the noise -- say, turn bimodal -- ``d`` is no longer symmetric and
  the Hodges-Lehmann estimate tracks the typical round rather than the mean; that is the behaviour wanted
  from a throughput claim, but worth knowing when the two disagree.)

  A 20%-trimmed mean with the Tukey-McLaughlin t interval was tried and rejected: with 8-32 rounds at the
  corrected per-look level its false-significance rate ran 1.2-1.6x nominal on Gaussian noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import stats

from kinv.agent.fmt import signed

HL_MIN_ROUNDS = 12
"""From this many paired rounds on, intervals are Hodges-Lehmann / Wilcoxon signed-rank (else Student t)."""

HL_MAX_ROUNDS = 500
"""Above this many rounds ``"auto"`` goes back to the t-interval: the n(n+1)/2 Walsh averages get costly, and
with hundreds of rounds the t-interval's validity rests on the central limit theorem as well."""

_EXACT_SIGNED_RANK_MAX_N = 200
"""Exact signed-rank null distribution up to this n; a normal approximation beyond (it is excellent there)."""

# small numerical helpers
@lru_cache(maxsize=4096)
def _t_quantile(q: float, df: float) -> float:
    """Student-t quantile, cached: the sequential loop asks for the same few (q, df) pairs over and over."""
    return float(stats.t.ppf(q, df))


@lru_cache(maxsize=256)
def _z_quantile(q: float) -> float:
    return float(stats.norm.ppf(q))


def _check_conf(conf: float) -> None:
    if not 0.0 < conf < 1.0:
        raise ValueError(f"conf must lie in (0, 1), got {conf}")


def _as_times(x: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float).ravel()
    if arr.size and (not np.all(np.isfinite(arr)) or np.any(arr <= 0)):
        raise ValueError(f"{name} must hold finite, positive times in microseconds")
    return arr


def paired_log_ratios(base_us: Sequence[float], variant_us: Sequence[float]) -> np.ndarray:
    """Per-round ``log(base / variant)``; positive where the variant ran faster."""
    base = _as_times(base_us, "base_us")
    variant = _as_times(variant_us, "variant_us")
    if base.shape != variant.shape:
        raise ValueError(f"paired samples differ in length: {base.size} base vs {variant.size} variant")
    return np.log(base) - np.log(variant)


def t_interval(d: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``d`` and its two-sided Student-t interval: ``mean -/+ t_{(1+conf)/2, n-1} * sd / sqrt(n)``."""
    _check_conf(conf)
    d = np.asarray(d, dtype=float).ravel()
    if d.size < 2:
        raise ValueError(f"need at least 2 paired samples, got {d.size}")
    m = float(d.mean())
    half = _t_quantile(0.5 + conf / 2.0, d.size - 1) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return m, m - half, m + half


@lru_cache(maxsize=256)
def _signed_rank_cdf(n: int) -> np.ndarray:
    """Exact null CDF of the Wilcoxon signed-rank statistic W+ for n untied values: P(W+ <= w), w = 0..n(n+1)/2.

    W+ is the sum of a uniformly random subset of {1..n}, so the counts come from the polynomial
    prod_i (1 + x^i), built one factor at a time.
    """
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for i in range(1, n + 1):
        counts[i:] = counts[i:] + counts[:-i].copy()
    return np.cumsum(counts) / 2.0**n


def _signed_rank_k(n: int, conf: float) -> int:
    """Largest k with P(W+ <= k - 1) <= (1 - conf) / 2; 0 when even the extreme interval is not that sure."""
    alpha_half = (1.0 - conf) / 2.0
    if n <= _EXACT_SIGNED_RANK_MAX_N:
        return int(np.searchsorted(_signed_rank_cdf(n), alpha_half * (1 + 1e-12), side="right"))
    mean = n * (n + 1) / 4.0
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    return max(0, int(math.floor(mean + 0.5 + _z_quantile(alpha_half) * sd)))


def hodges_lehmann_ci(d: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of the centre of ``d`` and its exact Wilcoxon signed-rank interval.

    With the ``M = n(n+1)/2`` Walsh averages ``(d_i + d_j) / 2`` (``i <= j``) sorted as ``W_(1..M)``, the
    estimate is their median and the interval is ``[W_(k), W_(M+1-k)]``, ``k`` from the exact signed-rank
    distribution (:func:`_signed_rank_k`).  For any continuous distribution symmetric about its centre the
    coverage is at least ``conf``.  When ``conf`` is out of reach for this n (``2 / 2**n > 1 - conf``) the
    interval is ``(-inf, inf)``.
    """
    _check_conf(conf)
    d = np.asarray(d, dtype=float).ravel()
    n = d.size
    if n < 2:
        raise ValueError(f"need at least 2 paired samples, got {n}")
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2.0)
    est = float(np.median(walsh))
    k = _signed_rank_k(n, conf)
    if k < 1:
        return est, -math.inf, math.inf
    return est, float(walsh[k - 1]), float(walsh[walsh.size - k])


def effect_interval(d: Sequence[float], conf: float = 0.95, method: str = "auto") -> tuple[float, float, float]:
    """``(estimate, ci_low, ci_high)`` for the centre of the paired log-ratios ``d``.

    ``method``: ``"t"`` (:func:`t_interval`), ``"hl"`` (:func:`hodges_lehmann_ci`), or ``"auto"``: Hodges-Lehmann
    for ``HL_MIN_ROUNDS <= n <= HL_MAX_ROUNDS`` when its interval is attainable at ``conf``, the t-interval
    otherwise (see the module docstring for why).

    Robustness has limits at the very high per-look confidence of a sequential plan: a wild round moves the
    ``n`` Walsh averages it takes part in, and the interval ignores them only once ``k`` (the number of Walsh
    averages cut from each end) exceeds ``n`` -- from about 20 rounds at the default plan's 0.99875.  Before
    that, a wild round keeps the level undecided, and the plan simply takes more rounds.
    """
    n = np.asarray(d).size
    if method == "t":
        return t_interval(d, conf)
    if method == "hl":
        return hodges_lehmann_ci(d, conf)
    if method != "auto":
        raise ValueError(f"method must be 'auto', 't' or 'hl', got {method!r}")
    if HL_MIN_ROUNDS <= n <= HL_MAX_ROUNDS and _signed_rank_k(n, conf) >= 1:
        return hodges_lehmann_ci(d, conf)
    return t_interval(d, conf)


def robust_scale(x: Sequence[float]) -> float:
    """Biweight midvariance scale of ``x`` (tuning constant c = 9), normal-consistent to about 1%.

    ``u_i = (x_i - median) / (9 MAD)`` and, over ``|u_i| < 1``::

        s^2 = n * sum((x_i - M)^2 (1 - u_i^2)^4) / (sum((1 - u_i^2)(1 - 5 u_i^2)))^2

    It ignores gross outliers like the MAD does, but with about 85% of the standard deviation's efficiency
    on Gaussian data instead of the MAD's 37%, so a modest A/A gives a usable noise band.  When more than
    half the values are identical (MAD = 0) it falls back to the standard deviation.
    """
    x = np.asarray(x, dtype=float).ravel()
    if x.size < 2:
        raise ValueError("need at least 2 values for a scale")
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    if mad <= 0.0:
        return float(x.std(ddof=1))
    u = (x - med) / (9.0 * mad)
    inside = np.abs(u) < 1.0
    u2 = u[inside] ** 2
    num = x.size * float(np.sum((x[inside] - med) ** 2 * (1.0 - u2) ** 4))
    den = float(np.sum((1.0 - u2) * (1.0 - 5.0 * u2)))
    if den == 0.0:
        return float(x.std(ddof=1))
    return math.sqrt(num) / abs(den)


def _pct(x: float) -> str:
    """A log-ratio as a signed percent change of throughput."""
    return signed(math.expm1(x))
