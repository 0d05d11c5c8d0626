"""The read views' models: the stable ``--json`` schema of ``kinv status``, ``todos``, ``experiments``, ``show``,
``pending``, ``history``, ``backups``, ``report``, ``export`` and ``compare``.

They forbid unknown keys and every field says what it holds; :mod:`kinv.agent.report.views` fills them from the
store.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator


class View(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # a model's schema is built when first used


# --------------------------------------------------------------------------- #
# models: the --json schema
# --------------------------------------------------------------------------- #
class TodoView(View):
    id: str = Field(description="todo id, e.g. '#3a.V1'")
    workstream: str = Field(description="workstream id, e.g. '#3a'")
    parent: str | None = Field(None, description="parent todo id for a follow-up, e.g. '#3a.V1' for '#3a.V3'")
    content: str = Field(description="what the todo is, imperative ('Test V1: ' and what it changes)")
    active_form: str | None = Field(None, description="present-continuous form shown while it runs, if stored")
    status: str = Field(description="kinv status: pending, in_progress, completed, cancelled, ...")
    reason: str | None = Field(None, description="why it ended as it did, e.g. 'moot: V1 regressed at every level'")
    priority: str | None = Field(None, description="high, medium or low")
    position: int | None = Field(None, description="order within the workstream's list")


class VerdictView(View):
    experiment: int = Field(description="experiment id")
    variant: str | None = Field(None, description="variant id, e.g. 'V1'")
    level: str = Field(description="workload level key, e.g. 'v4flash/h16/p64/ctx4096/b32'")
    n: int | None = Field(None, description="paired rounds behind this verdict")
    base_us: float | None = Field(None, description="baseline time at this level, microseconds")
    variant_us: float | None = Field(None, description="variant time at this level, microseconds")
    effect: float | None = Field(None, description="mean paired log-ratio log(base/variant); > 0 = variant faster")
    ci_low: float | None = Field(None, description="lower confidence bound of the effect")
    ci_high: float | None = Field(None, description="upper confidence bound of the effect")
    ratio: float | None = Field(None, description="throughput ratio variant/base, exp(effect)")
    threshold: float | None = Field(None, description="practical threshold (relative) the effect was judged against")
    verdict: str | None = Field(None, description="improved, regressed, equivalent or undecided")
    conf: float | None = Field(None, description="real coverage of [ci_low, ci_high]: the per-look confidence after "
                               "the multiplicity correction")
    offset_sd: float | None = Field(None, description="between-arm offset SD from the A/A, inside the interval")

    # the number every text view prints: the throughput change variant/baseline - 1, with its interval
    change: float | None = Field(None, description="throughput change, variant / baseline - 1 (what every table "
                                 "prints); derived from effect")
    change_low: float | None = Field(None, description="lower bound of the throughput change")
    change_high: float | None = Field(None, description="upper bound of the throughput change")

    @model_validator(mode="after")
    def _changes(self):
        for name, src in (("change", self.effect), ("change_low", self.ci_low), ("change_high", self.ci_high)):
            object.__setattr__(self, name, None if src is None else math.expm1(src))
        return self


class ApprovalView(View):
    id: str = Field(description="approval id, used by `kinv approve ID` / `kinv reject ID`")
    workstream: str | None = Field(None, description="workstream id")
    todo: str | None = Field(None, description="todo the edit belongs to")
    variant: str | None = Field(None, description="variant id")
    kind: str | None = Field(None, description="kind of edit: config patch or source patch")
    status: str = Field(description="pending, approved or rejected")
    reason: str | None = Field(None, description="the reason given with the decision")
    diff: str | None = Field(None, description="unified diff of the edit")
    resources: dict = Field(default_factory=dict, description="predicted resources: shared memory, registers, ...")
    hypothesis: str | None = Field(None, description="what the edit is expected to show")
    title: str | None = Field(None, description="the variant's title")
    rationale: str | None = Field(None, description="why the variant might help")
    plan_hash: str | None = Field(None, description="hash of the plan the approval was asked under (pinned)")
    patch_sha: str | None = Field(None, description="hash of the exact edit approved: the config, the source diff and the config file's bytes before and after")
    created: float | None = Field(None, description="when it was asked for, unix seconds")


class VariantVerdict(View):
    variant: str = Field(description="variant id (or the experiment kind, e.g. 'noise', when it has none)")
    verdict: str = Field(description="accept, reject, mixed or inconclusive (A/A: the noise check's outcome)")
    reason: str | None = Field(None, description="one line on why")
    experiment: int = Field(description="the experiment the verdict comes from (`kinv show ID`)")


class WorkstreamView(View):
    id: str = Field(description="workstream id, e.g. '#3a'")
    title: str | None = Field(None, description="one-line title")
    parent: str | None = Field(None, description="parent workstream id, e.g. '#3'")
    parent_title: str | None = Field(None, description="parent workstream title")
    status: str | None = Field(None, description="workstream status")
    hypothesis: str | None = Field(None, description="what the investigation tests")
    kernel: str | None = Field(None, description="kernel under investigation")
    backend: str | None = Field(None, description="benchmark backend: cuda or replay")
    recommendation: str | None = Field(None, description="close-out recommendation (next workstream)")
    report_path: str | None = Field(None, description="path of the close-out report")
    todos: list[TodoView] = Field(default_factory=list, description="the workstream's todo list, in order")
    pending_approvals: list[ApprovalView] = Field(default_factory=list, description="edits waiting for a person")
    latest_verdicts: list[VariantVerdict] = Field(default_factory=list, description="latest verdict per variant")
    live_patches: list[str] = Field(default_factory=list, description="patches of this workstream still on disk "
                                    "while no run of it is alive (killed): each names the file and the variant")
    way_back: str | None = Field(None, description="the command that restores those files, when any is live")


class ExperimentView(View):
    id: int = Field(description="experiment id (`kinv show ID`)")
    workstream: str | None = Field(None, description="workstream id")
    todo: str | None = Field(None, description="todo id")
    variant: str | None = Field(None, description="variant id")
    kind: str | None = Field(None, description="experiment kind: noise (A/A), ab, bench, ...")
    backend: str | None = Field(None, description="benchmark backend: cuda or replay")
    status: str | None = Field(None, description="running, done, void, failed, ...")
    verdict: str | None = Field(None, description="variant verdict")
    reason: str | None = Field(None, description="why the verdict")
    config_hash: str | None = Field(None, description="hash of the measured config")
    rounds: int | None = Field(None, description="measurement rounds taken")
    gpu_s: float | None = Field(None, description="GPU seconds spent")
    wall_s: float | None = Field(None, description="wall seconds spent")
    samples: int = Field(0, description="stored samples")


class CampaignStep(View):
    ws: str | None = Field(None, description="the workstream the step ran (none when screening found no finalist)")
    item: str = Field(description="the backlog item it searched, or 'final' (the config against the start)")
    phase: str = Field(description="screen, confirm or done")
    finalists: list[str] = Field(default_factory=list, description="configs confirmed with the full A/B")
    screened: int = Field(0, description="candidates screened")
    pruned: int = Field(0, description="candidates the resource model pruned before any GPU time")
    verdicts: dict[str, str] = Field(default_factory=dict, description="variant -> verdict")
    note: str | None = Field(None, description="why a step ended without a workstream")


class CampaignView(View):
    id: str = Field(description="campaign id, e.g. '#7'")
    status: str | None = Field(None, description="running, paused, interrupted, done or stopped")
    plan_path: str | None = Field(None, description="the campaign plan")
    start_config: str | None = Field(None, description="the config it started from")
    incumbent: str | None = Field(None, description="the config confirmed so far (per level where it differs)")
    stop_reason: str | None = Field(None, description="why it stopped")
    steps: list[CampaignStep] = Field(default_factory=list, description="its workstreams, in order")


class StatusView(View):
    state_dir: str = Field(description="the state dir read")
    campaigns: list[CampaignView] = Field(default_factory=list, description="campaigns, each a chain of workstreams")
    workstreams: list[WorkstreamView] = Field(default_factory=list, description="every workstream, oldest first")
    adhoc: list[ExperimentView] = Field(default_factory=list, description="experiments outside any workstream "
                                        "(kinv bench, kinv noise), oldest first")


class SampleSummary(View):
    level: str = Field(description="workload level key")
    arm: str = Field(description="arm tag: A = baseline, B = variant")
    n: int = Field(description="samples")
    median_us: float = Field(description="median time, microseconds")
    min_us: float = Field(description="fastest sample, microseconds")
    max_us: float = Field(description="slowest sample, microseconds")
    cv: float = Field(description="coefficient of variation (population std / mean)")
    place: str | None = Field(None, description="the GPU (Ray actor) that timed them; none in one process")


class NoiseView(View):
    level: str = Field(description="workload level key")
    band: float | None = Field(None, description="noise band (relative) from the A/A rounds")
    cv: float | None = Field(None, description="coefficient of variation of the raw times")
    n_pairs: int | None = Field(None, description="A/A pairs")
    equivalent: bool | None = Field(None, description="whether A/A came out equivalent (the harness check)")
    effect: float | None = Field(None, description="A/A effect (should be ~0)")
    ci_low: float | None = Field(None, description="lower bound of the A/A effect")
    ci_high: float | None = Field(None, description="upper bound of the A/A effect")
    round_sd: float | None = Field(None, description="SD of one round's paired log-ratio between two workers")
    offset_sd: float | None = Field(None, description="SD of the between-arm offset (does not average away)")
    n_arms: int | None = Field(None, description="baseline workers in the A/A")
    outliers: int | None = Field(None, description="outlier samples found and winsorized")
    threshold: float | None = Field(None, description="the plan's threshold at this level")
    warning: str | None = Field(None, description="set when the noise is too large to decide at the threshold")


class Ledger(View):
    gpu_s: float = Field(description="GPU seconds spent (the experiment's, else the sum over its samples)")
    rounds: int = Field(description="measurement rounds taken")
    wall_s: float = Field(description="wall seconds spent")
    samples: int = Field(description="stored samples")


class ShowView(View):
    experiment: ExperimentView = Field(description="the experiment")
    diff: str | None = Field(None, description="the patch measured, as a unified diff")
    env_checks: list[dict] = Field(default_factory=list, description="env checks: expected vs seen, ok, mismatch")
    correctness: dict | None = Field(None, description="correctness gate result")
    resources: dict | None = Field(None, description="resources of the config: shared memory, registers, ...")
    sample_summary: list[SampleSummary] = Field(default_factory=list, description="samples per level and arm")
    effects: list[VerdictView] = Field(default_factory=list, description="per-level effect and verdict")
    noise: list[NoiseView] = Field(default_factory=list, description="noise bands, for an A/A experiment")
    ledger: Ledger = Field(description="cost: GPU seconds, rounds, wall seconds, samples")
    logs: dict | None = Field(None, description="where the output of every run of this experiment is kept (a command's "
                              "runs): {dir, pattern, files}")


class ReportView(View):
    """``kinv report --json``: the close-out's content as data (the Markdown is included as written)."""

    workstream: WorkstreamView
    experiments: list[ShowView]
    close_out: str
    markdown: str


