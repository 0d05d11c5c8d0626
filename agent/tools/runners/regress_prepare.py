"""What ``kinv regress`` compares, prepared before any GPU time (agent/tools/runners/regress.py times it): the kernels
whose files differ between the two revisions, each revision's kernel package as a snapshot of its own, the margins
(``--plan`` or the committed defaults file, read from BASE so that a change cannot widen its own), and the types a
comparison's verdicts are kept in (per level, per kernel, per comparison)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kinv.agent.plan_sections import StatsSettings
from kinv.agent.tools.files import revisions
from kinv.agent.tools.files.revisions import Revision
from kinv.kernels.errors import BadInput, KinvError, StepFailed

MARGINS_FILE = "plans/regress/margins.yaml"
"""The committed defaults file: per kernel, the plan it is measured at and its margins (read from BASE)."""

LEVEL_VERDICTS = ("improved", "regressed", "equivalent", "undecided")

# how a comparison ends, most serious first (the command's exit code follows it: docs/usage.md)
OUTCOMES = ("regressed", "failed", "undecided", "ok")


class KernelMargins(BaseModel):
    """One kernel's entry of the defaults file."""

    model_config = ConfigDict(extra="forbid")
    plan: str = Field(description="the plan (relative to the repository) whose levels, environment and device the "
                      "kernel is measured at")  # fmt: skip
    stats: dict = Field(default_factory=dict, description="overrides of the plan's stats: (threshold, conf, ...)")


class Margins(BaseModel):
    """The defaults file: ``kernels: {name: {plan, stats}}``."""

    model_config = ConfigDict(extra="forbid")
    kernels: dict[str, KernelMargins] = Field(default_factory=dict)


@dataclass
class Setting:
    """What one kernel is judged at: its plan (levels, environment, device), the stats (margins) and where they
    came from."""

    kernel: str
    plan: object  # agent.plan.Plan
    stats: StatsSettings
    source: str  # "--plan plans/x.yaml" | "plans/regress/margins.yaml at BASE (sha)" | ...
    plan_path: str = ""


@dataclass
class LevelResult:
    level: str
    label: str
    verdict: str  # improved / regressed / equivalent / undecided
    effect: float | None = None  # log(t_base / t_head): positive = HEAD faster
    ci_low: float | None = None
    ci_high: float | None = None
    conf: float | None = None
    threshold: float = 0.0
    band: float | None = None  # the A/A's round band at this level
    offset_sd: float | None = None
    base_us: float | None = None
    head_us: float | None = None
    n: int = 0

    @property
    def change(self) -> float | None:
        """HEAD's throughput change over BASE (+3% = 3% faster)."""
        return None if self.effect is None else math.expm1(self.effect)


@dataclass
class KernelResult:
    kernel: str
    differs: list[str]
    verdict: str  # regressed / improved / equivalent / undecided / broken / failed
    reason: str
    setting_source: str = ""
    plan: str = ""
    base_config: str = ""
    head_config: str = ""
    levels: list[LevelResult] = field(default_factory=list)
    aa_experiment: int | None = None
    ab_experiment: int | None = None
    rounds: int = 0
    gpu_s: float = 0.0
    wall_s: float = 0.0
    skipped: list[str] = field(default_factory=list)
    resources: dict = field(default_factory=dict)  # {level: "registers 96 -> 128, CTAs/SM 2 -> 1"} of regressed
    snapshots: dict = field(default_factory=dict)  # {"base": path, "head": path}

    @property
    def outcome(self) -> str:
        """regressed (a level regressed, or HEAD broke the kernel), failed (BASE or the harness could not be
        measured), undecided, or ok (improved or equivalent everywhere)."""
        if self.verdict in ("regressed", "broken") or any(lv.verdict == "regressed" for lv in self.levels):
            return "regressed"
        if self.verdict == "failed":
            return "failed"
        if self.verdict == "undecided" or any(lv.verdict == "undecided" for lv in self.levels):
            return "undecided"
        return "ok"


