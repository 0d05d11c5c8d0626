"""Pydantic models at kinv's boundaries: plan files, samples, verdicts, todos.

Every model forbids unknown keys, and every field has a description a user
can read in an error message.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from kinv.agent.errors import PlanError, TooBig
from kinv.agent.ids import norm_ws
from kinv.agent.words import HarnessReach, Target
from kinv.kernels.errors import ConfigError
from kinv.kernels.tunables import brief_repr, one_line, read_text_file

WS_ID = re.compile(r"#?[0-9]{1,6}[a-z]?")
ITEM_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}|KINV_ARG_[A-Za-z_][A-Za-z0-9_]{0,40}")
ARG_ENV = "KINV_ARG_"  # a command argument {name} travels in an arm's environment as KINV_ARG_<name>
MAX_PLAN_BYTES = 256 * 1024
PLAN_ROOT_DIRS = ("plans", "kernels")
REFERENCE_LINK = "(every plan field, its limits and an example: docs/plan-reference.md)"
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


class Plan(Strict):
    workstream: WorkstreamRef = Field(description="the workstream this plan investigates")
    kernel: str = Field(description="kernel: a registered name (`kinv kernels` lists them) or "
                        "package.module:Class of an adapter")
    hypothesis: str = Field(min_length=1, max_length=4000, description="what the investigation tests")
    device: str = Field("sm_90", description="target device for feasibility: sm_90, sm_100, sm_120, h200, ...")
    workload: dict = Field(description="the levels to measure, in the kernel adapter's own terms (its workload model)")
    environment: dict[str, str] = Field(default_factory=dict, description="expected env vars (name: value), "
                                           "checked in every worker; the kernel's adapter says which values are valid")
    baseline: dict = Field(description="the baseline launch config: a value for each of the kernel's tunables")
    variants: list[Variant] = Field(description="the variants to test, in order")
    allowed: dict[str, list[int] | AllowedRange] = Field(
        default_factory=dict, description="the values each named tunable may take in this plan's variants, their "
        "overrides included: a list of the values themselves ([64, 128, 256]), or a range written as one ({min: 64, "
        "max: 2048}: every value the tunable allows from min to max). A patch outside them is refused under every "
        "approval policy; under approval auto-config a config patch inside them needs no approval; a campaign with "
        "no campaign.space searches them. A tunable not named is not limited")  # fmt: skip
    bounds: dict[str, list[int] | AllowedRange] | None = Field(
        None, description="the old spelling of allowed, with allowed's meaning: a list is the values themselves "
        "([64, 2048] allows 64 and 2048 only, not what lies between: write {min: 64, max: 2048} for a range); give "
        "allowed or bounds, not both")  # fmt: skip
    _allowed: dict = PrivateAttr(default_factory=dict)
    _workload: object = PrivateAttr(default=None)
    _levels: list = PrivateAttr(default_factory=list)
    stats: StatsSettings = Field(default_factory=StatsSettings, description="noise and decision settings")
    budget: Budget = Field(default_factory=Budget, description="GPU and wall-time budget")
    backlog: list[BacklogItem] = Field(default_factory=list, description="next candidates with their rationale")
    profile: Literal["ncu"] | None = Field(None, description="'ncu': before the close-out, profile the baseline and "
                                           "each decided variant with Nsight Compute at the level of its largest "
                                           "effect, and explain each verdict with the profiler's figures")
    expect: Literal["improvement", "no_change"] = Field(
        "improvement", description="what the hypothesis predicts: 'improvement' (a variant beats the baseline) or "
        "'no_change' (a null drill: every variant is equivalent, at expect_levels or at every level)")
    expect_levels: list[str] = Field(default_factory=list, description="with expect: no_change, the level labels "
                                     "where no change is predicted (default: every level)")
    baseline_on_disk: bool = Field(True, description="false: the baseline arm runs the plan's baseline config "
                                   "without writing it (a campaign's incumbent); the live file is only checked clean")
    campaign: Campaign | None = Field(None, description="run with `kinv campaign`: kinv chains workstreams that "
                                      "search this space until the goal, the budget or the backlog is exhausted")

    _prose = field_validator("hypothesis")(classmethod(lambda cls, v: check_text(v, one_line=False)))

    @field_validator("kernel")
    @classmethod
    def _kernel(cls, v):
        from kinv.kernels.adapter import get_adapter

        get_adapter(v)  # UnknownKernelError (a ValueError) names the valid kernels
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v):
        from kinv.kernels.devices import get_device

        get_device(v)
        return v

    @field_validator("environment")
    @classmethod
    def _env(cls, v, info):  # info.data: the fields validated before (the kernel)
        return check_env(v, info.data.get("kernel"))

    @model_validator(mode="after")
    def _cross(self):
        adapter = self.adapter
        spec = adapter.spec
        self._workload = _validate_sub(adapter.workload_model(), self.workload, "workload")
        self._levels = adapter.levels(self._workload)
        try:
            self.baseline = adapter.validate_config({**self.baseline, "kernel": adapter.name})
        except ConfigError as exc:
            raise ValueError(f"baseline: {exc}") from None
        try:
            adapter.workload_notes(self._workload, self.baseline)
        except ValueError as exc:
            raise ValueError(f"workload: {exc}") from None
        ids = [v.id for v in self.variants]
        if not ids and self.campaign is None:
            raise ValueError("variants: give at least one variant (or a campaign: section, run with kinv campaign)")
        if len(set(ids)) != len(ids):
            raise ValueError("variants: ids must be distinct")
        allowed = set(spec.names) | {"overrides"}
        for v in self.variants:
            unknown = sorted(set(map(str, v.patch)) - allowed)
            if unknown:
                raise ValueError(f"variants.{v.id}.patch: unknown key {brief_repr(unknown[0])}; valid keys: "
                                 f"{', '.join(sorted(allowed))}")  # fmt: skip
            try:
                self.variant_config(v)
            except ConfigError as exc:
                raise ValueError(f"variants.{v.id}.patch: {exc}") from None
            if v.requires and v.requires.variant not in ids[: ids.index(v.id)]:
                raise ValueError(f"variants.{v.id}.requires: {v.requires.variant!r} is not an earlier variant")
        valid_targets = [*Target, *getattr(adapter, "premises", {})]
        for where, target in [(f"variants.{v.id}", v.targets) for v in self.variants if v.targets is not None] + [
                (f"backlog.{i.id}", i.targets) for i in self.backlog]:  # fmt: skip
            if target not in valid_targets:
                raise ValueError(f"{where}.targets: {brief_repr(target)} is not a target; valid: "
                                 f"{', '.join(valid_targets)}")  # fmt: skip
        if self.bounds is not None and self.allowed:
            raise ValueError("bounds: give allowed or its old spelling bounds, not both")
        field = "bounds" if self.bounds is not None else "allowed"
        self._allowed = {}
        for key, values in (self.bounds if self.bounds is not None else self.allowed).items():
            if key not in spec.names:
                raise ValueError(f"{field}: unknown key {brief_repr(key)}; valid keys: {', '.join(spec.names)}")
            t = spec.tunable(key)
            if isinstance(values, AllowedRange):
                inside = [x for x in t.values if values.min <= x <= values.max]
                if not inside:
                    raise ValueError(f"{field}.{key}: no value of {key} lies from {values.min} to {values.max}; it "
                                     f"must be {t.says()}")  # fmt: skip
                self._allowed[key] = inside
                continue
            bad = [x for x in values if x not in t.values]
            if bad:
                raise ValueError(f"{field}.{key}: {brief_repr(bad[0])} is invalid: must be {t.says()}"
                                 + (f" (a list is the values allowed; for a range write {{min: {values[0]}, max: "
                                    f"{values[1]}}})" if len(values) == 2 and values[0] < values[1] else ""))  # fmt: skip
            self._allowed[key] = list(values)
        arg_names = self._arg_names()
        for where, names in [(f"variants.{v.id}.args", v.args) for v in self.variants] + \
                [(f"backlog.{i.id}.args", i.args) for i in self.backlog]:  # fmt: skip
            for name in names:
                if name not in arg_names:
                    raise ValueError(f"{where}: {brief_repr(name)} is not an argument of this plan's command; "
                                     + (f"its args: {', '.join(arg_names)}" if arg_names else
                                        "arguments are a command plan's workload.args (its '{name}' placeholders)"))
        for v in self.variants:
            self._within_bounds(v)
            try:
                check_env(self.variant_env(v), self.kernel)
            except ValueError as exc:
                raise ValueError(f"variants.{v.id}.env: {exc}") from None
            if v.source_patch:
                try:
                    source_patch_text(adapter, v.source_patch)
                except ValueError as exc:
                    raise ValueError(f"variants.{v.id}.source_patch: {exc}") from None
        for item in self.backlog:
            bad = [t for t in item.tunables if t not in spec.names]
            if bad:
                raise ValueError(f"backlog.{item.id}.tunables: unknown tunable {brief_repr(bad[0])}; valid: "
                                 f"{', '.join(spec.names)}")  # fmt: skip
            if item.tunables and item.env:
                raise ValueError(f"backlog.{item.id}: give tunables or env, not both (a config file cannot carry an "
                                 "environment variable, so the two are screened in their own items)")
            for name, values in item.env.items():
                if not values or len(set(values)) != len(values):
                    raise ValueError(f"backlog.{item.id}.env.{name}: give distinct values to try")
                for val in values:
                    try:
                        check_env({name: str(val)}, self.kernel)
                    except ValueError as exc:
                        raise ValueError(f"backlog.{item.id}.env: {exc}") from None
        if self.campaign is not None:
            self._check_campaign(spec)
        if self.stats.quick_rounds > self.stats.max_rounds:
            raise ValueError("stats.quick_rounds must not exceed stats.max_rounds")
        labels = [lv.label for lv in self._levels]
        unknown = sorted(set(map(str, self.stats.level_thresholds)) - set(labels))
        if unknown:
            raise ValueError(f"stats.level_thresholds: {brief_repr(unknown[0])} is not a level of this workload; "
                             f"its levels: {', '.join(labels)}")  # fmt: skip
        bad = [x for x in self.expect_levels if x not in labels]
        if bad:
            raise ValueError(f"expect_levels: {brief_repr(bad[0])} is not a level of this workload; its levels: "
                             f"{', '.join(labels)}")  # fmt: skip
        if self.expect_levels and self.expect != "no_change":
            raise ValueError("expect_levels needs expect: no_change (the levels where a null drill predicts no change)")
        return self

    def _arg_names(self) -> list[str]:
        """The command's argument names (a command plan's workload.args); none for a kernel."""
        return sorted(getattr(self._workload, "args", None) or {}) if self.kernel == "command" else []

    def _within_bounds(self, v: Variant) -> None:
        """A variant's patch (its overrides included) stays inside the plan's bounds: the values a person
        declared this investigation may try."""
        items = [("", {k: x for k, x in v.patch.items() if k != "overrides"})]
        overrides = v.patch.get("overrides")
        if isinstance(overrides, list):
            items += [(f".overrides[{i}]", o) for i, o in enumerate(overrides) if isinstance(o, dict)]
        field = "bounds" if self.bounds is not None else "allowed"
        for where, vals in items:
            for key, x in vals.items():
                allowed = self._allowed.get(key)
                if allowed is not None and x not in allowed:
                    said = self.bounds if self.bounds is not None else self.allowed
                    raise ValueError(f"variants.{v.id}.patch{where}: {key}={brief_repr(x)} is not among the plan's "
                                     f"{field}.{key} {_said(said[key])}; widen {field}.{key} or change the "
                                     "variant")  # fmt: skip

    def _check_campaign(self, spec) -> None:
        c = self.campaign
        for key, values in c.space.items():
            if key not in spec.names:
                raise ValueError(f"campaign.space: unknown tunable {brief_repr(key)}; valid: {', '.join(spec.names)}")
            if not values:
                raise ValueError(f"campaign.space.{key}: give at least one value")
            t = spec.tunable(key)
            bad = [x for x in values if x not in t.values]
            if bad:
                raise ValueError(f"campaign.space.{key}: {brief_repr(bad[0])} is invalid: must be {t.says()}")
        if not self.search_space() and not any(i.env for i in self.backlog):
            raise ValueError("campaign.space: empty; give the tunables to search (or the plan's allowed values)")
        labels = [lv.label for lv in self._levels]
        bad = [x for x in c.goal.levels if x not in labels]
        if bad:
            raise ValueError(f"campaign.goal.levels: {brief_repr(bad[0])} is not a level of this workload; its "
                             f"levels: {', '.join(labels)}")  # fmt: skip
        if not any(set(i.tunables) & set(self.search_space()) or i.env for i in self.backlog):
            raise ValueError("backlog: a campaign needs at least one item with tunables inside campaign.space "
                             "(tunables: [NAME, ...]) or environment values (env: {NAME: [...]}) to turn into a "
                             "workstream")

    def search_space(self) -> dict[str, list[int]]:
        """A campaign's space: campaign.space, else the plan's allowed values; each tunable's values as listed."""
        if self.campaign is None:
            return {}
        return {k: list(v) for k, v in (self.campaign.space or self._allowed).items()}

    def allowed_values(self) -> dict[str, list[int]]:
        """The values each tunable the plan limits may take (``allowed``, or its old spelling ``bounds``), a range
        resolved to the tunable's values inside it."""
        return {k: list(v) for k, v in self._allowed.items()}

    # ---- derived ------------------------------------------------------------------
    @property
    def ws(self) -> str:
        return self.workstream.id

    @property
    def adapter(self):
        from kinv.kernels.adapter import get_adapter

        return get_adapter(self.kernel)

    def levels(self) -> list:
        """The workload's levels (kernels.adapter.Level), in the adapter's order."""
        return list(self._levels)

    @property
    def workload_spec(self):
        """The workload as the adapter's pydantic model validated it."""
        return self._workload

    def variant_config(self, variant: Variant) -> dict:
        adapter = self.adapter
        cfg = {k: v for k, v in self.baseline.items() if k != "overrides"}
        cfg.update(variant.patch)
        cfg["kernel"] = adapter.name
        return adapter.validate_config(cfg)

    def variant_env(self, variant: Variant) -> dict[str, str]:
        """The environment the variant's processes get: the plan's, with the variant's own values on top (its
        command arguments as ``KINV_ARG_<name>``)."""
        return {**self.environment, **variant.env, **{f"{ARG_ENV}{k}": v for k, v in variant.args.items()}}

    def variant(self, vid: str) -> Variant:
        for v in self.variants:
            if v.id == vid:
                return v
        raise KeyError(f"unknown variant {vid!r}; valid: {', '.join(v.id for v in self.variants)}")