class HistoryItem(View):
    step: int = Field(description="1, 2, ... in the order the nodes ran (re-runs after a resume count again)")
    node: str = Field(description="graph node that ran")
    time: str = Field(description="when it finished, UTC (YYYY-MM-DD HH:MM:SSZ)")
    decision: str | None = Field(None, description="what the node concluded (its decision), or why it paused or failed")
    outcome: str = Field(description="ok, '-> NODE' (where it routed), paused or error")
    seconds: float = Field(description="how long the node ran")


class BackupView(View):
    id: int = Field(description="backup id")
    path: str = Field(description="file that was backed up")
    backup_path: str = Field(description="where the copy lies")
    sha: str | None = Field(None, description="hash of the backed-up content")
    workstream: str | None = Field(None, description="workstream that made it")
    t: float | None = Field(None, description="when, unix seconds")


# ---- per-level effects of verdicts, as a person quotes them (export and compare) ----
class EffectRow(View):
    workstream: str | None = Field(None, description="workstream id")
    experiment: int = Field(description="experiment id")
    variant: str | None = Field(None, description="variant id")
    backend: str | None = Field(None, description="cuda (measured) or replay (recorded)")
    level: str = Field(description="workload level key")
    rounds: int | None = Field(None, description="paired rounds behind the effect")
    base_us: float | None = Field(None, description="baseline time, microseconds")
    variant_us: float | None = Field(None, description="variant time, microseconds")
    change: float | None = Field(None, description="throughput change, variant / baseline - 1")
    change_low: float | None = Field(None, description="lower bound of the change")
    change_high: float | None = Field(None, description="upper bound of the change")
    conf: float | None = Field(None, description="coverage of the interval (per look, after the multiplicity rule)")
    threshold: float | None = Field(None, description="the plan's threshold at this level")
    verdict: str | None = Field(None, description="improved, regressed, equivalent or undecided")


class CompareRow(View):
    level: str = Field(description="workload level key")
    a: EffectRow | None = Field(None, description="the first experiment's effect at this level")
    b: EffectRow | None = Field(None, description="the second experiment's effect at this level")
    difference: float | None = Field(None, description="b's change minus a's change")
    overlap: bool | None = Field(None, description="whether the two intervals overlap")
    same_verdict: bool | None = Field(None, description="whether both reached the same verdict")