@dataclass
class Comparison:
    id: int
    repo: str
    base: Revision
    head: Revision
    backend: str
    machine: str = ""
    kernels: list[KernelResult] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)  # kernels whose files do not differ (not measured)
    not_comparable: dict = field(default_factory=dict)  # kernel -> why (absent from one revision)
    gpu_s: float = 0.0
    wall_s: float = 0.0
    budget: tuple[float, float] = (0.0, 0.0)
    closeout: str = ""
    started: float = 0.0
    sources_only: bool = False  # BASE contributed only its kernel sources and configs, over HEAD's package

    @property
    def outcome(self) -> str:
        seen = {k.outcome for k in self.kernels}
        return next((o for o in OUTCOMES if o in seen), "ok")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["base"] = {**asdict(self.base), "label": self.base.label}
        d["head"] = {**asdict(self.head), "label": self.head.label}
        d["outcome"] = self.outcome
        for k, kd in zip(self.kernels, d["kernels"], strict=True):
            kd["outcome"] = k.outcome
            for lv, ld in zip(k.levels, kd["levels"], strict=True):
                ld["change"] = lv.change
                for key in ("ci_low", "ci_high"):
                    ld[f"{key}_change"] = None if ld[key] is None else math.expm1(ld[key])
        return d


# --------------------------------------------------------------------------- #
# margins
# --------------------------------------------------------------------------- #
def read_margins(repo: Path, base: Revision, path: str = MARGINS_FILE) -> tuple[Margins | None, str]:
    """The defaults file as BASE has it (else the working tree's), and a phrase saying which; ``(None, why)`` when
    neither has one."""
    import yaml

    from kinv.agent.plan_file import _BoundedLoader

    text, where = None, ""
    try:
        text = revisions._git(repo, "show", f"{base.sha}:{path}")
        where = f"{path} at BASE ({base.sha[:10]})"
    except StepFailed:
        if (repo / path).is_file():
            text = (repo / path).read_text(encoding="utf-8", errors="replace")
            where = f"{path} of the working tree (BASE has none)"
    if text is None:
        return None, f"neither BASE nor the working tree has {path}"
    try:
        data = yaml.load(text, Loader=_BoundedLoader) or {}
        return Margins.model_validate(data), where
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise BadInput(f"{where}: {loc}: {err['msg']} (valid: kernels: {{NAME: {{plan: PLAN.yaml, stats: "
                       "{threshold: 0.01, ...}}}})") from None  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - YAML's own errors, a value of an odd tag
        raise BadInput(
            f"{where} is not valid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def setting_for(kernel: str, repo: Path, plan_path: Path | None, margins: Margins | None, margins_where: str,
                adapter) -> Setting:  # fmt: skip
    """What ``kernel`` is judged at (BadInput naming what is missing)."""
    from kinv.agent.plan_file import load_plan

    if plan_path is not None:
        plan, _ = load_plan(plan_path)
        return Setting(kernel, plan, plan.stats, f"--plan {plan_path}", str(plan_path))
    entry = margins.kernels.get(kernel) if margins else None
    if entry is not None:
        from kinv.agent.plan_sections import safe_relative_path

        try:
            p = repo / safe_relative_path(entry.plan)
        except ValueError as exc:
            raise BadInput(f"{margins_where}: kernels.{kernel}.plan: {exc}") from None
        plan, _ = load_plan(p)
        if plan.adapter.name != adapter.name:
            raise BadInput(f"{margins_where}: kernels.{kernel}.plan {entry.plan} is a plan of {plan.adapter.name}, "
                           f"not {kernel}")  # fmt: skip
        try:
            stats = StatsSettings.model_validate({**plan.stats.model_dump(), **entry.stats})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise BadInput(f"{margins_where}: kernels.{kernel}.stats.{'.'.join(map(str, err['loc']))}: "
                           f"{err['msg']}") from None  # fmt: skip
        return Setting(kernel, plan, stats, margins_where, entry.plan)
    if adapter.example_plan and (adapter.root() / adapter.example_plan).is_file():
        plan, _ = load_plan(adapter.root() / adapter.example_plan)
        return Setting(kernel, plan, plan.stats, f"{adapter.example_plan}, the example plan of {kernel} "
                                                 f"({margins_where or 'no margins file'} does not name it)",
                       adapter.example_plan)  # fmt: skip
    raise BadInput(f"no margins for kernel {kernel}: name it in {MARGINS_FILE} (kernels: {{{kernel}: {{plan: ...}}}}) "
                   "or give --plan PLAN")  # fmt: skip


# --------------------------------------------------------------------------- #
# the comparison
# --------------------------------------------------------------------------- #
@dataclass
class _Job:
    adapter: object
    setting: Setting
    differs: list[str]
    base_files: dict
    head_files: dict
    base_cfg: dict
    head_cfg: dict
    base_path: list[str] = field(default_factory=list)
    head_path: list[str] = field(default_factory=list)


