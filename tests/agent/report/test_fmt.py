"""Changes and settings are written one way everywhere a person reads them (agent/fmt.py)."""

from __future__ import annotations

import math

import pytest

from kinv.agent import fmt


@pytest.mark.parametrize(("log_ratio", "shown"), [(math.log1p(0.0405), "+4.05%"), (math.log1p(-0.3), "-30.00%"),
                                                  (0.0, "+0.00%"), (None, "—"), (math.inf, "—"), (math.nan, "—")])  # fmt: skip
def test_a_change_is_signed_with_two_decimals_and_a_dash_when_there_is_none(log_ratio, shown):
    assert fmt.change(log_ratio) == shown


def test_an_interval_shows_both_ends_signed():
    assert fmt.interval(0.012, 0.034) == "[+1.20%, +3.40%]"
    assert fmt.interval(-0.05, 0.1, 1) == "[-5.0%, +10.0%]"
    assert fmt.change_interval(math.log1p(0.012), math.log1p(0.034)) == "[+1.20%, +3.40%]"
    assert fmt.change_interval(None, 0.0) == "[—, +0.00%]"


def test_a_percent_as_the_old_formats_wrote_it():
    """The formats this module replaced (``:+.2%``, ``*100:+.2f}%``, ``:+.1%``) print the same text."""
    for x in (0.0405, -0.0001, 1.5, -0.999, 0.000049, 0.125):
        assert fmt.signed(x) == f"{x:+.2%}" == f"{x * 100:+.2f}%"
        assert fmt.signed(x, 1) == f"{x:+.1%}"
        assert fmt.percent(abs(x)) == f"{abs(x):.2%}"


def test_settings_are_written_as_k_equals_v():
    assert fmt.kv({"TARGET_CTAS": 1024, "KINV_X": "1"}) == "TARGET_CTAS=1024 KINV_X=1"
    assert fmt.kv({"BLOCK_T": 16, "num_warps": 4}, ",") == "BLOCK_T=16,num_warps=4"
    assert fmt.kv([("b", 2), ("a", 1)], "/") == "b=2/a=1"
    assert fmt.kv({}) == ""
