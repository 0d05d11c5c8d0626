"""The close-out's sentences, as a function of the verdicts its tables print.

:func:`summarize` maps one workstream's verdicts -- per variant its status (measured, rejected by a person, moot,
failed before timing, not run) and per level the verdict (improved / regressed / equivalent / undecided /
unmeasured) with its change, interval and threshold -- to every summary sentence of a close-out: which variant
beat the baseline, what stays on disk, whether each variant's prediction (``expect``) held, whether the hypothesis
is supported, refuted or neither -- judged only by the variants that moved their premise (one whose premise did not
move at a level says nothing about the hypothesis there) -- or, for a null drill, whether the null holds, where a
regression is or is not ruled out, what was never measured and why, and which variants deserve a follow-up.  Pure: no store, no files; tests drive it with every combination.

The words follow the decision rule of :mod:`kinv.agent.tools.measure.stats` (``classify``): a level is *improved* when its
interval excludes 0 and the estimate reaches the threshold ``T``, *regressed* in the mirror case, *equivalent*
when the interval lies inside ``±T``.  A regression (of practical size) is *ruled out* at a level when its whole
interval lies above the regression margin ``-T``; an undecided level whose lower bound does not clear it leaves a
regression *not ruled out*.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinv.agent import fmt
from kinv.agent.words import Expect, LevelVerdict, PremiseOutcome

LEVEL_VERDICTS = tuple(LevelVerdict)
STATUSES = ("measured", "rejected", "moot", "failed", "void", "not run")
EXPECTS = tuple(Expect)
#: the level verdict that bears a variant's prediction out, and those that go against it
HOLDS = {Expect.IMPROVE: "improved", Expect.NO_CHANGE: "equivalent", Expect.REGRESS: "regressed"}
AGAINST = {Expect.IMPROVE: ("regressed",), Expect.NO_CHANGE: ("improved", "regressed"), Expect.REGRESS: ("improved",)}
PREDICTED = {Expect.IMPROVE: "an improvement", Expect.NO_CHANGE: "no change", Expect.REGRESS: "a regression"}


@dataclass(frozen=True)
class LevelVerdict:
    """One row of a variant's table: the level, its verdict, the change and its interval (log-ratios)."""

    label: str
    verdict: str
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None

    @property
    def regression_ruled_out(self) -> bool:
        """The whole interval lies above the regression margin ``-threshold``."""
        if self.verdict in ("regressed", "unmeasured"):
            return False
        if self.ci_low is not None and self.threshold is not None:
            return self.ci_low > -self.threshold
        return self.verdict in ("improved", "equivalent")

    def text(self) -> str:
        """``b96 (+0.56% [+0.06%, +1.09%])``: the label, the change and, where known, its interval."""
        if self.effect is None:
            return self.label
        ci = f" {fmt.change_interval(self.ci_low, self.ci_high)}" if self.ci_low is not None and self.ci_high is not None else ""
        return f"{self.label} ({fmt.change(self.effect)}{ci})"


