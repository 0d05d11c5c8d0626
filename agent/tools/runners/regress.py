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
from dataclasses import dataclass
from pathlib import Path

from kinv.agent.errors import BudgetSpent
from kinv.agent.plan_sections import StatsSettings
from kinv.agent.tools.runners.regress_prepare import Comparison, KernelResult, LevelResult, Prepared, _Job
from kinv.kernels.errors import BadInput, KinvError, StepFailed


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


__all__ = ["Drift", "finish", "history", "run"]
