"""Property test: every close-out sentence agrees with the verdicts its tables print, for generated verdict sets
(every combination of level verdicts, unmeasured levels, variants a person rejected, moot, failed or never run)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kinv.agent.report.summary import LevelVerdict, VariantVerdict, summarize
from kinv.agent.tools.measure import stats

T = 0.01
LABELS = ("L0", "L1", "L2", "L3")


@st.composite
def level(draw, label):
    if draw(st.integers(0, 5)) == 0:
        return LevelVerdict(label, "unmeasured")
    a, b, c = sorted(draw(st.floats(-0.06, 0.06, allow_nan=False)) for _ in range(3))
    return LevelVerdict(label, stats.classify(b, a, c, T), b, a, c, T)


@st.composite
def variant(draw, vid, labels):
    status = draw(st.sampled_from(("measured", "measured", "measured", "rejected", "moot", "failed", "not run")))
    if status != "measured":
        note = {"rejected": "rejected by a person: not now", "moot": "moot: V0 regressed at every level",
                "failed": "incorrect on fresh inputs", "not run": "wall budget spent"}[status]
        return VariantVerdict(vid, status, "incorrect" if status == "failed" else None, note=note, changes="knob 2")
    lvs = tuple(draw(level(lab)) for lab in labels)
    timed = {lv.label: stats.Effect(lv.label, 8, lv.effect, lv.ci_low, lv.ci_high, math.exp(lv.effect), T, lv.verdict)
             for lv in lvs if lv.verdict != "unmeasured"}  # fmt: skip
    word = stats.variant_verdict(timed, budget_exhausted=True)[0] if timed else None
    return VariantVerdict(vid, "measured", word, lvs, changes="knob 2")


@st.composite
def case(draw):
    labels = LABELS[: draw(st.integers(1, 4))]
    vs = [draw(variant(f"V{i}", labels)) for i in range(draw(st.integers(1, 3)))]
    expect = draw(st.sampled_from(("improvement", "improvement", "no_change")))
    expect_levels = tuple(draw(st.lists(st.sampled_from(labels), unique=True))) if expect == "no_change" else ()
    live = draw(st.sampled_from(("BT16/w4", "BT64/w4")))
    campaign = draw(st.sampled_from((None, "#7")))
    return vs, expect, expect_levels, live, campaign


def at(v, verdict):
    return [lv for lv in v.levels if lv.verdict == verdict] if v.status == "measured" else []


@settings(max_examples=200, deadline=None)
@given(case())
def test_every_sentence_agrees_with_the_tables(c):
    vs, expect, expect_levels, live, campaign = c
    s = summarize(vs, baseline="BT16/w4", live=live, live_file="k.json", expect=expect, expect_levels=expect_levels,
                  incumbent_of=campaign)  # fmt: skip
    text = "\n".join(s.lines)
    measured = [v for v in vs if v.status == "measured" and any(lv.verdict != "unmeasured" for lv in v.levels)]
    improved = [v for v in measured if at(v, "improved")]
    beat = [v for v in measured if at(v, "improved") and not at(v, "regressed")]
    gaps = any(v.status in ("rejected", "failed", "not run") for v in vs) or any(
        v.status == "measured" and (v not in measured or at(v, "unmeasured")) for v in vs)
    undecided = any(at(v, "undecided") for v in measured)

    # each variant's line says what its table says, level by level
    for v in vs:
        line = s.outcome[v.id]
        if v.status == "measured":
            und = at(v, "undecided")
            assert line.count("a regression is not ruled out") == sum(lv.ci_low <= -T for lv in und), line
            assert line.count("a regression is ruled out") == sum(lv.ci_low > -T for lv in und), line
            assert ("regressed nowhere" in line or "regressed at no measured level" in line) == (v in beat), line
            for lv in v.levels:
                if lv.verdict in ("improved", "regressed"):
                    assert f"{lv.verdict} at" in line and lv.label in line, line
        else:
            assert "never" in line and "refuted" not in line, line
            assert ("rejected by a person" in line) == (v.status == "rejected")
            assert line.startswith("**moot**") == (v.status == "moot")
            assert "knob 2 untested" in line

    # the file on disk, named truthfully; "incumbent" only in a campaign
    stays = [x for x in s.lines if " stays " in x]
    assert len(stays) == 1 and f"k.json stays {live}" in stays[0]
    assert ("not against the live file" in stays[0]) == (live != "BT16/w4")
    assert ("incumbent" in text) == (campaign is not None and live != "BT16/w4")
    assert "regression is not ruled out" not in text or any(lv.ci_low <= -T for v in measured
                                                              for lv in at(v, "undecided"))  # fmt: skip

    if expect == "no_change":
        assert "beat the baseline" not in text and "refuted" not in text
        rows = [lv for v in measured for lv in v.levels
                if lv.verdict != "unmeasured" and (not expect_levels or lv.label in expect_levels)]  # fmt: skip
        assert ("The null holds" in text) == (bool(rows) and all(lv.verdict == "equivalent" for lv in rows))
        assert ("FAILED" in text) == any(lv.verdict in ("improved", "regressed") for lv in rows)
        return
    for v in vs:
        assert (f"- {v.id} beat the baseline" in text) == (v in beat), text
    assert ("No variant beat the baseline" in text) == (bool(measured) and not beat), text
    refuted = bool(measured) and not improved and not undecided and not gaps
    assert ("refuted for this kernel shape" in text) == refuted, text
    assert ("not supported but not refuted" in text) == (bool(measured) and not improved and not refuted), text
    assert ("supported where a variant improved" in text) == bool(improved), text
    assert ("untested" in text.replace("knob 2 untested", "")) == (not measured), text
    assert s.follow_up_ids == [v.id for v in improved if v.verdict != "accept"]
    for v in vs:
        if v.status == "rejected":
            assert f"{v.id} was rejected by a person and never measured" in text