def _said(values) -> str:
    return f"{{min: {values.min}, max: {values.max}}}" if isinstance(values, AllowedRange) else str(list(values))


def check_env(v: dict[str, str], kernel: str | None) -> dict[str, str]:
    """Environment variables as a plan gives them: names A-Z/0-9/_, string values, and the kernel's own rule for
    them (``KernelAdapter.invalid_env``) where the kernel is known."""
    for k, val in v.items():
        if not ENV_NAME.fullmatch(k):
            raise ValueError(f"{brief_repr(k)} is not an environment variable name (A-Z, 0-9, _)")
        if len(val) > 256:
            raise ValueError(f"value of {k} is longer than 256 characters")
        if "\x00" in val:
            raise ValueError(f"value of {k} contains a NUL character")
    if kernel is None:  # the kernel was refused: its rule for the environment is unknown
        return v
    from kinv.kernels.adapter import get_adapter

    bad = get_adapter(kernel).invalid_env(v)
    if bad:
        raise ValueError(bad[0].replace(", which must", " must"))
    return v


def _validate_sub(model: type[BaseModel], data, where: str):
    """Validate a plan section with a model the adapter owns; errors read like the plan's own."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{where}.{_first_error(exc, model)}") from None


def source_patch_text(adapter, rel: str) -> tuple[Path, str]:
    """(path, text) of a variant's source patch: found beside the plan's project (the current directory) or
    under the adapter's root, and a unified diff (``--- a/FILE``, ``+++ b/FILE`` and an ``@@`` hunk).  Raises
    ValueError naming what is wrong; whether it applies is the patch step's to say."""
    root = adapter.root()
    path = next((d / rel for d in (Path.cwd(), root) if (d / rel).is_file()), None)
    if path is None:
        raise ValueError(f"{rel} does not exist under {Path.cwd()} or {root}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{rel} cannot be read as UTF-8 text: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    lines = text.splitlines()
    if not (any(ln.startswith("--- ") for ln in lines) and any(ln.startswith("+++ ") for ln in lines)
            and any(ln.startswith("@@ ") for ln in lines)):  # fmt: skip
        raise ValueError(f"{rel} is not a unified diff (no '--- a/FILE', '+++ b/FILE' and '@@' hunk lines); "
                         "make one with git diff or diff -u")
    return path, text


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


def _first_error(exc: ValidationError, root: type[BaseModel] | None = None) -> str:
    """The first error as ``field.path: what is wrong, got VALUE`` (one line, values shortened)."""
    err = exc.errors(include_url=False, include_context=False)[0]
    loc = ".".join(x if isinstance(x, str) and x.isidentifier() and len(x) <= 40 else brief_repr(x, 40)
                   for x in err["loc"])  # fmt: skip
    msg = re.sub(r"a valid dictionary or instance of \w+", "a mapping (key: value)", err["msg"].removeprefix("Value error, "))
    if err["type"] == "extra_forbidden":
        model = _model_at(err["loc"][:-1], root or Plan)
        msg = "unknown key" + (f"; valid keys: {', '.join(model.model_fields)}" if model else "")
    elif err["type"] not in ("missing", "value_error", "assertion_error") and "input" in err:
        msg += f", got {brief_repr(err['input'], 40)}"
    more = exc.error_count() - 1
    return (f"{loc}: {msg}" if loc else msg) + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def _model_at(loc, root: type[BaseModel]) -> type[BaseModel] | None:
    """The plan model (Plan, Variant, ...) that holds the keys at ``loc``, if one does."""
    import typing

    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model = None
        todo = [field.annotation]
        while todo:
            t = todo.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                model = t
            else:
                todo.extend(typing.get_args(t))
    return model


def load_plan(path: str | Path) -> tuple[Plan, str]:
    """Read and validate a YAML plan; returns (plan, content hash) or raises PlanError (one line)."""
    try:
        return _load_plan(Path(path))
    except PlanError as exc:
        raise PlanError(f"{one_line(str(exc))} {REFERENCE_LINK}") from None


def _load_plan(path: Path) -> tuple[Plan, str]:
    import yaml

    if path.is_dir():
        raise PlanError(f"plan file {path} is a directory; give a YAML file such as plans/3a-attention-occupancy.yaml")
    if not path.is_file():
        raise PlanError(f"plan file {path} does not exist (plans live in plans/, e.g. plans/3a-attention-occupancy.yaml)")
    text = read_text_file(path, "plan file", MAX_PLAN_BYTES, PlanError)
    try:
        data = yaml.load(text, Loader=_BoundedLoader)
    except TooBig as exc:
        raise PlanError(f"plan file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise PlanError(f"plan file {path} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise PlanError(f"plan file {path} is not a usable plan: its YAML nests too deeply") from None
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise anything on odd tagged values:
        # ValueError (!!int x, a 5000-digit number), AttributeError (!!timestamp 1-1-1), TypeError, ...
        if "integer string conversion" in str(exc):
            said = "a number has more than 4300 digits"
        elif isinstance(exc, ValueError) and str(exc).strip():
            said = f"a value cannot be read: {str(exc).splitlines()[0]}"
        else:
            said = "a value cannot be read as its type or tag (a bad date, !!int, !!binary, ...?)"
        raise PlanError(f"plan file {path} is not valid YAML: {said}") from None
    if not isinstance(data, dict):
        raise PlanError(f"plan file {path} must be a YAML mapping with keys workstream, kernel, hypothesis, ...")
    _beside_the_plan(path, data.get("kernel"))
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"plan file {path}: {_first_error(exc)}") from None
    except RecursionError:
        raise PlanError(f"plan file {path} is not a usable plan: it nests too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise PlanError(f"plan file {path}: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}") from None
    return plan, hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _beside_the_plan(path: Path, kernel) -> None:
    """A plan that names its adapter's class (``kernel: mypkg.adapter:MyKernel``) and sits beside that package (a
    plugin's own folder) finds it there, installed or not: the folder joins the import path (after what is on it)."""
    import sys

    from kinv.kernels.adapter import REF

    if not isinstance(kernel, str) or not REF.fullmatch(kernel):
        return
    folder = path.resolve().parent
    top = kernel.split(".", 1)[0].split(":", 1)[0]
    if (folder / top).is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))


