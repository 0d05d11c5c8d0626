"""The A/A's analysis: how noisy the harness is at each level, its outliers, and whether it reproduces the
baseline at all (agent.stats holds the estimators it uses).

``aa_arms`` baseline workers (default 4) are timed in every one of ``aa_rounds`` rounds (default 16), the
A/B's protocol (agent/tools/measure/protocol.py).  A robust two-way analysis (median-polish fit, outliers winsorized
at 5 robust SDs and reported) estimates the round noise ``sigma`` and the per-worker offset ``tau``; ``tau``
is counted only when its F-test has p < 1% (with 3 degrees of freedom its moment estimate is too noisy to
take at face value).  A few outliers never stop a run; :class:`HarnessBroken` is raised only when two
workers of the same config are more than the threshold apart with 99.9% confidence, and names the level.

Also :func:`recorded_noise_residuals`, the only I/O of the statistics: relative residuals pooled from
recorded samples, which simulations draw noise from.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from kinv.agent.errors import HarnessBroken
from kinv.agent.tools.measure.intervals import _as_times, _pct, _t_quantile, _z_quantile, robust_scale, t_interval
from kinv.agent.tools.measure.stats import DEFAULT_THRESHOLD

RECORDINGS_DIR = Path(__file__).resolve().parents[1] / "kernels" / "recordings"


# --------------------------------------------------------------------------------------------------
# A/A: noise band and harness check
# --------------------------------------------------------------------------------------------------


@dataclass
class NoiseBand:
    """What the A/A (the baseline timed by ``n_arms`` workers against itself) says about one level.

    All figures are relative (0.004 = 0.4%) and on log times.

    * ``round_sd``: SD of one round's paired log-ratio between two arms (what the A/B's rounds scatter by).
    * ``offset_sd``: SD of the *between-arm offset* of a comparison: a constant that one pair of workers
      carries through all its rounds and that no number of rounds averages away.  The A/B adds it to
      its interval as a variance component (:func:`paired_effect`).
    * ``band``: ``1.96 * round_sd``, the half-width holding 95% of single paired rounds (for display).
    * ``max_gap``: the largest difference between two arms' mean log times; ``effect`` / ``ci_low`` /
      ``ci_high``: that pair's paired effect and 95% interval (offset component included).
    * ``outliers``: samples more than ``OUTLIER_K`` robust SDs off the arm-and-round fit; they are
      winsorized, reported, and never abort anything.
    * ``threshold``: the plan's margin at this level.  ``equivalent``: the A/A's interval lies inside it.
    * ``broken``: some two arms of the same config differ by more than the threshold with 99.9%
      confidence -- evidence that the harness does not reproduce the baseline.  ``warning``: the noise
      is too large to decide at the threshold within the plan's rounds (the margin is never widened).
    """

    level: str
    band: float
    n_pairs: int
    cv: float
    equivalent: bool
    effect: float
    ci_low: float
    ci_high: float
    round_sd: float = 0.0
    offset_sd: float = 0.0
    n_arms: int = 2
    outliers: int = 0
    max_gap: float = 0.0
    threshold: float = DEFAULT_THRESHOLD
    broken: bool = False
    warning: str = ""
    offset_p: float = 1.0


OFFSET_ALPHA = 0.01
"""The between-arm offset enters the A/B's interval when the A/A's F-test for an arm effect has p below this."""

OUTLIER_K = 5.0
"""A sample whose residual from the arm + round fit exceeds this many robust SDs is an outlier."""

BROKEN_CONF = 0.999
"""Confidence with which two A/A arms must differ by more than the threshold to call the harness broken."""


def _median_polish(y: np.ndarray, iters: int = 4) -> np.ndarray:
    """Fitted values of an additive arm + round model by Tukey's median polish (robust to outliers)."""
    resid = y.copy()
    for _ in range(iters):
        resid = resid - np.median(resid, axis=1, keepdims=True)
        resid = resid - np.median(resid, axis=0, keepdims=True)
    return y - resid