@dataclass(frozen=True)
class VariantVerdict:
    """A variant as the close-out's tables show it."""

    id: str
    status: str = "measured"  # one of STATUSES
    verdict: str | None = None  # the variant's verdict word as its table prints it (accept, reject, ...)
    levels: tuple[LevelVerdict, ...] = ()
    note: str = ""  # why it was not measured: a person's reason, the moot premise, the failure
    changes: str = ""  # what it changes (a tunable and its value), to say what was never measured
    expect: str = "improve"  # what it predicts: improve | no_change | regress
    target: str = ""  # what its premise is about, in words ("occupancy"); empty: no premise
    premise: tuple[tuple[str, str], ...] = ()  # (level label, PremiseOutcome); empty: no premise to check

    def premise_at(self, label: str) -> str | None:
        """Whether the variant moved its premise at a level (a PremiseOutcome); None where it has no premise."""
        if not self.premise:
            return None
        return dict(self.premise).get(label, PremiseOutcome.NOT_MEASURED)

    def speaks(self, lv: LevelVerdict) -> bool:
        """Whether this level's verdict speaks to the hypothesis: the variant has no premise to move, moved it as
        predicted there, or it was not measured (then the verdict is taken as it stands, and said so)."""
        return self.premise_at(lv.label) in (None, PremiseOutcome.TESTED, PremiseOutcome.NOT_MEASURED)

    def held(self) -> list[LevelVerdict]:
        """Levels (that speak to the hypothesis) where the variant did what it predicted."""
        return [lv for lv in self.at(HOLDS[self.expect]) if self.speaks(lv)]

    def against(self) -> list[LevelVerdict]:
        """Levels (that speak to the hypothesis) where the verdict went against the prediction."""
        return [lv for lv in self.levels if lv.verdict in AGAINST[self.expect] and self.speaks(lv)
                and self.status == "measured"]  # fmt: skip

    @property
    def evidence(self) -> bool:
        """Measured at a level whose verdict speaks to the hypothesis."""
        return self.measured and any(lv.verdict != "unmeasured" and self.speaks(lv) for lv in self.levels)

    def at(self, verdict: str) -> list[LevelVerdict]:
        return [lv for lv in self.levels if lv.verdict == verdict] if self.status == "measured" else []

    @property
    def measured(self) -> bool:
        """Timed at one level or more."""
        return self.status == "measured" and any(lv.verdict != "unmeasured" for lv in self.levels)

    @property
    def improved(self) -> bool:
        return bool(self.at("improved"))

    @property
    def beat(self) -> bool:
        """Beat the baseline: improved at some level, regressed at none."""
        return self.improved and not self.at("regressed")

    @property
    def accepted(self) -> bool:
        return self.status == "measured" and self.verdict == "accept"


@dataclass
class Summary:
    outcome: dict[str, str] = field(default_factory=dict)  # variant id -> "**verdict** — why"
    lines: list[str] = field(default_factory=list)  # the Outcome section's closing bullets
    follow_ups: list[str] = field(default_factory=list)  # one line per variant worth a follow-up
    follow_up_ids: list[str] = field(default_factory=list)
    hypothesis: str = ""  # supported | refuted | neither | untested | null holds | null failed | null unconfirmed
    predictions: dict[str, str] = field(default_factory=dict)  # variant id -> whether its prediction held, by level


def _join(items: list[LevelVerdict], full: bool = True) -> str:
    return ", ".join(lv.text() if full else lv.label for lv in items)


def _undecided(lv: LevelVerdict) -> str:
    """An undecided level, and whether its interval rules a regression out."""
    ruled = "a regression is ruled out" if lv.regression_ruled_out else "a regression is not ruled out"
    return f"{lv.text()[:-1]}: {ruled})" if lv.effect is not None else f"{lv.label} ({ruled})"


def _levels_reason(v: VariantVerdict) -> str:
    """What the table says, level by level, in one line."""
    imp, reg, eq, und, un = (v.at(x) for x in LEVEL_VERDICTS)
    parts = []
    if imp:
        parts.append(f"improved at {_join(imp)}")
    if reg:
        parts.append(f"regressed at {_join(reg)}")
    if eq:
        parts.append(f"equivalent at {_join(eq, full=False)}")
    if und:
        parts.append("undecided at " + ", ".join(_undecided(lv) for lv in und))
    if un:
        parts.append(f"not measured at {_join(un, full=False)}")
    text = "; ".join(parts) or "no level measured"
    if v.beat and not un:
        text += "; regressed nowhere"
    elif v.beat:
        text += "; regressed at no measured level"
    if imp and reg:
        text += ": candidate for a level-conditional config"
    elif eq and len(eq) == len(v.levels):
        text += ": no gain beyond the noise band"
    return text


def _never(v: VariantVerdict) -> str:
    """Why a variant has no timing, and what that leaves untested."""
    untested = f" ({v.changes} untested)" if v.changes else ""
    if v.status == "rejected":
        why = v.note.removeprefix("rejected by a person").lstrip(": ").strip()
        return f"rejected by a person before it ran{': ' + why if why else ''}; never measured{untested}"
    if v.status == "moot":
        note = v.note if v.note.startswith("moot") else f"moot: {v.note}" if v.note else "moot"
        return f"{note}; never measured{untested}"
    if v.status == "failed":
        return f"{v.note or v.verdict or 'failed'}; never timed{untested}"
    if v.status == "void":  # timed, and its timing refused by a rule: no level is decided
        return f"{v.note or 'void'}; timed and voided, so no level is decided{untested}"
    return f"{v.note or 'not run'}; never measured{untested}"