def candidates(repo: Path, base: Revision, head: Revision, kernels: list[str] | None,
               sources_only: bool = False) -> tuple[list, list, dict]:  # fmt: skip
    """``([(adapter, differs, base_files, head_files)], unchanged, not_comparable)``: the kernels to measure
    (those whose files differ, or every one ``kernels`` names), the registered kernels whose files do not differ,
    and those present in one revision only.  ``sources_only``: BASE contributes only the kernel's own sources and
    config, over HEAD's package (its adapter, reference and shared modules): for a BASE whose adapter predates
    the harness of today."""
    from kinv.kernels.adapter import get_adapter, registered

    names = list(kernels) if kernels else list(registered())
    adapters = []
    for n in names:
        a = get_adapter(n)  # an unknown --kernel: UnknownKernelError (bad input) names the valid ones
        if not a.kernel_files:
            if kernels:
                raise BadInput(f"kernel {n} has no kernel source files to compare (a plan's own command is "
                               "measured by its plan: kinv run)")  # fmt: skip
            continue
        adapters.append(a)
    every = [get_adapter(n) for n in registered()]
    by_pkg: dict[str, dict] = {}
    out, unchanged, absent = [], [], {}
    for a in adapters:
        rel = revisions.package_rel(repo, a)
        if rel is None:
            if kernels:
                raise BadInput(f"kernel {a.name}'s package ({a.package_dir().name}/) is not in {repo}")
            continue
        if rel not in by_pkg:
            by_pkg[rel] = {"base": revisions.package_at(repo, base, rel), "head": revisions.package_at(repo, head, rel)}
        bf, hf = by_pkg[rel]["base"], by_pkg[rel]["head"]
        cfg = f"configs/{a.name}.json"
        if sources_only:
            pkg_rel = a.package_dir().relative_to(a.root()).as_posix()
            mine = [f.removeprefix(pkg_rel + "/") for f in a.kernel_files] + [cfg]
            bf = {**hf, **{f: bf[f] for f in mine if f in bf}}
        missing = [who for who, files in (("BASE", bf), ("HEAD", hf)) if cfg not in files]
        if missing:
            absent[a.name] = f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no {rel}/{cfg}"
            continue
        others = set()
        for o in every:
            if o.name != a.name and o.package_dir() == a.package_dir():
                others |= revisions.own_files(o)
        differs = revisions.differences(a, bf, hf, others, same_code=_same_code)
        if differs or kernels:
            out.append((a, differs, bf, hf))
        else:
            unchanged.append(a.name)
    return out, unchanged, absent


def _config(adapter, files: dict, who: str, rev: Revision) -> dict:
    cfg = revisions.config_of(files, adapter.name)
    if cfg is None:
        raise BadInput(f"{who} ({rev.label}) has no readable configs/{adapter.name}.json")
    try:
        return adapter.validate_config({**cfg, "kernel": adapter.name})
    except (ValueError, KinvError) as exc:
        raise BadInput(f"{who} ({rev.label}): configs/{adapter.name}.json is not a valid config: {exc}") from None


@dataclass
class Prepared:
    """A comparison checked and ready to time: its revisions, the kernels to measure (each with its setting, both
    configs and both snapshots, so far in a temporary folder) and what is not measured."""

    repo: Path
    base: Revision
    head: Revision
    jobs: list[_Job]
    unchanged: list[str]
    not_comparable: dict
    tmp: Path
    sources_only: bool = False