def aa_noise(
    arms_us: Sequence[Sequence[float]],
    level: str,
    threshold: float = DEFAULT_THRESHOLD,
    max_rounds: int = 32,
    look_conf: float = 0.999,
) -> NoiseBand:
    """Analyse an A/A at one level: ``arms_us[j][r]`` is arm j's time in round r (every arm in every round).

    Model, on log times: ``y[j, r] = mu + a_j + b_r + e[j, r]``, with ``a_j`` arm j's persistent offset
    (variance ``tau^2``), ``b_r`` what round r does to every arm (data seed, clock), and ``e`` the
    round-to-round noise (variance ``sigma^2``; with the re-set protocol it includes each round's own
    memory placement).  Outliers are found against a median-polish fit, winsorized to ``OUTLIER_K``
    robust SDs and counted; then the classical two-way analysis gives ``sigma^2 = MS_resid`` and
    ``tau^2 = max(0, (MS_arm - MS_resid) / rounds)``, taken as 0 unless the F-test of the arm effect
    (``MS_arm / MS_resid`` on ``k - 1`` and ``(k - 1)(n - 1)`` degrees of freedom) has p < ``OFFSET_ALPHA``.  A comparison of two workers has round variance
    ``2 sigma^2`` and a between-arm offset of variance ``2 tau^2``.

    The threshold is the plan's and is not changed here.  ``warning`` is set when even ``max_rounds``
    rounds at ``look_conf`` would leave an interval wider than the threshold.
    """
    y = np.log(np.asarray([_as_times(a, f"arm {j}") for j, a in enumerate(arms_us)], dtype=float))
    if y.ndim != 2 or y.shape[0] < 2:
        raise ValueError(f"an A/A needs at least 2 arms with equal round counts at level {level}")
    k, n = y.shape
    if n < 3:
        raise ValueError(f"an A/A needs at least 3 rounds, got {n} at level {level}")
    fit = _median_polish(y)
    resid = y - fit
    scale = robust_scale(resid.ravel()) * math.sqrt(k * n / max(1, (k - 1) * (n - 1)))
    lim = OUTLIER_K * max(scale, 1e-9)
    outliers = int(np.sum(np.abs(resid) > lim))
    yc = fit + np.clip(resid, -lim, lim)
    grand = yc.mean()
    am, rm = yc.mean(axis=1), yc.mean(axis=0)
    ms_arm = n * float(np.sum((am - grand) ** 2)) / (k - 1)
    e = yc - am[:, None] - rm[None, :] + grand
    ms_e = float(np.sum(e**2)) / ((k - 1) * (n - 1))
    offset_p = float(stats.f.sf(ms_arm / ms_e, k - 1, (k - 1) * (n - 1))) if ms_e > 0 else 0.0
    # with few arms the moment estimate of tau^2 is noisy (k - 1 degrees of freedom): taken at face value
    # it would widen every A/B interval when there is no offset at all; it enters only on evidence
    tau2 = max(0.0, (ms_arm - ms_e) / n) if offset_p < OFFSET_ALPHA else 0.0
    round_sd = math.sqrt(2.0 * ms_e)
    offset_sd = math.sqrt(2.0 * tau2)
    cv = robust_scale((y - np.median(y, axis=1, keepdims=True)).ravel())
    # the pair of arms furthest apart, with its paired interval (rounds + offset component)
    i, j = int(np.argmax(am)), int(np.argmin(am))
    d = yc[i] - yc[j]  # log(t_i / t_j): positive = arm j faster
    m, lo, hi = t_interval(d, 0.95)
    z95 = _z_quantile(0.975)
    lo, hi = m - math.hypot(m - lo, z95 * offset_sd), m + math.hypot(hi - m, z95 * offset_sd)
    equivalent = -threshold < lo and hi < threshold
    _, blo, bhi = t_interval(d, BROKEN_CONF)
    broken = blo > threshold or bhi < -threshold
    # can the A/B decide at this threshold within max_rounds?  Half-width of its last look's interval.
    half = _t_quantile(0.5 + look_conf / 2.0, max_rounds - 1) * round_sd / math.sqrt(max_rounds)
    half = math.hypot(half, _z_quantile(0.5 + look_conf / 2.0) * offset_sd)
    warning = ""
    if half >= threshold:
        warning = (f"noise at {level} (round SD {round_sd:.2%}, arm offset SD {offset_sd:.2%}) is too large to "
                   f"decide at the plan's ±{threshold:.2%} within {max_rounds} rounds (predicted half-width "
                   f"±{half:.2%}): expect 'undecided' there; raise stats.max_rounds or set that level's threshold")
    return NoiseBand(
        level=level, band=z95 * round_sd, n_pairs=n, cv=cv, equivalent=bool(equivalent), effect=m, ci_low=lo,
        ci_high=hi, round_sd=round_sd, offset_sd=offset_sd, n_arms=k, outliers=outliers, max_gap=float(am[i] - am[j]),
        threshold=threshold, broken=bool(broken), warning=warning, offset_p=offset_p,
    )  # fmt: skip