def _word(v: VariantVerdict) -> str:
    if v.status == "measured":
        return v.verdict or "measured"
    return {"rejected": "rejected by a person", "moot": "moot", "failed": v.verdict or "failed",
            "void": "void"}.get(v.status,
                                                                                                  "not run")


def _gaps(variants: list[VariantVerdict]) -> list[str]:
    """What was not measured, by variant (a moot variant's premise was measured: it is no gap)."""
    out = []
    for v in variants:
        if v.status == "rejected":
            out.append(f"{v.id} was rejected by a person and never measured")
        elif v.status == "failed":
            out.append(f"{v.id} was never timed ({v.verdict or 'failed'})")
        elif v.status == "void":
            out.append(f"{v.id} was timed and voided (no level decided)")
        elif v.status == "not run":
            out.append(f"{v.id} was not run")
        elif v.status == "measured" and not v.measured:
            out.append(f"{v.id} was measured at no level")
        elif v.at("unmeasured"):
            out.append(f"{v.id} was not measured at {_join(v.at('unmeasured'), full=False)}")
    return out


def summarize(variants: list[VariantVerdict], *, baseline: str, live: str, live_file: str,
              expect: str = "improvement", expect_levels: tuple[str, ...] = (),
              incumbent_of: str | None = None) -> Summary:
    """Every summary sentence of a close-out, from its verdicts.

    ``baseline`` is the config measured against (``describe``d), ``live`` the config in the live file
    ``live_file`` now; ``incumbent_of`` names the campaign whose incumbent the baseline is, if any.
    ``expect`` is the plan's prediction: ``improvement``, or ``no_change`` at ``expect_levels`` (a null drill).
    """
    for v in variants:
        if v.status not in STATUSES:
            raise ValueError(f"unknown variant status {v.status!r}; valid: {', '.join(STATUSES)}")
        if v.expect not in EXPECTS:
            raise ValueError(f"unknown expectation {v.expect!r} of {v.id}; valid: {', '.join(EXPECTS)}")
        bad = [lv.verdict for lv in v.levels if lv.verdict not in LEVEL_VERDICTS]
        if bad:
            raise ValueError(f"unknown level verdicts {bad}; valid: {', '.join(LEVEL_VERDICTS)}")
    s = Summary()
    for v in variants:
        s.outcome[v.id] = f"**{_word(v)}** — {_levels_reason(v) if v.status == 'measured' else _never(v)}"
    measured = [v for v in variants if v.measured]
    gaps = _gaps(variants)
    gap = f" ({'; '.join(gaps)})" if gaps else ""
    moot = [v.id for v in variants if v.status == "moot"]

    if expect == "no_change":
        s.lines += _null(measured, expect_levels, gap, s)
    else:
        winners = [v for v in measured if v.beat]
        mixed = [v for v in measured if v.improved and not v.beat]
        for w in winners:
            if w.accepted:
                s.lines.append(f"- {w.id} beat the baseline: improved at {_join(w.at('improved'))}, regressed "
                               "nowhere (accepted).")  # fmt: skip
            else:
                why = "; ".join(x for x in (
                    "undecided at " + ", ".join(_undecided(lv) for lv in w.at("undecided")) if w.at("undecided") else "",
                    f"not measured at {_join(w.at('unmeasured'), full=False)}" if w.at("unmeasured") else "") if x)
                s.lines.append(f"- {w.id} beat the baseline at {_join(w.at('improved'))} and regressed "
                               f"{'nowhere' if not w.at('unmeasured') else 'at no measured level'}, but is not "
                               f"accepted{': ' + why if why else ''}.")  # fmt: skip
        if measured and not winners:
            if mixed:
                s.lines.append("- No variant beat the baseline without regressing elsewhere: " + "; ".join(
                    f"{v.id} improved at {_join(v.at('improved'))} but regressed at {_join(v.at('regressed'))}"
                    for v in mixed) + ".")  # fmt: skip
            else:
                s.lines.append("- No variant beat the baseline.")
        s.lines += _hypothesis(measured, gaps, gap, moot, s)
        for v in measured:
            if v.improved and not v.accepted:
                s.follow_up_ids.append(v.id)
                where = _join(v.at("improved"), full=False)
                if v.beat:
                    open_ = [lv.label for lv in v.levels if lv.verdict in ("undecided", "unmeasured")]
                    s.follow_ups.append(f"{v.id}: improved at {where} and regressed nowhere: adopt it where it won, "
                                        f"or measure {', '.join(open_) or 'it'} again to decide")  # fmt: skip
                else:
                    s.follow_ups.append(f"{v.id}: improved at {where} but regressed at "
                                        f"{_join(v.at('regressed'), full=False)}: a level-conditional config that "
                                        f"runs it at {where} only")  # fmt: skip
    s.lines.append(_stays(baseline, live, live_file, incumbent_of))
    return s


