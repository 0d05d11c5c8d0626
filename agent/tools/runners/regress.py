"""``kinv regress BASE [HEAD]``: a kernel change judged between two git revisions with the whole measurement core.

For every kernel whose files differ between the two revisions (its source by code, its config by value, its adapter
or reference, the package's shared modules), or that ``--kernel`` names:

1. each revision's kernel package becomes a snapshot of its own (agent/tools/files/revisions.py), never by
   switching or writing the live checkout; every arm of that revision imports its snapshot, and the judge imports
   BASE's (a change cannot bring its own reference);
2. the margins come from ``--plan`` or the committed defaults file (plans/regress/margins.yaml), read from BASE so
   that a change cannot widen its own;
3. an A/A of BASE (its arms' offsets widen the A/B's intervals; a harness that does not reproduce BASE stops it);
4. the sequential A/B with every rule (agent/tools/measure/sequential.py): the correctness gate on both, the
   environment check, paired ABBA rounds with sequential looks, integrity, plausibility, the verdict and ledger;
5. one verdict per kernel and level: improved, regressed, equivalent or undecided, with its interval, stored
   (kinv.db's regressions tables) with the revisions, the date and the machine.

``--budget`` bounds GPU seconds and wall time over the whole comparison: a comparison stopped by it leaves its
levels undecided, with the interval its rounds so far support.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kinv.agent.errors import BudgetSpent
from kinv.agent.plan import StatsSettings
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

    from kinv.agent.plan import _BoundedLoader

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
    from kinv.agent.plan import load_plan

    if plan_path is not None:
        plan, _ = load_plan(plan_path)
        return Setting(kernel, plan, plan.stats, f"--plan {plan_path}", str(plan_path))
    entry = margins.kernels.get(kernel) if margins else None
    if entry is not None:
        from kinv.agent.plan import safe_relative_path

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
        from kinv.agent.plan import load_plan

        plan = load_plan(plan_path)[0]
        if not plan.adapter.kernel_files:  # a plan's own command: each revision runs it from its own checkout
            return _prepare_command(repo, base, head, backend, plan, plan_path, kernels, tmp)
    found, unchanged, absent = candidates(repo, base, head, kernels, sources_only)
    margins, where = (None, "") if plan_path is not None else read_margins(repo, base)
    if plan_path is not None:
        from kinv.agent.plan import load_plan

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


def run(store, prep: Prepared, backend, *, budget: tuple[float | None, float | None] = (None, None),
        say: Callable[[str], None] | None = None) -> Comparison:  # fmt: skip
    """Time a prepared comparison (:func:`prepare`): its snapshots move into the state dir
    (``regress/<id>/<kernel>/<base|head>/<kernel hash>``), each kernel is measured in turn, and every verdict is
    stored."""
    import shutil

    say = say or (lambda _m: None)
    t0 = time.time()
    base, head, jobs = prep.base, prep.head, prep.jobs
    gpu_budget = budget[0] if budget[0] is not None else sum(j.setting.plan.budget.gpu_seconds for j in jobs) or 300.0
    wall_budget = (
        budget[1] if budget[1] is not None else sum(j.setting.plan.budget.wall_seconds for j in jobs) or 3600.0
    )
    reg = store.new_regression(repo=str(prep.repo), base=base.name, base_sha=base.sha, base_date=base.date,
                               head=head.name, head_sha=head.sha, head_date=head.date, head_dirty=int(head.dirty),
                               backend=backend.name)  # fmt: skip
    where = store.dir / "regress" / str(reg)
    where.mkdir(parents=True, exist_ok=True)
    for job in jobs:  # the snapshots are kept with the comparison's record
        for side in ("base", "head"):
            paths = getattr(job, f"{side}_path")
            src = Path(paths[0])
            dest = where / job.adapter.name / side / src.name
            if not dest.exists():
                shutil.copytree(src, dest)
            paths[0] = str(dest)
    comp = Comparison(reg, str(prep.repo), base, head, backend.name, unchanged=prep.unchanged,
                      not_comparable=prep.not_comparable, budget=(gpu_budget, wall_budget), started=t0,
                      sources_only=prep.sources_only)  # fmt: skip
    try:
        for job in jobs:
            say(f"{job.adapter.name}: {', '.join(job.differs) or 'no difference (named by --kernel)'} differs; "
                f"margins from {job.setting.source}")  # fmt: skip
            try:
                comp.kernels.append(_one(store, backend, job, comp, gpu_budget, wall_budget, t0, say))
            except StepFailed as exc:  # this kernel's step failed (an environment that moved, a worker that died):
                if isinstance(exc, BadInput):  # the others are still judged, and the report says why this one is not
                    raise
                say(f"{job.adapter.name}: failed: {exc}")
                comp.kernels.append(KernelResult(job.adapter.name, job.differs, "failed", f"{type(exc).__name__}: {exc}",
                                                 setting_source=job.setting.source, plan=job.setting.plan_path))  # fmt: skip
    except BaseException as exc:
        store.finish_regression(reg, outcome="failed" if isinstance(exc, Exception) else "interrupted",
                                exit_code=getattr(exc, "exit_code", 1), wall_s=time.time() - t0,
                                gpu_s=sum(k.gpu_s for k in comp.kernels))  # fmt: skip
        raise
    comp.gpu_s = sum(k.gpu_s for k in comp.kernels)
    comp.wall_s = time.time() - t0
    comp.machine, _device = _machine(store, backend, comp)
    for k in comp.kernels:
        store.add_regress_levels(reg, [{"kernel": k.kernel, "level": lv.level, "label": lv.label,
                                        "verdict": lv.verdict, "kernel_verdict": k.verdict, "effect": lv.effect,
                                        "ci_low": lv.ci_low, "ci_high": lv.ci_high, "conf": lv.conf,
                                        "threshold": lv.threshold, "band": lv.band, "base_us": lv.base_us,
                                        "head_us": lv.head_us, "rounds": k.rounds, "experiment": k.ab_experiment,
                                        "reason": k.reason} for lv in k.levels]
                               or [{"kernel": k.kernel, "level": "", "label": "", "verdict": k.verdict,
                                    "kernel_verdict": k.verdict, "reason": k.reason}])  # fmt: skip
    return comp


def finish(store, comp: Comparison, exit_code: int, closeout: str) -> None:
    """Record how the comparison ended (its exit code and its close-out's path)."""
    comp.closeout = closeout
    store.finish_regression(comp.id, outcome=comp.outcome, exit_code=int(exit_code), gpu_s=comp.gpu_s,
                            wall_s=comp.wall_s, machine=comp.machine, closeout=closeout)  # fmt: skip


def _machine(store, backend, comp: Comparison) -> tuple[str, str | None]:
    for k in comp.kernels:
        for exp in (k.ab_experiment, k.aa_experiment):
            rows = store.samples(exp) if exp else []
            if rows and rows[0].get("device"):
                fp = store.device_fingerprint(rows[0]["device"])
                gpu = fp.get("gpu") or "unknown device"
                if backend.name == "replay":
                    return f"replay of samples recorded on {gpu} (no GPU measured)", rows[0]["device"]
                return f"{gpu} ({fp.get('sms', '?')} SMs, driver {fp.get('driver', '?')}, torch {fp.get('torch', '?')}, " \
                       f"triton {fp.get('triton', '?')})", rows[0]["device"]  # fmt: skip
    return backend.name, None


def _one(store, backend, job: _Job, comp: Comparison, gpu_budget: float, wall_budget: float, t0: float,
         say) -> KernelResult:  # fmt: skip
    """One kernel: the A/A of BASE, then the sequential A/B of HEAD against BASE with every rule."""
    from kinv.agent.tools.measure import noise, protocol, sequential
    from kinv.kernels.devices import get_device
    from kinv.kernels.launch_config import describe

    plan, s, k = job.setting.plan, job.setting.stats, job.adapter.name
    levels = plan.levels()
    env = dict(plan.environment)
    label = {lv.key: lv.label for lv in levels}
    res = KernelResult(k, job.differs, "undecided", "", setting_source=job.setting.source,
                       plan=job.setting.plan_path, base_config=describe(job.base_cfg),
                       head_config=describe(job.head_cfg),
                       snapshots={"base": job.base_path[0], "head": job.head_path[0]})  # fmt: skip
    spent_before = sum(x.gpu_s for x in comp.kernels)
    kt0 = time.time()

    def check_budget(*_a) -> None:
        exps = [e for e in (res.aa_experiment, res.ab_experiment) if e]
        gpu = spent_before + protocol.Ledger.of(store, exps).gpu_s
        if gpu > gpu_budget:
            raise BudgetSpent(f"the GPU budget ({gpu_budget:g} s) is spent ({gpu:.1f} s)")
        if time.time() - t0 > wall_budget:
            raise BudgetSpent(f"the wall budget ({wall_budget:g} s) is spent")

    # the A/A of BASE: its arms' offsets widen the A/B's intervals; a harness that does not reproduce BASE stops
    res.aa_experiment = store.new_experiment(kind="noise", variant=f"regress A/A of {comp.base.label}",
                                             backend=backend.name, config_json=json.dumps(job.base_cfg))  # fmt: skip
    say(f"{k}: A/A of BASE, {s.aa_arms} workers x {s.aa_rounds} rounds")
    stats_plan = plan.model_copy(update={"stats": s})
    try:
        acc, _ = protocol.run_aa(store, res.aa_experiment, backend, k, job.base_cfg, env, levels, s.aa_rounds,
                                 s.aa_arms, on_round=check_budget, pythonpath=job.base_path)  # fmt: skip
    except BudgetSpent as exc:
        return _stopped(store, res, levels, label, s, str(exc), kt0)
    bands = protocol.noise_bands(stats_plan, levels, acc)
    store.add_noise(res.aa_experiment, None, [b.__dict__ for b in bands])
    store.update_experiment(
        res.aa_experiment,
        status="done",
        rounds=s.aa_rounds,
        gpu_s=protocol.Ledger.of(store, [res.aa_experiment]).gpu_s,
        finished=time.time(),
    )
    try:
        for w in noise.check_aa(bands):
            say(f"{k}: warning: {w}")
    except KinvError as exc:  # HarnessBroken: two workers of BASE confidently apart
        res.verdict, res.reason = "failed", f"the A/A of BASE: {exc}"
        res.gpu_s = protocol.Ledger.of(store, [res.aa_experiment]).gpu_s
        return res
    band = {b.level: b for b in bands}
    # the sequential A/B of HEAD against BASE, every rule, each arm from its revision's snapshot
    thresholds = {lv.key: s.threshold_at(lv.label) for lv in levels}
    res.ab_experiment = store.new_experiment(kind="ab", variant=f"regress {comp.head.label} vs {comp.base.label}",
                                             backend=backend.name, config_json=json.dumps(job.head_cfg),
                                             base_config_hash=None)  # fmt: skip
    say(f"{k}: correctness gate on BASE and HEAD, then paired ABBA rounds (looks at "
        f"{', '.join(map(str, protocol.sequential_plan(s).look_rounds()))})")  # fmt: skip
    try:
        out = sequential.run(store, res.ab_experiment, backend, k, job.base_cfg, job.head_cfg, env=env, levels=levels,
                             thresholds=thresholds, seq=protocol.sequential_plan(s),
                             offset_sd={b.level: b.offset_sd for b in bands}, base_pythonpath=job.base_path,
                             var_pythonpath=job.head_path, names=("base", "head"),
                             matrix_fallback=get_device(plan.device).matrix_tflops, on_round=check_budget,
                             on_gate=lambda who: say(f"{k}: correctness gate: {'BASE' if who == 'baseline' else 'HEAD'}"))  # fmt: skip
    except BudgetSpent as exc:
        return _stopped(store, res, levels, label, s, str(exc), kt0, band)
    res.gpu_s = protocol.Ledger.of(store, [res.aa_experiment, res.ab_experiment]).gpu_s
    res.wall_s = time.time() - kt0
    res.skipped = list(out.skipped)
    res.rounds = out.rounds
    if out.kind is not None or out.void:
        why = out.reason
        head_broke = out.kind in ("incorrect", "crashed", "failed", "tampered") and not out.void and \
            not why.lower().startswith(("the base arm", "base "))  # fmt: skip
        res.verdict = "broken" if head_broke else "failed"
        res.reason = f"HEAD {out.verdict}: {why}" if head_broke else f"{out.verdict}: {why}"
        return res
    conf = out.result.conf_per_look
    for lv in levels:
        e = out.result.effects[lv.key]
        b = band.get(lv.key)
        base_us, head_us = out.result.samples.get(lv.key, ([], []))
        res.levels.append(LevelResult(lv.key, lv.label, e.verdict, e.effect, e.ci_low, e.ci_high, conf, e.threshold,
                                      b.band if b else None, b.offset_sd if b else None, _median(base_us),
                                      _median(head_us), e.n))  # fmt: skip
    res.resources = _resource_change(store, res)
    seen = {lv.verdict for lv in res.levels}
    res.verdict = next(v for v in ("regressed", "undecided", "improved", "equivalent") if v in seen)
    res.reason = f"{out.verdict} after {out.rounds} rounds: {out.reason}"
    return res


def _median(xs) -> float | None:
    import statistics

    return statistics.median(xs) if xs else None


def _stopped(store, res: KernelResult, levels, label, s: StatsSettings, why: str, kt0: float,
             band: dict | None = None) -> KernelResult:  # fmt: skip
    """A kernel whose A/A or A/B the budget stopped: every level undecided, with the interval the rounds so far
    support (at the last look's confidence: no level is decided on it)."""
    from kinv.agent.tools.measure import protocol, stats

    exps = [e for e in (res.aa_experiment, res.ab_experiment) if e]
    res.gpu_s = protocol.Ledger.of(store, exps).gpu_s
    res.wall_s = time.time() - kt0
    rounds = protocol.stored_rounds(store, res.ab_experiment, ["A", "B"]) if res.ab_experiment else {}
    res.rounds = len(rounds)
    seq = protocol.sequential_plan(s)
    conf = stats.look_confidence(seq, len(levels), 1)
    for lv in levels:
        pairs = [r[lv.key] for r in rounds.values() if lv.key in r]
        b = (band or {}).get(lv.key)
        lr = LevelResult(lv.key, lv.label, "undecided", threshold=s.threshold_at(lv.label),
                         band=b.band if b else None, offset_sd=b.offset_sd if b else None, n=len(pairs))  # fmt: skip
        if len(pairs) >= 2:
            e = stats.paired_effect([p[0] for p in pairs], [p[1] for p in pairs], lv.key, lr.threshold, conf=conf,
                                    offset_sd=lr.offset_sd or 0.0)  # fmt: skip
            lr.effect, lr.ci_low, lr.ci_high, lr.conf = e.effect, e.ci_low, e.ci_high, conf
            lr.base_us, lr.head_us = _median([p[0] for p in pairs]), _median([p[1] for p in pairs])
        res.levels.append(lr)
    res.verdict, res.reason = "undecided", f"stopped after {res.rounds} A/B rounds: {why} (--budget)"
    for exp in exps:
        if (store.experiment(exp) or {}).get("status") == "running":
            store.update_experiment(exp, status="done", verdict="undecided", reason=res.reason, finished=time.time())
    return res


def _resource_change(store, res: KernelResult) -> dict[str, str]:
    """``{level: "registers 96 -> 128, CTAs/SM 2 -> 1, waves 1.9 -> 3.8"}`` at every regressed level whose arms'
    compiled figures differ (a GPU's compiler, or a recording of it)."""
    exp = store.experiment(res.ab_experiment) or {}
    compiled = (json.loads(exp.get("resources") or "{}")).get("compiled") or {}
    out = {}
    for lv in res.levels:
        if lv.verdict != "regressed":
            continue
        arms = compiled.get(lv.level) or {}
        a, b = arms.get("base") or {}, arms.get("variant") or {}
        parts = [f"{name} {a.get(key)} -> {b.get(key)}" for key, name in
                 (("registers", "registers"), ("spills", "spills"), ("smem", "shared memory"),
                  ("ctas_per_sm", "CTAs/SM"), ("waves", "waves")) if a.get(key) != b.get(key)]  # fmt: skip
        if parts:
            out[lv.level] = ", ".join(parts)
    return out


# --------------------------------------------------------------------------- #
# history
# --------------------------------------------------------------------------- #
@dataclass
class Drift:
    """The sum of one level's point estimates over the stored comparisons beside their combined interval
    (independent comparisons: half-widths added in quadrature)."""

    level: str
    label: str
    n: int
    change: float  # expm1(sum of effects)
    ci_low: float
    ci_high: float


def history(store, kernel: str) -> tuple[list[dict], list[Drift]]:
    """Every stored verdict of ``kernel`` (oldest first) and each level's drift over them; NotFound (bad input)
    naming the kernels with a history when it has none."""
    from kinv.agent.errors import NotFound

    rows = store.regress_history(kernel)
    if not rows:
        have = store.regressed_kernels()
        raise NotFound(f"no kinv regress comparison of {kernel} is stored in {store.path}; "
                       + (f"kernels with one: {', '.join(have)}" if have else "none is stored yet"))  # fmt: skip
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r["level"] and r["effect"] is not None and r["ci_low"] is not None:
            by.setdefault(r["level"], []).append(r)
    drifts = []
    for level, rs in by.items():
        total = sum(r["effect"] for r in rs)
        half = math.sqrt(sum(((r["ci_high"] - r["ci_low"]) / 2.0) ** 2 for r in rs))
        drifts.append(Drift(level, rs[0]["label"], len(rs), math.expm1(total), math.expm1(total - half),
                            math.expm1(total + half)))  # fmt: skip
    return rows, drifts


__all__ = ["LEVEL_VERDICTS", "MARGINS_FILE", "OUTCOMES", "Comparison", "Drift", "KernelResult", "LevelResult",
           "Margins", "finish", "history", "prepare", "read_margins", "run", "setting_for"]  # fmt: skip