def check_aa(bands: list[NoiseBand]) -> list[str]:
    """Raise :class:`HarnessBroken` naming every level where the A/A is evidence of a broken harness;
    return the warnings (levels too noisy to decide at their threshold) otherwise."""
    bad = [b for b in bands if b.broken]
    if bad:
        parts = [
            f"A/A at {b.level}: {b.n_arms} workers of the same config differ by up to {_pct(b.max_gap)} over "
            f"{b.n_pairs} rounds (99.9% sure beyond the ±{b.threshold:.2%} threshold; round SD {b.round_sd:.2%})"
            for b in bad
        ]
        raise HarnessBroken("; ".join(parts) + ": the harness does not reproduce the baseline there", [b.level for b in bad])
    return [b.warning for b in bands if b.warning]


# --------------------------------------------------------------------------------------------------
# recorded noise
# --------------------------------------------------------------------------------------------------


def _is_time(u: object) -> bool:
    return isinstance(u, int | float) and not isinstance(u, bool) and math.isfinite(u) and u > 0


def _read_lines(f: Path) -> list[str]:
    opener = gzip.open if f.name.endswith(".gz") else open
    with opener(f, "rt", encoding="utf-8") as fh:
        return [line for line in (raw.strip() for raw in fh) if line]


def _recording_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for pat in ("*.jsonl", "*.jsonl.gz") for p in root.rglob(pat) if p.is_file())


def recorded_noise_residuals(path: str | Path | None = None, min_cell: int = 3) -> np.ndarray | None:
    """Relative timing residuals pooled from recorded samples, or ``None`` when there are none.

    Reads every JSON-lines file (``*.jsonl`` or ``*.jsonl.gz``) under ``path`` (default
    ``kernels/recordings/``, searched recursively; a single file may be given too).  Each line is an object
    with ``"level"``, ``"config_hash"``, ``"us"`` (one time or a list of them) and ``"kind"`` (``"ab"`` or
    ``"aa"``); lines whose ``"type"`` is present and not ``"sample"`` (headers) are skipped.  Samples are
    grouped into cells by (file, kind, arm if recorded, level, config_hash); each sample's residual is
    ``us / median(cell) - 1``.  Cells with fewer than ``min_cell`` samples say nothing about spread and are
    skipped; blank or malformed lines are skipped too.  The residuals include whatever drift the recording
    had, so noise simulated from them is, if anything, pessimistic.
    """
    root = Path(path) if path is not None else RECORDINGS_DIR
    cells: dict[tuple[str, ...], list[float]] = {}
    for f in _recording_files(root):
        try:
            lines = _read_lines(f)
        except (OSError, EOFError, UnicodeDecodeError):
            continue  # an unreadable or truncated recording contributes nothing
        for line in lines:
            try:
                rec = json.loads(line)
                if rec.get("type", "sample") != "sample" or "level" not in rec:
                    continue
                us = rec["us"]
            except (json.JSONDecodeError, AttributeError, KeyError):
                continue
            key = (str(f), *(str(rec.get(k, "")) for k in ("kind", "arm", "level", "config_hash")))
            values = us if isinstance(us, list) else [us]
            cells.setdefault(key, []).extend(float(u) for u in values if _is_time(u))
    residuals = [np.asarray(v) / np.median(v) - 1.0 for v in cells.values() if len(v) >= min_cell]
    if not residuals:
        return None
    return np.concatenate(residuals)
