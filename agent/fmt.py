"""How kinv writes a change and a setting for a person: percentages (``+4.05%``, intervals ``[+1.20%, +3.40%]``)
and ``K=V`` descriptions (``TARGET_CTAS=1024 KINV_X=1``).  Standard library only, so that any module may use it.

A *change* is what a person reads: variant / baseline - 1 (``0.0405`` prints ``+4.05%``).  The measurement code
works in paired log-ratios; :func:`change` and :func:`change_interval` take those and print the change they mean
(``expm1``).  A missing or infinite value prints as a dash."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

NONE = "—"
"""What a missing value prints as."""


def signed(x: float, digits: int = 2) -> str:
    """A change as a signed percent: ``signed(0.0405)`` is ``+4.05%``, ``signed(-0.3, 1)`` is ``-30.0%``."""
    return f"{x:+.{digits}%}"


def percent(x: float, digits: int = 2) -> str:
    """A share or a band as an unsigned percent: ``percent(0.012)`` is ``1.20%``."""
    return f"{x:.{digits}%}"


def interval(lo: float, hi: float, digits: int = 2) -> str:
    """An interval of changes: ``interval(0.012, 0.034)`` is ``[+1.20%, +3.40%]``."""
    return f"[{signed(lo, digits)}, {signed(hi, digits)}]"


def change(log_ratio: float | None, digits: int = 2) -> str:
    """A paired log-ratio as the throughput change a person reads (variant / baseline - 1): ``+4.05%``, or a dash
    when there is none."""
    if log_ratio is None or not math.isfinite(log_ratio):
        return NONE
    return signed(math.expm1(log_ratio), digits)


def change_interval(lo: float | None, hi: float | None, digits: int = 2) -> str:
    """An interval of paired log-ratios as the changes they mean: ``[+1.20%, +3.40%]``."""
    return f"[{change(lo, digits)}, {change(hi, digits)}]"


def kv(pairs: Mapping | Iterable[tuple], sep: str = " ") -> str:
    """``K=V`` for each pair, joined by ``sep``: ``kv({"TARGET_CTAS": 1024, "X": 1})`` is ``TARGET_CTAS=1024 X=1``,
    ``kv(config, ",")`` is ``BLOCK_T=16,num_warps=4``."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return sep.join(f"{k}={v}" for k, v in items)


__all__ = ["NONE", "change", "change_interval", "interval", "kv", "percent", "signed"]
