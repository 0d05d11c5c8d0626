"""The close-out's sentences follow from the verdicts its tables print (rendered from a store built directly)."""

from __future__ import annotations

from kinv.agent import report
from tests.closeout_fixture import build, outcome

ALL = ("b1", "b8", "b32", "b64", "b96")


def _levels(verdict, change, lo, hi, labels=ALL):
    return {lab: (verdict, change, lo, hi) for lab in labels}


def _render(tmp_path, **kw):
    store, plan, state, ctx = build(tmp_path, **kw)
    return report.render(store, plan, state, ctx)


# ---- behaviour that was right before the sentences were derived from the verdicts, pinned --------------------
def test_every_variant_measured_or_moot_and_none_improved_is_refuted(tmp_path):
    text = _render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28)),
                                       "V2": ("reject", _levels("equivalent", 0.001, -0.002, 0.004))},
                   cancelled={"V3": "moot: V1 regressed at every level"})  # fmt: skip
    assert "The hypothesis is refuted for this kernel shape" in outcome(text)
    assert "not refuted" not in outcome(text) and "supported where" not in outcome(text)


def test_an_undecided_level_with_nothing_improved_is_neither_supported_nor_refuted(tmp_path):
    v2 = {**_levels("equivalent", 0.001, -0.002, 0.004, ALL[:3]), **_levels("undecided", 0.006, -0.02, 0.03, ALL[3:])}
    text = _render(tmp_path, measured={"V1": ("reject", _levels("regressed", -0.3, -0.32, -0.28)),
                                       "V2": ("inconclusive", v2)},
                   cancelled={"V3": "moot: V1 regressed at every level"})  # fmt: skip
    assert "not refuted either; undecided levels in V2" in outcome(text)
    assert "refuted for this kernel shape" not in outcome(text)


def test_a_null_drill_equivalent_where_predicted_says_the_null_holds(tmp_path):
    n1 = {**_levels("equivalent", 0.001, -0.003, 0.004, ("b1", "b8")),
          **_levels("improved", 0.05, 0.04, 0.06, ("b32", "b64", "b96"))}
    text = _render(tmp_path, plan_file="3c-null-batch-aware.yaml", measured={"N1": ("accept", n1)})
    assert "- The null holds: equivalent at b1, b8 for every measured variant." in outcome(text)
    assert "refuted" not in outcome(text)
