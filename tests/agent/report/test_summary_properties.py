"""Property test: every close-out sentence agrees with the verdicts its tables print, for generated verdict sets
(every combination of level verdicts, unmeasured levels, variants a person rejected, moot, failed or never run)
crossed with each variant's premise, level by level (moved as predicted, moved the other way, not moved, not
measured, or no premise at all) and its prediction (improve, no change, regress): no sentence calls the hypothesis
supported or refuted by a variant that did not move its premise."""

from __future__ import annotations

import math
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kinv.agent.report.summary import LevelVerdict, VariantVerdict, summarize
from kinv.agent.tools.measure import stats
from kinv.agent.words import PremiseOutcome

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
    expect = draw(st.sampled_from(("improve", "improve", "no_change", "regress")))
    premise = ()
    if draw(st.booleans()):  # a premise, read level by level (or not at all where no figures exist)
        premise = tuple((lab, draw(st.sampled_from(tuple(PremiseOutcome)))) for lab in labels)
    return VariantVerdict(vid, "measured", word, lvs, changes="knob 2", expect=expect,
                          target="occupancy" if premise else "", premise=premise)  # fmt: skip


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


HOLDS = {"improve": "improved", "no_change": "equivalent", "regress": "regressed"}
AGAINST = {"improve": ("regressed",), "no_change": ("improved", "regressed"), "regress": ("improved",)}


def speaks(v, lv):
    """A level's verdict speaks to the hypothesis unless the variant's premise did not move there (or moved the
    other way)."""
    return not v.premise or dict(v.premise).get(lv.label, "not measured") in ("tested", "not measured")


def named(clause: str, words: str) -> set[tuple[str, str, str]]:
    """(variant, verdict word or "", level) for each ``V1 [word] at L0, L1`` in a clause."""
    out = set()
    for vid, word, labels in re.findall(rf"(V\d) (?:({words}) )?at ((?:L\d(?:, )?)+)", clause):
        out |= {(vid, word, lab) for lab in labels.rstrip(", ").split(", ")}
    return out


def clause(text: str, start: str) -> str:
    """From ``start`` to the first of the markers that end a clause."""
    if start not in text:
        return ""
    rest = text.split(start, 1)[1]
    cut = min([i for i in (rest.find(m) for m in ("; it failed where", "; the premise of", " (", ".")) if i >= 0]
              or [len(rest)])  # fmt: skip
    return rest[:cut]


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

    # the hypothesis: judged only by the levels whose variant moved its premise (or whose premise was not measured)
    by_id = {v.id: v for v in vs}
    evidence = [v for v in measured if any(lv.verdict != "unmeasured" and speaks(v, lv) for lv in v.levels)]
    silent = [v for v in measured if v not in evidence]
    held = {(v.id, lv.label) for v in evidence for lv in v.levels if lv.verdict == HOLDS[v.expect] and speaks(v, lv)}
    undecided = any(speaks(v, lv) for v in evidence for lv in at(v, "undecided"))
    partly = {v.id: [lv.label for lv in v.levels if lv.verdict != "unmeasured" and not speaks(v, lv)] for v in evidence}
    refuted = bool(evidence) and not held and not undecided and not gaps and not silent and not any(partly.values())
    assert ("refuted for this kernel shape" in text) == refuted, text
    assert ("is supported where" in text) == bool(held), text
    assert ("not supported but not refuted" in text) == (bool(evidence) and not held and not refuted), text
    assert ("untested" in text.replace("knob 2 untested", "")) == (not evidence), text
    assert ("no measured variant moved its premise" in text) == (bool(measured) and not evidence), text
    support = clause(text, "is supported where a variant improved: ") or clause(text, "as it predicted: ")
    for vid, word, lab in named(support, "improved|equivalent|regressed"):
        v, lv = by_id[vid], next(x for x in by_id[vid].levels if x.label == lab)
        assert speaks(v, lv) and lv.verdict == HOLDS[v.expect] and word in ("", HOLDS[v.expect]), (vid, lab, text)
    assert {(vid, lab) for vid, _, lab in named(support, "improved|equivalent|regressed")} == held, text
    for vid, word, lab in named(clause(text, "; it failed where "), "improved|regressed"):
        v, lv = by_id[vid], next(x for x in by_id[vid].levels if x.label == lab)
        assert speaks(v, lv) and lv.verdict == word and word in AGAINST[v.expect], (vid, lab, text)
    for v in silent:  # said to say nothing, and never named as evidence
        silent_clause = text.split(f"{v.id} (occupancy)", 1)[-1] if f"{v.id} (occupancy)" in text else ""
        assert "did not move" in silent_clause or f"{v.id}: occupancy did not move" in text, text
    for vid, labels in partly.items():  # where it did not move its premise, said so, level by level
        if labels and not (s.hypothesis == "untested"):
            assert f"{vid} did not move its premise at {', '.join(labels)}, so its verdict there says nothing" in text

    # each measured variant: whether its prediction held, level by level
    for v in measured:
        said = s.predictions[v.id]
        assert ("held at" in said.replace("did not hold at", "")) == bool(at(v, HOLDS[v.expect])), said
        missed = [lv for lv in v.levels if lv.verdict not in (HOLDS[v.expect], "undecided", "unmeasured")]
        assert ("did not hold at" in said) == bool(missed), said
    assert s.follow_up_ids == [v.id for v in improved if v.verdict != "accept"]
    for v in vs:
        if v.status == "rejected":
            assert f"{v.id} was rejected by a person and never measured" in text
