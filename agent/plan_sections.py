"""The sections a plan nests: the workstream it names, its variants and backlog items, its statistics,
budget and campaign settings, and the text, id and path rules their fields share.

Every model forbids unknown keys, and every field has a description a user can read in an error message.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kinv.agent.ids import norm_ws
from kinv.agent.words import HarnessReach
from kinv.kernels.tunables import brief_repr

WS_ID = re.compile(r"#?[0-9]{1,6}[a-z]?")
ITEM_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}|KINV_ARG_[A-Za-z_][A-Za-z0-9_]{0,40}")
ARG_ENV = "KINV_ARG_"  # a command argument {name} travels in an arm's environment as KINV_ARG_<name>
PLAN_ROOT_DIRS = ("plans", "kernels")
TARGETS_SAID = ("occupancy (warps per SM, achieved occupancy), pipelining (stages in flight), tile_shape (tile and "
                "MMA shape), parallelism (CTAs, waves, splits), bytes_moved (bytes per item), roofline_gap or "
                "elsewhere (no premise kinv measures)")
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


class Strict(BaseModel):
    # strict: no "64" for 64, no true for 1, no 4.0 for 4 -- a plan says what it means.
    model_config = ConfigDict(extra="forbid", frozen=False, strict=True)


def check_text(v, one_line: bool = True):
    """A title (one line) or a prose field (newlines and tabs allowed): no control characters (NUL, escape
    sequences, bell, ...) and no bidirectional overrides, which would print as something else than they say."""
    if not isinstance(v, str):
        return v
    for c in v:
        if c in "\n\t" and not one_line:
            continue
        if unicodedata.category(c) in ("Cc", "Cs") or c in BIDI_CONTROLS or c in "\u2028\u2029":
            raise ValueError(f"holds the control character {c!r} at position {v.index(c)}; give plain text"
                             + ("" if not one_line else " on one line"))
    return v


def check_item_id(v: str) -> str:
    """Variant and backlog ids: a letter, then letters, digits, '_' or '-'."""
    if not ITEM_ID.fullmatch(v):
        raise ValueError(f"{brief_repr(v)} is not a valid id; use letters, digits, '_' or '-', starting with a letter")
    return v


class WorkstreamRef(Strict):
    id: str = Field(description="workstream id such as '#3a' (a number and an optional letter)")
    title: str = Field(min_length=1, max_length=200, description="one-line title of the workstream")
    parent: str | None = Field(None, description="parent workstream id, such as '#3'")
    parent_title: str | None = Field(None, max_length=200, description="title of the parent workstream")

    _text = field_validator("title", "parent_title")(classmethod(lambda cls, v: check_text(v)))

    @field_validator("id", "parent")
    @classmethod
    def _ws(cls, v):
        if v is None:
            return v
        if not WS_ID.fullmatch(v):
            raise ValueError(f"{brief_repr(v)} is not a workstream id; use a number and an optional letter, like '#3a'")
        return norm_ws(v)


class Requires(Strict):
    variant: str = Field(description="id of the variant whose outcome this one depends on")
    improves_somewhere: bool = Field(True, description="run only if that variant improved at some level")


class Variant(Strict):
    id: str = Field(description="short id such as 'V1'")
    title: str = Field(min_length=1, max_length=200, description="what the variant changes, in a few words")
    rationale: str = Field("", max_length=2000, description="why it might help")
    patch: dict = Field(default_factory=dict, description="config keys to change relative to the baseline")
    source_patch: str | None = Field(None, description="path of a unified diff to apply to the kernel source")
    allow_harness_reach: list[str] = Field(
        default_factory=list, description="constructs this variant's source patch may use although they reach for "
        "the harness that times and judges it (kinv check and a run's gate refuse them otherwise), for a kernel "
        f"that needs one; the close-out names each one allowed. Valid: {', '.join(HarnessReach)}")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables this variant's processes "
                                "get on top of the plan's environment (e.g. {TARGET_CTAS: '1024'}); the env check "
                                "confirms them in every one of its workers")
    args: dict[str, str] = Field(default_factory=dict, description="a command plan's arguments this variant "
                                 "changes: values for the command's '{name}' placeholders that the workload's args "
                                 "names (e.g. {block: '128'}); the approval and the close-out show the command line")
    requires: Requires | None = Field(None, description="a premise: the variant is moot unless it holds")
    targets: str | None = Field(
        None, description="the lever the variant pulls, which names the premise the close-out checks it moved: "
        f"{TARGETS_SAID}; or a premise the kernel's adapter declares")
    expect: Literal["improve", "no_change", "regress"] = Field(
        "improve", description="what the variant predicts against the baseline: 'improve', 'no_change' or "
        "'regress'; the close-out says whether the prediction held, level by level")

    _id = field_validator("id")(classmethod(lambda cls, v: check_item_id(v)))
    _title = field_validator("title")(classmethod(lambda cls, v: check_text(v)))
    _prose = field_validator("rationale")(classmethod(lambda cls, v: check_text(v, one_line=False)))

    @field_validator("source_patch")
    @classmethod
    def _source(cls, v):
        if v is not None:
            safe_relative_path(v)
        return v

    @field_validator("allow_harness_reach")
    @classmethod
    def _reach(cls, v, info):
        bad = [x for x in v if x not in list(HarnessReach)]
        if bad:
            raise ValueError(f"{brief_repr(bad[0])} is not a construct the screen knows; valid: {', '.join(HarnessReach)}")
        if v and not info.data.get("source_patch"):
            raise ValueError("names constructs of a source patch, and this variant has no source_patch")
        return v


class BacklogItem(Strict):
    id: str = Field(description="short id such as 'OEA'")
    title: str = Field(min_length=1, max_length=200, description="the candidate in a few words")
    rationale: str = Field(max_length=2000, description="why it is a candidate")
    targets: str = Field(
        description=f"what it attacks, as a variant's targets names it: {TARGETS_SAID}; or a premise the kernel's "
        "adapter declares")
    prior: float = Field(0.5, ge=0, le=1, description="prior plausibility from 0 to 1")
    tunables: list[str] = Field(default_factory=list, description="the kernel tunables this item varies "
                                "(names the kernel's adapter declares): a campaign can run it as a search; empty: out of a campaign's reach")
    env: dict[str, list[str]] = Field(default_factory=dict, description="environment variables this item varies, "
                                      "each with the values to try (e.g. {TARGET_CTAS: ['256', '1024']}): a campaign "
                                      "screens them around the incumbent config; a deployment, not a config file, "
                                      "adopts what it finds")
    args: dict[str, list[str]] = Field(default_factory=dict, description="a command plan's arguments this item "
                                       "varies, each with the values to try (e.g. {block: ['128', '256']}): a "
                                       "campaign screens them as it screens env (they reach the command's processes "
                                       "as KINV_ARG_<name>)")

    @model_validator(mode="after")
    def _args_as_env(self):
        # an argument is screened as the environment variable that carries it to the arm's runs
        for name, values in self.args.items():
            self.env.setdefault(f"{ARG_ENV}{name}", list(values))
        return self

    @property
    def searchable(self) -> bool:
        """Whether a campaign can run this item as a search (it varies tunables or environment variables)."""
        return bool(self.tunables or self.env)

    _id = field_validator("id")(classmethod(lambda cls, v: check_item_id(v)))
    _title = field_validator("title")(classmethod(lambda cls, v: check_text(v)))
    _prose = field_validator("rationale")(classmethod(lambda cls, v: check_text(v, one_line=False)))


class StatsSettings(Strict):
    threshold: float = Field(0.01, gt=0, le=0.5, description="practical threshold and equivalence margin at every "
                             "level (0.01 = 1%); fixed by the plan, never widened by the data")
    level_thresholds: dict[str, float] = Field(default_factory=dict, description="threshold of particular levels, "
                                               "keyed by the level's label (e.g. {b1: 0.02})")
    conf: float = Field(0.95, ge=0.5, le=0.999, description="family-wise confidence over every level, look and "
                        "variant of the workstream")
    aa_rounds: int = Field(16, ge=8, le=200, description="A/A rounds (every A/A arm in every round)")
    aa_arms: int = Field(4, ge=2, le=8, description="baseline workers in the A/A: they measure the between-arm offset")
    quick_rounds: int = Field(8, ge=2, le=100, description="rounds before the quick look")
    step_rounds: int = Field(4, ge=1, le=100, description="rounds added per look while a level is undecided")
    max_rounds: int = Field(32, ge=2, le=1000, description="hard cap of A/B rounds per variant")

    @field_validator("level_thresholds")
    @classmethod
    def _level_thresholds(cls, v):
        for k, t in v.items():
            if not 0 < t <= 0.5:
                raise ValueError(f"{k}: {t!r} must lie in (0, 0.5]")
        return v

    def threshold_at(self, label: str) -> float:
        return self.level_thresholds.get(label, self.threshold)


class AllowedRange(Strict):
    min: int = Field(description="the smallest value allowed")
    max: int = Field(description="the largest value allowed")

    @model_validator(mode="after")
    def _order(self):
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class Budget(Strict):
    gpu_seconds: float = Field(300, gt=0, le=86400, description="GPU seconds the whole investigation may spend")
    wall_seconds: float = Field(3600, gt=0, le=7 * 86400, description="wall seconds the investigation may take")


class CampaignGoal(Strict):
    copy_fraction: float | None = Field(None, gt=0, le=1, description="stop once the incumbent reaches this "
                                        "fraction of copy bandwidth (0.8 = 80%) at every goal level")
    roofline_fraction: float | None = Field(None, gt=0, le=1, description="stop once the incumbent reaches this "
                                            "fraction of the bound its kernel's adapter names at every goal level "
                                            "(copy bandwidth or the device's matrix peak, whichever is slower)")
    levels: list[str] = Field(default_factory=list, description="level labels the goal applies to (default: every "
                              "level), e.g. [b32, b64, b96]")

    @model_validator(mode="after")
    def _one_goal(self):
        if self.copy_fraction is not None and self.roofline_fraction is not None:
            raise ValueError("give copy_fraction or roofline_fraction, not both")
        return self

    def fraction(self) -> float | None:
        """The fraction the goal asks for, whichever bound it is of."""
        return self.copy_fraction if self.roofline_fraction is None else self.roofline_fraction


class Screening(Strict):
    trials: int = Field(12, ge=1, le=500, description="candidates the optimizer proposes per workstream "
                        "(infeasible ones are pruned by the resource model and cost no GPU time)")
    rounds: int = Field(3, ge=1, le=16, description="paired rounds per screened candidate (every level)")
    finalists: int = Field(3, ge=1, le=8, description="screened candidates confirmed with the full A/B")
    min_gain: float = Field(0.0, ge=-0.5, le=0.5, description="a candidate becomes a finalist only if its screened "
                            "change beats this at some level (0 = any gain)")


class Campaign(Strict):
    goal: CampaignGoal = Field(default_factory=CampaignGoal, description="when the campaign has done its job")
    budget: Budget = Field(default_factory=Budget, description="GPU and wall seconds of the whole campaign")
    space: dict[str, list[int]] = Field(default_factory=dict, description="the values of each tunable the search "
                                        "may try (default: the plan's allowed values)")
    per_level: bool = Field(True, description="allow a different config per level (a level-conditional config)")
    screen: Screening = Field(default_factory=Screening, description="how candidates are screened")
    max_workstreams: int = Field(4, ge=1, le=25, description="workstreams the campaign may chain")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seed of the optimizer's sampler")


def safe_relative_path(p: str) -> Path:
    """A path inside the project (plans/ or kernels/): no absolute paths, no '..'."""
    path = Path(p)
    if (
        "\x00" in p
        or "\\" in p
        or path.is_absolute()
        or ".." in path.parts
        or len(path.parts) < 2
        or path.parts[0] not in PLAN_ROOT_DIRS
    ):
        raise ValueError(f"path {brief_repr(p)} must name a file inside {' or '.join(d + '/' for d in PLAN_ROOT_DIRS)} (relative, no '..')")
    return path