def _labels(items: list[LevelVerdict]) -> str:
    return _join(items, full=False)


def _by_verdict(v: VariantVerdict, items: list[LevelVerdict]) -> list[str]:
    """``V1 regressed at b32, b64`` for each verdict among ``items``, in the order of first appearance."""
    words = dict.fromkeys(lv.verdict for lv in items)
    return [f"{v.id} {w} at {_labels([lv for lv in items if lv.verdict == w])}" for w in words]


def _prediction(v: VariantVerdict) -> str:
    """Whether a measured variant's prediction held, level by level."""
    hold = HOLDS[v.expect]
    parts = [f"held at {_labels(v.at(hold))}"] if v.at(hold) else []
    missed = [lv for lv in v.levels if lv.verdict not in (hold, "undecided", "unmeasured")]
    if missed:
        words = dict.fromkeys(lv.verdict for lv in missed)
        parts.append("did not hold at " + "; ".join(f"{_labels([lv for lv in missed if lv.verdict == w])} ({w})"
                                                    for w in words))  # fmt: skip
    if v.at("undecided"):
        parts.append(f"open at {_labels(v.at('undecided'))} (undecided)")
    return f"Predicted {PREDICTED[v.expect]}: {'; '.join(parts) or 'no level decided'}."


def _hypothesis(measured: list[VariantVerdict], gaps: list[str], gap: str, moot: list[str], s: Summary) -> list[str]:
    """Whether the hypothesis is supported, refuted or neither, from the variants whose verdicts speak to it: a
    variant that did not move its premise (or moved it the other way) at a level says nothing there."""
    for v in measured:
        s.predictions[v.id] = _prediction(v)
    evidence = [v for v in measured if v.evidence]
    silent = [v for v in measured if not v.evidence]
    quiet = ""
    if silent:
        who = ", ".join(f"{v.id} ({v.target or 'its premise'})" for v in silent)
        quiet = (f"; {who} did not move {'its' if len(silent) == 1 else 'their'} premise where measured, so "
                 f"{'its verdict says' if len(silent) == 1 else 'their verdicts say'} nothing about it")  # fmt: skip
    if not measured:
        s.hypothesis = "untested"
        return [f"- Nothing was measured: the hypothesis is untested{gap}."]
    if not evidence:
        s.hypothesis = "untested"
        who = "; ".join(f"{v.id}: {v.target or 'its premise'} did not move where measured" for v in silent)
        return [f"- The hypothesis is untested: no measured variant moved its premise ({who}), so no verdict here "
                f"says anything about it{gap}."]  # fmt: skip
    partly = [(v, [lv for lv in v.levels if lv.verdict != "unmeasured" and not v.speaks(lv)]) for v in evidence]
    partly = [(v, lvs) for v, lvs in partly if lvs]
    quiet += "".join(f"; {v.id} did not move its premise at {_labels(lvs)}, so its verdict there says nothing about "
                     "it" for v, lvs in partly)  # fmt: skip
    held = [(v, v.held()) for v in evidence if v.held()]
    unknown = [v.id for v in evidence if v.premise and any(
        v.premise_at(lv.label) == PremiseOutcome.NOT_MEASURED for lv in v.levels if lv.verdict != "unmeasured")]
    one = len(unknown) == 1
    unknown_note = (f"; the premise of {', '.join(unknown)} was not measured, so "
                    f"{'its verdict is taken as it stands' if one else 'their verdicts are taken as they stand'}"
                    if unknown else "")  # fmt: skip
    undecided = [v.id for v in evidence if any(v.speaks(lv) for lv in v.at("undecided"))]
    plain = all(v.expect == Expect.IMPROVE for v in evidence)
    if held:
        s.hypothesis = "supported"
        if all(v.expect == Expect.IMPROVE for v, _ in held):
            where = "a variant improved: " + "; ".join(f"{v.id} at {_labels(lvs)}" for v, lvs in held)
        else:
            where = "a variant did as it predicted: " + "; ".join(
                f"{v.id} {HOLDS[v.expect]} at {_labels(lvs)}" for v, lvs in held)  # fmt: skip
        against = [x for v in evidence for x in _by_verdict(v, v.against())]
        return [f"- The hypothesis is supported where {where}" + (f"; it failed where {', '.join(against)}" if against
                else "") + f"{unknown_note}{quiet}{gap}."]  # fmt: skip
    if not gaps and not undecided and not silent and not partly:
        s.hypothesis = "refuted"
        did = "improved" if plain else "did as it predicted"
        return [f"- The hypothesis is refuted for this kernel shape. No variant {did} at any level it was measured "
                f"at{' (moot: ' + ', '.join(moot) + ')' if moot else ''}{unknown_note}."]  # fmt: skip
    s.hypothesis = "neither"
    return [f"- The hypothesis is not supported but not refuted either{gap}"
            f"{'; undecided levels in ' + ', '.join(undecided) if undecided else ''}{quiet}{unknown_note}."]  # fmt: skip


