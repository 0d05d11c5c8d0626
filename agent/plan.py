"""The plan model: the investigation a plan file describes, checked whole against its kernel's adapter.

Every model forbids unknown keys, and every field has a description a user
can read in an error message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from kinv.agent.plan_sections import (
    ARG_ENV,
    ENV_NAME,
    AllowedRange,
    BacklogItem,
    Budget,
    Campaign,
    StatsSettings,
    Strict,
    Variant,
    WorkstreamRef,
    check_text,
)
from kinv.agent.words import Target
from kinv.kernels.errors import ConfigError
from kinv.kernels.tunables import brief_repr


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
        raise ValueError(f"{where}.{first_error(exc, model)}") from None


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


def first_error(exc: ValidationError, root: type[BaseModel] | None = None) -> str:
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