def prepare(repo: Path, base_name: str, head_name: str | None, backend, plan_path: Path | None,
            kernels: list[str] | None, tmp: Path, sources_only: bool = False) -> Prepared:  # fmt: skip
    """Everything a comparison needs before it times anything, each refusal bad input and nothing written but the
    snapshots under ``tmp``: the revisions, the kernels, their settings and configs, and the backend's preflight of
    every arm (replay: a recording of each revision's source, config and level).  ``sources_only``: see
    :func:`candidates`."""
    base = revisions.resolve(repo, base_name)
    head = revisions.resolve(repo, head_name)
    if plan_path is not None:
        from kinv.agent.plan_file import load_plan

        plan = load_plan(plan_path)[0]
        if not plan.adapter.kernel_files:  # a plan's own command: each revision runs it from its own checkout
            return _prepare_command(repo, base, head, backend, plan, plan_path, kernels, tmp)
    found, unchanged, absent = candidates(repo, base, head, kernels, sources_only)
    margins, where = (None, "") if plan_path is not None else read_margins(repo, base)
    if plan_path is not None:
        from kinv.agent.plan_file import load_plan

        pk = load_plan(plan_path)[0].adapter.name
        if kernels is None:  # --plan names the kernel to judge: the others are not judged by its margins
            unchanged = [n for n in unchanged if n == pk]
            absent = {k: v for k, v in absent.items() if k == pk}
            found = [f for f in found if f[0].name == pk]
        elif any(f[0].name != pk for f in found):
            other = next(f[0].name for f in found if f[0].name != pk)
            raise BadInput(
                f"--plan {plan_path} is a plan of {pk}; --kernel {other} needs its own (run once per kernel)"
            )
    jobs = []
    for adapter, differs, bf, hf in found:
        setting = setting_for(adapter.name, repo, plan_path, margins, where, adapter)
        job = _Job(adapter, setting, differs, bf, hf, _config(adapter, bf, "BASE", base),
                   _config(adapter, hf, "HEAD", head))  # fmt: skip
        _snapshots(job, tmp)
        _preflight(backend, job)
        jobs.append(job)
    return Prepared(repo, base, head, jobs, unchanged, absent, tmp, sources_only)


def _prepare_command(repo: Path, base: Revision, head: Revision, backend, plan, plan_path: Path,
                     kernels: list[str] | None, tmp: Path) -> Prepared:  # fmt: skip
    """A command benchmark (``kernel: command`` plans): measured when any file of the checkout differs (or
    ``--kernel command``), each revision's command (and server) run from a copy of that revision's files."""
    name = plan.adapter.name
    if kernels and kernels != [name]:
        raise BadInput(
            f"--plan {plan_path} measures its command ({name}); --kernel {kernels[0]} needs a plan of its own"
        )
    bt, ht = revisions.tree_at(repo, base), revisions.tree_at(repo, head)
    diff = revisions.changed(bt, ht)
    if not diff and not kernels:
        return Prepared(repo, base, head, [], [name], {}, tmp)
    said = [f"{len(diff)} file(s): {', '.join(diff[:4])}{', ...' if len(diff) > 4 else ''}"] if diff else []
    cfg = {"kernel": name}
    job = _Job(plan.adapter, Setting(name, plan, plan.stats, f"--plan {plan_path}", str(plan_path)), said, bt, ht,
               cfg, cfg)  # fmt: skip
    _snapshots(job, tmp)
    _preflight(backend, job)
    return Prepared(repo, base, head, [job], [], {}, tmp)


def _snapshots(job: _Job, where: Path) -> None:
    if not job.adapter.kernel_files:  # a command: each revision's whole checkout
        job.base_path = [str(revisions.write_tree(job.base_files, where / job.adapter.name / "base"))]
        job.head_path = [str(revisions.write_tree(job.head_files, where / job.adapter.name / "head"))]
        return
    from kinv.agent.tools.worker.hashes import kernel_source_hash

    for side in ("base", "head"):
        files = getattr(job, f"{side}_files")
        snap = revisions.snapshot(files, where / job.adapter.name / side, job.adapter, kernel_source_hash)
        setattr(job, f"{side}_path", [str(snap)])


def _same_code(a: bytes, b: bytes) -> bool:
    """Two versions of a kernel source file run the same code (comments and docstrings aside: the kernel source
    hash's rule)."""
    from kinv.agent.tools.worker.hashes import code_text

    return code_text(a.decode(errors="replace")) == code_text(b.decode(errors="replace"))


def _preflight(backend, job: _Job) -> None:
    plan, k = job.setting.plan, job.adapter.name
    env = dict(plan.environment)
    lvls = plan.levels()
    arms = [
        (("A", k, job.base_cfg, env), {"replica": j, "pythonpath": job.base_path})
        for j in range(job.setting.stats.aa_arms)
    ]
    arms += [
        (("base", k, job.base_cfg, env), {"partner": job.head_cfg, "role": "base", "pythonpath": job.base_path}),
        (("head", k, job.head_cfg, env), {"partner": job.base_cfg, "pythonpath": job.head_path}),
    ]
    backend.preflight(k, env, lvls, arms)


__all__ = ["LEVEL_VERDICTS", "MARGINS_FILE", "OUTCOMES", "Comparison", "KernelResult", "LevelResult", "Margins",
           "Prepared", "Setting", "candidates", "prepare", "read_margins", "setting_for"]  # fmt: skip