def _null(measured: list[VariantVerdict], expect_levels: tuple[str, ...], gap: str, s: Summary) -> list[str]:
    """A null drill (``expect: no_change``): did every measured variant come out equivalent where predicted?"""
    def predicted(lv: LevelVerdict) -> bool:
        return not expect_levels or lv.label in expect_levels

    rows = [(v, lv) for v in measured for lv in v.levels if predicted(lv) and lv.verdict != "unmeasured"]
    if not rows:
        s.hypothesis = "untested"
        return [f"- Nothing was measured where no change was predicted: the null is untested{gap}."]
    off = [f"{v.id} {lv.label} {lv.verdict}" for v, lv in rows if lv.verdict != "equivalent"]
    scope = ", ".join(dict.fromkeys(lv.label for _, lv in rows))
    if not off:
        s.hypothesis = "null holds"
        return [f"- The null holds: equivalent at {scope} for every measured variant{gap}."]
    if any(not x.endswith("undecided") for x in off):
        s.hypothesis = "null failed"
        return [f"- The null drill FAILED: {', '.join(off)} where no change was predicted: the measurement told a "
                "config from itself; do not trust other verdicts from this set-up."]  # fmt: skip
    s.hypothesis = "null unconfirmed"
    return [f"- The null is not confirmed: {', '.join(off)} (not enough rounds to show equivalence){gap}."]


def _stays(baseline: str, live: str, live_file: str, incumbent_of: str | None) -> str:
    """What stays on disk: the live file, named as it is, and what the variants were measured against."""
    against = f"campaign {incumbent_of}'s incumbent {baseline}" if incumbent_of else f"the plan's baseline {baseline}"
    if live == baseline:
        return (f"- On disk, {live_file} stays {live}, the baseline measured here; a close-out writes no config "
                "(adopting a variant is a separate, reviewed change).")  # fmt: skip
    return (f"- On disk, {live_file} stays {live}; the variants were measured against {against}, not against the "
            "live file, so their changes do not compare with it.")  # fmt: skip