def _make_loader():
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader that refuses alias expansion bombs ("billion laughs")."""

        max_nodes = 20000
        max_depth = 32  # a plan nests 7 levels; deeper is garbage (and would cost stack and scanner time)

        def __init__(self, stream):
            super().__init__(stream)
            self._nodes = 0
            self._depth = 0

        def construct_object(self, node, deep=False):
            self._nodes += 1
            if self._nodes > self.max_nodes:
                raise TooBig(f"YAML expands to more than {self.max_nodes} nodes (anchors/aliases bomb?)")
            return super().construct_object(node, deep=deep)

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self._nodes += 50
                if self._nodes > self.max_nodes:
                    raise TooBig(f"YAML uses too many aliases (more than {self.max_nodes // 50})")
            self._depth += 1
            try:
                if self._depth > self.max_depth:
                    raise TooBig(f"YAML nests deeper than {self.max_depth} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_mapping_node(self, anchor):
            node = super().compose_mapping_node(anchor)
            seen = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            "while reading a mapping", node.start_mark,
                            f"found duplicate key {brief_repr(key.value)}", key.start_mark)  # fmt: skip
                    seen.add((key.tag, key.value))
            return node

    return BoundedLoader


class _LazyLoader:
    _cls = None

    def __call__(self, stream):
        if _LazyLoader._cls is None:
            _LazyLoader._cls = _make_loader()
        return _LazyLoader._cls(stream)


_BoundedLoader = _LazyLoader()
