"""Autonomous campaigns: kinv writes and runs the next workstreams itself (``kinv campaign PLAN``).

A campaign plan is a workstream plan with a ``campaign:`` section (plans/7-decode-ceiling.yaml).  From the
plan's baseline, the campaign repeats, within its budget and under the approval policy:

1. **Pick** the top backlog item it can express as a search: an item with ``tunables`` inside the campaign's
   space (the plan's tunables).  The planner ranks the backlog on the evidence so far
   (agent.planner.recommend); items it cannot express (OEA, a kernel rewrite) stay recommendations.
2. **Screen** candidates proposed by Optuna (TPE, or an exhaustive grid when the item's space is smaller
   than the trial budget; studies live in ``<state>/optuna.db``).  A candidate varies the item's tunables
   and keeps the incumbent's other values at every level.  The resource model prunes infeasible ones
   before any GPU time; the rest get a few paired rounds against the incumbent at every level.
3. **Confirm** the finalists (the best screened candidate at each level) in a workstream of their own
   (#7a, #7b, ...): a plan file a person could have written, run through the same graph as ``kinv run``
   (noise, approvals, correctness, sequential A/B with agent/stats.py, close-out).  Its baseline is the
   incumbent, measured from the plan (``baseline_on_disk: false``): nothing is written to the live file.
4. **Adopt in the campaign** only what was confirmed: at each level, the finalist with the largest
   confirmed improvement there becomes the incumbent (a level-conditional config when levels differ).

It stops when the goal is met (a fraction of copy bandwidth, or of the bound the kernel's adapter names:
:meth:`KernelAdapter.roofline`), the budget is spent, the workstream cap is reached, or no expressible item
is left.  Then a last workstream measures the final config against the starting baseline (on disk, or from the plan with ``baseline_on_disk: false``; the
evidence for the change), and the campaign proposes it through the approval gate: with ``--approval
auto`` it is written as a journaled patch with a commit message citing every close-out; otherwise an
approval waits in ``kinv pending`` and the next ``kinv campaign PLAN`` writes it once approved.

A campaign resumes where it stopped: its row in kinv.db holds the incumbent and the steps, each
workstream resumes from its own checkpoints, and the Optuna studies keep their trials.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from kinv.agent.ids import state_flag
from kinv.agent.models import Plan, load_plan
from kinv.agent.store import Store
from kinv.kernels.errors import KinvError
from kinv.kernels.launch_config import config_hash, describe

STUDY_DB = "optuna.db"
FINAL = "final"


def _interval(ci) -> str:
    """A screened change's 95% interval as ``[low, high]``; nothing after a single round (it has none)."""
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f" [{ci[0]:+.1%}, {ci[1]:+.1%}]"


class CampaignError(KinvError, RuntimeError):
    """A campaign cannot go on; one line saying why."""


# --------------------------------------------------------------------------- #
# configs per level
# --------------------------------------------------------------------------- #
def _quiet_experimental():
    """Optuna marks multivariate TPE and constant_liar experimental; say so once in the docs, not per run."""
    import contextlib
    import warnings

    @contextlib.contextmanager
    def ctx():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*experimental feature.*")
            yield

    return ctx()


def uniform(adapter, config: dict) -> dict:
    """The config without its overrides (what runs where no override matches)."""
    return adapter.validate_config({k: v for k, v in config.items() if k not in ("overrides", "description")})


def per_level(plan: Plan, config: dict) -> dict[str, dict]:
    """level key -> the uniform config that runs there."""
    from kinv.agent.tools.space import effective

    return {lv.key: effective(plan.adapter, config, lv) for lv in plan.levels()}


def compose(plan: Plan, by_level: dict[str, dict]) -> dict:
    """One config that runs ``by_level[level]`` at each level: the most common choice as the base and an
    override for each run of neighbouring levels that differs, over ranges of the kernel's override dimension
    that cover the values between the levels too (b9-32 for the level b32 after b8)."""
    adapter = plan.adapter
    levels = plan.levels()
    hashes = {k: config_hash(c) for k, c in by_level.items()}
    if len(set(hashes.values())) == 1:
        return uniform(adapter, next(iter(by_level.values())))
    dims = [d for d in adapter.spec.override_dims
            if len({lv.dims.get(d) for lv in levels}) == len(levels)]  # fmt: skip
    if not dims:
        raise CampaignError(f"{adapter.name}'s overrides cannot tell these levels apart; set campaign.per_level: false")
    d = dims[0]
    order = sorted(levels, key=lambda lv: lv.dims[d])
    counts: dict[str, int] = {}
    for lv in order:
        counts[hashes[lv.key]] = counts.get(hashes[lv.key], 0) + 1
    # the config of the most levels is the base (a tie goes to the one of the largest level)
    base_hash = max(counts, key=lambda h: (counts[h], max(i for i, lv in enumerate(order) if hashes[lv.key] == h)))
    base = next(by_level[k] for k, h in hashes.items() if h == base_hash)
    overrides, i = [], 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and hashes[order[j + 1].key] == hashes[order[i].key]:
            j += 1
        h = hashes[order[i].key]
        if h != base_hash:
            cfg = by_level[order[i].key]
            ov = {}
            if i > 0:
                ov[f"{d}_min"] = order[i - 1].dims[d] + 1
            if j < len(order) - 1:
                ov[f"{d}_max"] = order[j].dims[d]
            ov.update({k: cfg[k] for k in adapter.spec.names if cfg[k] != base[k]})
            overrides.append(ov)
        i = j + 1
    out = adapter.validate_config({**uniform(adapter, base), "overrides": overrides})
    got = per_level(plan, out)
    assert all(config_hash(got[k]) == hashes[k] for k in hashes), "composed config does not resolve as chosen"
    return out


def with_params(plan: Plan, incumbent: dict, params: dict) -> dict:
    """The incumbent with ``params`` set at every level (its other tunables keep their per-level values)."""
    by = {k: {**c, **params} for k, c in per_level(plan, incumbent).items()}
    by = {k: plan.adapter.validate_config(c) for k, c in by.items()}
    return compose(plan, by)


def patch_of(adapter, config: dict) -> dict:
    """A variant patch that yields ``config`` whatever the baseline (every tunable, and its overrides)."""
    p = {k: config[k] for k in adapter.spec.names}
    if config.get("overrides"):
        p["overrides"] = config["overrides"]
    return p


# --------------------------------------------------------------------------- #
# the campaign
# --------------------------------------------------------------------------- #
@dataclass
class Settings:
    plan_path: str
    backend: str
    approval: str
    state_dir: str | None
    console: object
    progress: object = None
    executor: str = "local"
    ray_address: str | None = None
    ray_actors: int | None = None


def campaign_id(plan: Plan) -> str:
    return plan.workstream.parent or plan.ws.rstrip("abcdefghijklmnopqrstuvwxyz")


def ws_id(plan: Plan, n: int) -> str:
    """The n-th workstream of the campaign: #7a, #7b, ... (the plan names the first)."""
    first = plan.ws
    stem, letter = (first[:-1], first[-1]) if first[-1].isalpha() else (first, "a")
    k = ord(letter) - ord("a") + n
    if k > 25:
        raise CampaignError(f"campaign {campaign_id(plan)} has no workstream letter left after {first}")
    return f"{stem}{chr(ord('a') + k)}"


def run(s: Settings) -> tuple[int, str, dict]:
    """Run (or resume) the campaign; returns (exit code, last line, summary)."""
    from kinv.agent.investigation import APPROVAL_POLICIES, EXIT_BAD_INPUT, EXIT_FAIL
    from kinv.agent.tools import bench

    if s.approval not in APPROVAL_POLICIES:
        return EXIT_BAD_INPUT, f"--approval {s.approval!r} is not valid; use {', '.join(APPROVAL_POLICIES)}", {}
    if s.backend not in bench.BACKENDS:
        return EXIT_BAD_INPUT, f"--backend {s.backend!r} is not valid; use {', '.join(bench.BACKENDS)}", {}
    from kinv.agent.tools.executor import EXECUTORS

    if s.executor not in EXECUTORS:
        return EXIT_BAD_INPUT, f"--executor {s.executor!r} is not valid; use {', '.join(EXECUTORS)}", {}
    if s.executor == "local" and (s.ray_address or s.ray_actors):
        return EXIT_BAD_INPUT, "--ray-address and --ray-actors need --executor ray", {}
    if s.ray_actors is not None and not 1 <= s.ray_actors <= 1024:
        return EXIT_BAD_INPUT, f"--ray-actors {s.ray_actors} must be from 1 to 1024", {}
    plan, plan_hash = load_plan(s.plan_path)
    if plan.campaign is None:
        return EXIT_BAD_INPUT, (f"{s.plan_path} has no campaign: section; run a workstream plan with kinv run, or "
                                "add campaign: (see plans/7-decode-ceiling.yaml)"), {}  # fmt: skip
    try:  # a missing GPU (or recording) is bad input: said before anything is written
        bench.get_backend(s.backend)
    except bench.BackendError as exc:
        return EXIT_BAD_INPUT, str(exc).splitlines()[0], {}
    store = Store(s.state_dir)
    cid = campaign_id(plan)
    from kinv.agent.store import StoreError

    try:  # one driver per campaign: a second `kinv campaign` of it is refused, naming the first
        store.acquire_lock(f"campaign:{cid}", os.getpid())
    except StoreError as exc:
        return EXIT_FAIL, str(exc), {}
    from kinv.agent import signals
    from kinv.agent.investigation import EXIT_INTERRUPTED

    restore_signals = signals.install()  # SIGTERM and SIGHUP end a campaign the way Ctrl-C does
    try:
        return _run_locked(s, store, plan, plan_hash, cid)
    except KeyboardInterrupt as exc:  # outside a workstream's graph (screening, between steps): run_plan had none
        signals.handled()
        how = getattr(exc, "signame", "SIGINT")
        _restore_kernel_files(store, plan)
        store.upsert_campaign({"id": cid, "status": "interrupted"})
        store.event(None, "interrupted", f"campaign {cid}: {how}: stopped; every kernel file restored to its baseline")
        return EXIT_INTERRUPTED, (f"interrupted ({how}): kernel files restored, campaign {cid} marked interrupted; "
                                  f"continue with: kinv campaign {s.plan_path}"), {}  # fmt: skip
    finally:
        restore_signals()
        store.release_lock(f"campaign:{cid}", os.getpid())


def _restore_kernel_files(store: Store, plan: Plan) -> None:
    """Revert any patch the campaign's workstreams left on disk, under the kernel's lock (a patch another live run
    holds is that run's own: it is left alone)."""
    from kinv.agent.store import StoreError
    from kinv.agent.tools import configs

    lock = f"kernel:{plan.kernel}"
    try:
        store.acquire_lock(lock, os.getpid())
    except StoreError:
        return
    try:
        configs.recover(store)
    finally:
        store.release_lock(lock, os.getpid())


def _run_locked(s: Settings, store: Store, plan: Plan, plan_hash: str, cid: str) -> tuple[int, str, dict]:
    from kinv.agent.investigation import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_PAUSED

    row = store.campaign(cid)
    if row and row["plan_hash"] != plan_hash:
        return EXIT_BAD_INPUT, (f"campaign {cid} was started from plan sha {row['plan_hash']}; {s.plan_path} now "
                                f"hashes {plan_hash}: restore the plan, or give the changed plan a new workstream "
                                "id"), {}  # fmt: skip
    if row and row["status"] == "done":
        return EXIT_OK, f"campaign {cid} is done: {row['stop_reason']}", row.get("summary") or {}
    if row is None:
        start = {**plan.baseline, "kernel": plan.adapter.name}
        store.upsert_campaign({"id": cid, "plan_path": str(Path(s.plan_path).resolve()), "plan_hash": plan_hash,
                               "kernel": plan.adapter.name, "status": "running", "backend": s.backend,
                               "approval": s.approval, "start_config": start, "incumbent": start, "steps": [],
                               "stop_reason": "", "summary": {}})  # fmt: skip
    else:
        store.upsert_campaign({"id": cid, "status": "running", "backend": s.backend, "approval": s.approval})
    c = Campaign(store, plan, cid, s)
    from kinv.agent.tools.executor import ExecutorError

    try:
        code, line = c.go()
    except (CampaignError, ExecutorError) as exc:
        store.upsert_campaign({"id": cid, "status": "stopped", "stop_reason": str(exc)})
        return EXIT_FAIL, str(exc), {}
    finally:
        c.close()
    summary = c.summary()
    store.upsert_campaign({"id": cid, "summary": summary})
    if code in (EXIT_PAUSED, EXIT_INTERRUPTED):
        store.upsert_campaign({"id": cid, "status": "paused" if code == EXIT_PAUSED else "interrupted"})
    return code, line, summary


class Campaign:
    def __init__(self, store: Store, plan: Plan, cid: str, s: Settings):
        self.store, self.plan, self.cid, self.s = store, plan, cid, s
        self.t0 = time.time()
        self.dir = store.dir / "campaigns" / cid.lstrip("#")
        self.dir.mkdir(parents=True, exist_ok=True)

    # ---- state ------------------------------------------------------------------------------
    @property
    def row(self) -> dict:
        return self.store.campaign(self.cid)

    def save(self, **values) -> None:
        self.store.upsert_campaign({"id": self.cid, **values})

    def say(self, msg: str) -> None:
        self.store.event(None, "campaign", f"{self.cid}: {msg}")
        from rich.markup import escape

        self.s.console.print(f"[bold]{self.cid}[/bold] {escape(msg)}")

    def ws_list(self) -> list[str]:
        return [st["ws"] for st in self.row["steps"] if st.get("ws")]

    def spent(self) -> tuple[float, int]:
        return self.store.campaign_gpu_s(self.ws_list())

    def wall(self) -> float:
        """Seconds the campaign has spent running: its screenings and its workstreams' graph nodes (kinv.db's
        history), counted as a workstream's wall budget counts them: never the time paused for a person."""
        return self.store.campaign_wall_s(self.ws_list())

    # ---- the loop ---------------------------------------------------------------------------
    def go(self) -> tuple[int, str]:
        from kinv.agent.investigation import EXIT_OK

        while True:
            row = self.row
            steps = row["steps"]
            last = steps[-1] if steps else None
            if last and last["phase"] != "done":
                code, line = self.advance(last)
                if code != EXIT_OK:
                    return code, line
                continue
            if last and last.get("item") == FINAL:
                return self.finish(last)
            why = self.stop_reason()
            if why:
                self.save(stop_reason=why)
                self.say(f"stops: {why}")
                self.begin_final()
                continue
            self.begin_step()

    def stop_reason(self) -> str | None:
        row, c = self.row, self.plan.campaign
        steps = [s for s in row["steps"] if s.get("item") != FINAL]
        met = self.goal_met()
        if met:
            return met
        gpu, _ = self.spent()
        reserve = self.final_reserve()
        if gpu >= c.budget.gpu_seconds - reserve:
            return (f"GPU budget spent ({gpu:.1f} of {c.budget.gpu_seconds:.0f} s, {reserve:.1f} s of it kept for the "
                    "final A/B against the start)")  # fmt: skip
        if self.wall() >= c.budget.wall_seconds:
            return f"wall budget spent ({self.wall():.0f} of {c.budget.wall_seconds:.0f} s)"
        if len([s for s in steps if s.get("ws")]) >= c.max_workstreams:
            return f"{c.max_workstreams} workstreams run (campaign.max_workstreams)"
        if self.next_item() is None:
            tried = ", ".join(s["item"] for s in steps) or "none"
            return f"no backlog item left that kinv can express as a search (tried: {tried})"
        return None

    def goal_met(self) -> str | None:
        goal = self.plan.campaign.goal
        want = goal.fraction()
        if want is None:
            return None
        fr = self.roofline_fractions()
        labels = set(goal.levels) or {lv.label for lv in self.plan.levels()}
        at = {lv.label: fr.get(lv.key) for lv in self.plan.levels() if lv.label in labels}
        if at and all(v is not None and v >= want for v in at.values()):
            return f"goal met: >= {want:.0%} of {self.goal_bound()} at {', '.join(sorted(at))}"
        return None

    def goal_bound(self) -> str:
        """What the goal's fraction is of: copy bandwidth (``copy_fraction``), or the bound the kernel's adapter
        names at each goal level (``roofline_fraction``: copy bandwidth or the matrix peak)."""
        goal = self.plan.campaign.goal
        if goal.roofline_fraction is None:
            return "copy bandwidth"
        copy, peak = self.copy_gbps(), self.matrix_tflops()
        labels = set(goal.levels) or {lv.label for lv in self.plan.levels()}
        bounds = {r[1] for lv in self.plan.levels() if lv.label in labels
                  for r in [self.plan.adapter.roofline(lv, copy, peak)] if r}  # fmt: skip
        return {frozenset({"memory"}): "copy bandwidth", frozenset({"compute"}): "the matrix peak"}.get(
            frozenset(bounds), "the roofline (copy bandwidth or the matrix peak, by level)")

    def matrix_tflops(self) -> float | None:
        """The plan device's matrix-unit peak, where the goal is the kernel's roofline (None for copy_fraction)."""
        if self.plan.campaign.goal.roofline_fraction is None:
            return None
        from kinv.kernels.devices import get_device

        return get_device(self.plan.device).matrix_tflops

    def roofline_fractions(self) -> dict[str, float]:
        """level key -> the incumbent's latest confirmed median as a fraction of the fewest seconds the kernel's
        adapter allows there (:meth:`KernelAdapter.roofline`: copy bandwidth only for a ``copy_fraction`` goal)."""
        out = {}
        meas = self.incumbent_us()
        copy = self.copy_gbps()
        if not copy:
            return {}
        peak = self.matrix_tflops()
        for lv in self.plan.levels():
            us = meas.get(lv.key)
            roof = self.plan.adapter.roofline(lv, copy, peak) if us else None
            if roof:
                out[lv.key] = roof[0] / (us * 1e-6)
        return out

    @property
    def backend(self):
        """The campaign's backend, made once: a cuda backend measures copy bandwidth once, a replay one reads its
        recordings once (the loop asks for both at every step)."""
        if getattr(self, "_be", None) is None:
            from kinv.agent.tools import bench

            self._be = bench.get_backend(self.s.backend)
        return self._be

    def copy_gbps(self) -> float | None:
        from kinv.agent.tools import bench

        try:
            return self.backend.copy_bandwidth()
        except bench.BackendError:
            return None

    def incumbent_us(self) -> dict[str, float]:
        """level key -> the incumbent's median time in the latest workstream that measured it."""
        us: dict[str, float] = {}
        for st in self.row["steps"]:
            if st.get("phase") != "done" or not st.get("ws"):
                continue
            for lv, info in (st.get("levels") or {}).items():
                if info.get("us"):
                    us[lv] = info["us"]
        return us

    # ---- choosing the next item -------------------------------------------------------------
    def expressible(self) -> list:
        space = self.plan.search_space()
        return [i for i in self.plan.backlog if i.tunables and set(i.tunables) <= set(space)
                and any(len(space[t]) > 1 for t in i.tunables)]  # fmt: skip

    def next_item(self):
        from kinv.agent import planner

        done = {s["item"] for s in self.row["steps"]}
        ok = {i.id: i for i in self.expressible() if i.id not in done}
        if not ok:
            return None
        last = next((s for s in reversed(self.row["steps"]) if s.get("ws") and s.get("plan_path")), None)
        if last is None:
            ranked = sorted(self.plan.backlog, key=lambda i: -i.prior)
            return next(ok[i.id] for i in ranked if i.id in ok)
        ws_plan = load_plan(last["plan_path"])[0]
        results = {e["variant"]: {"verdict": e["verdict"]} for e in self.store.experiments(last["ws"])
                   if e["kind"] == "ab" and e["verdict"]}  # fmt: skip
        fr = self.roofline_fractions()
        headroom = 1 - max(fr.values()) if fr else None
        for r in planner.recommend(ws_plan, results, headroom, measured_by="the incumbent"):
            if r["id"] in ok:
                return ok[r["id"]]
        return next(iter(ok.values()))

    # ---- a step -----------------------------------------------------------------------------
    def covered(self, item) -> str | None:
        """Why ``item`` is moot, if it is: every config it would try around the incumbent, at every level, was
        already tried there by an exhaustive screening (timed, or pruned by the resource model)."""
        import itertools

        plan = self.plan
        seen, by = set(), []
        for st in self.row["steps"]:
            if not st.get("exhaustive"):
                continue
            by.append(st["ws"])
            for cfg in [st["incumbent_before"], *st.get("tried", [])]:
                seen |= {(k, config_hash(c)) for k, c in per_level(plan, cfg).items()}
        if not seen:
            return None
        space = plan.search_space()
        for values in itertools.product(*(space[t] for t in item.tunables)):
            cand = with_params(plan, self.row["incumbent"], dict(zip(item.tunables, values)))
            if any((k, config_hash(c)) not in seen for k, c in per_level(plan, cand).items()):
                return None
        return f"moot: every config it would try was already screened at every level in {', '.join(by)}"

    def final_reserve(self) -> float:
        """GPU seconds kept for the final A/B: the first A/A's cost plus one full-length A/B at that rate."""
        from kinv.agent.tools import protocol

        st = self.plan.stats
        for step in self.row["steps"]:
            if not step.get("ws"):
                continue
            for e in self.store.experiments(step["ws"]):
                if e["kind"] == "noise" and e["status"] == "done":
                    aa = protocol.gpu_seconds(self.store.samples(e["id"]))
                    return aa * (1 + 2 * st.max_rounds / (st.aa_rounds * st.aa_arms))
        return 0.0

    def begin_step(self) -> None:
        item = self.next_item()
        steps = self.row["steps"]
        moot = self.covered(item)
        if moot:
            steps.append({"item": item.id, "title": item.title, "ws": None, "phase": "done", "note": moot})
            self.save(steps=steps)
            self.say(f"{item.id} ({item.title}) {moot}")
            return
        ws = ws_id(self.plan, len([s for s in steps if s.get("ws")]))
        steps.append({"item": item.id, "title": item.title, "ws": ws, "phase": "screen",
                      "incumbent_before": self.row["incumbent"], "started": time.time()})  # fmt: skip
        self.save(steps=steps)
        self.say(f"{ws}: {item.id} ({item.title}): screening {', '.join(item.tunables)}")

    def begin_final(self) -> None:
        steps = self.row["steps"]
        start, inc = self.row["start_config"], self.row["incumbent"]
        if config_hash(start) == config_hash(inc):
            steps.append({"item": FINAL, "ws": None, "phase": "done", "note": "no confirmed win: nothing to adopt"})
            self.save(steps=steps)
            return
        ws = ws_id(self.plan, len([s for s in steps if s.get("ws")]))
        steps.append({"item": FINAL, "title": "the campaign's config against the starting baseline", "ws": ws,
                      "phase": "confirm", "incumbent_before": start, "finalists": [inc], "started": time.time()})  # fmt: skip
        self.save(steps=steps)
        path = self.write_plan(steps[-1], final=True)
        steps[-1]["plan_path"] = str(path)
        self.save(steps=steps)
        self.say(f"{ws}: the campaign's config {describe(inc)} against the starting baseline {describe(start)}")

    def advance(self, step: dict) -> tuple[int, str]:
        from kinv.agent.investigation import EXIT_OK

        if step["phase"] == "screen":
            self.screen(step)
            return EXIT_OK, ""
        if step["phase"] == "confirm":
            return self.confirm(step)
        raise CampaignError(f"step {step.get('ws')} is in an unknown phase {step['phase']!r}")

    def _update_step(self, step: dict) -> None:
        steps = self.row["steps"]
        steps[-1] = step
        self.save(steps=steps)

    # ---- screening --------------------------------------------------------------------------
    def screen(self, step: dict) -> None:
        """Screen the item's candidates: Optuna proposes them (every point of the item's space enqueued when it
        fits the trial budget, TPE batches otherwise), the resource model prunes, and each batch is timed in
        paired rounds against one incumbent worker: every arm of the batch at every level in every round."""
        import itertools

        import optuna
        from optuna.distributions import CategoricalDistribution
        from optuna.trial import TrialState

        from kinv.agent.tools.space import feasibility

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.losses = []
        plan, c = self.plan, self.plan.campaign
        item = next(i for i in plan.backlog if i.id == step["item"])
        space = {k: plan.search_space()[k] for k in item.tunables}
        dists = {k: CategoricalDistribution(v) for k, v in space.items()}
        incumbent = step["incumbent_before"]
        ws = step["ws"]
        self._ensure_ws_row(ws, item.title)
        be = self.backend
        levels = plan.levels()
        size = math.prod(len(v) for v in space.values())
        exhaustive = size <= c.screen.trials
        startup = size if exhaustive else max(2, c.screen.trials // 2)
        with _quiet_experimental():
            sampler = optuna.samplers.TPESampler(seed=c.seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=startup)  # fmt: skip
        study = optuna.create_study(study_name=f"{self.cid}-{ws}", storage=f"sqlite:///{self.store.dir / STUDY_DB}",
                                    directions=["maximize"] * (len(levels) if c.per_level else 1), sampler=sampler,
                                    load_if_exists=True)  # fmt: skip
        if exhaustive and not study.trials:
            for values in itertools.product(*space.values()):
                study.enqueue_trial(dict(zip(space, values)))
        requeued = int(study.user_attrs.get("requeued", 0))
        for t in study.trials:  # a killed screening left these asked and never told: ask them again
            if t.state == TrialState.RUNNING:
                study.enqueue_trial(dict(t.params))
                study.tell(t.number, state=TrialState.FAIL)
                requeued += 1
        study.set_user_attr("requeued", requeued)
        row = self.store.running_experiment(ws, f"{ws}.screen", "screen")
        exp = row["id"] if row else self.store.new_experiment(
            workstream=ws, todo=f"{ws}.screen", variant="screen", kind="screen", backend=be.name,
            config_hash=config_hash(incumbent), base_config_hash=config_hash(incumbent),
            config_json=json.dumps(incumbent))  # fmt: skip
        inc_levels = {k: config_hash(v) for k, v in per_level(plan, incumbent).items()}
        cache = {t.user_attrs["config_hash"]: t.values for t in study.trials
                 if t.state == TrialState.COMPLETE and "config_hash" in t.user_attrs}  # fmt: skip
        gpu = 0.0
        round0 = plan.stats.max_rounds  # the A/B's rounds are 0..max_rounds-1: screening never re-uses them
        batch = size if exhaustive else startup
        budget = (size if exhaustive else c.screen.trials) + requeued  # a re-asked trial does not use up the budget

        def finished() -> int:
            return len([t for t in study.get_trials(deepcopy=False) if t.state.is_finished()])

        while (done := finished()) < budget:
            asked, todo = [], []
            for _ in range(min(batch, budget - done)):
                t = study.ask(dists)
                cand = with_params(plan, incumbent, dict(t.params))
                h = config_hash(cand)
                for k, v in (("config_hash", h), ("config", describe(cand)), ("config_json", json.dumps(cand))):
                    t.set_user_attr(k, v)
                asked.append(t)
                if h in cache or h in {x[2] for x in todo}:
                    t.set_user_attr("duplicate", True)
                    continue
                ok, why = feasibility(plan, cand)
                if not ok:
                    t.set_user_attr("pruned", f"infeasible: {why}")
                    study.tell(t, state=TrialState.PRUNED)
                    continue
                if {k: config_hash(v) for k, v in per_level(plan, cand).items()} == inc_levels:
                    t.set_user_attr("gains", {lv.key: 0.0 for lv in levels})
                    cache[h] = [0.0] * len(study.directions)
                    continue
                todo.append((t, cand, h))
            gains, spent = self._measure_batch(be, exp, incumbent, todo, c.screen.rounds, round0)
            gpu += spent
            for t, _cand, h in todo:
                if h in gains:
                    t.set_user_attr("gains", gains[h])
                    vals = gains[h]
                    cache[h] = ([vals[lv.key] for lv in levels] if c.per_level else
                                [sum(vals.values()) / len(vals)])  # fmt: skip
            for t in asked:
                if t.number in {x.number for x in study.trials if x.state != TrialState.RUNNING}:
                    continue  # told above (pruned)
                h = t.user_attrs["config_hash"]
                if h in cache:
                    study.tell(t, cache[h])
                else:
                    study.tell(t, state=TrialState.FAIL)  # its worker failed on the GPU (the reason is stored)
            batch = max(2, c.screen.trials // 4)
        self.store.update_experiment(exp, status="done", gpu_s=gpu, finished=time.time(), rounds=c.screen.rounds)
        screened = self._screened(study)
        finalists = self._finalists(screened)
        pruned = [t.user_attrs.get("pruned") for t in study.trials if t.state == TrialState.PRUNED]
        failed = [t.user_attrs.get("failed") for t in study.trials if t.user_attrs.get("failed")]
        tried = [json.loads(t.user_attrs["config_json"]) for t in study.trials
                 if "config_json" in t.user_attrs and not t.user_attrs.get("failed")]  # fmt: skip
        step.update(screened=screened, pruned=len(pruned), tried=tried, pruned_why=sorted(set(p for p in pruned if p))[:4],
                    failed=failed[:4], finalists=[f["config_json"] for f in finalists],
                    sampler="every point enqueued (exhaustive)" if exhaustive else "TPE (multivariate)",
                    trials=len(study.trials), screen_exp=exp, exhaustive=exhaustive,
                    executor=self.executor.name, places=list(self.executor.places),
                    losses=list(getattr(self, "losses", [])))  # fmt: skip
        if not finalists:
            step.update(phase="done", note=f"no screened candidate beat the incumbent by {c.screen.min_gain:+.1%} "
                        "at any level: no workstream to confirm", levels={})  # fmt: skip
            self.say(f"{ws}: {len(screened)} candidates screened, none above {c.screen.min_gain:+.1%}: "
                     f"{item.id} closed without a confirmation workstream")  # fmt: skip
            self._update_step(step)
            self.store.update_workstream(ws, status="closed", closed=time.time(), recommendation=step["note"])
            return
        step["phase"] = "confirm"
        self._update_step(step)
        path = self.write_plan(step)
        step["plan_path"] = str(path)
        self._update_step(step)
        self.say(f"{ws}: {len(screened)} screened ({len(pruned)} pruned by the resource model), "
                 f"{len(finalists)} finalists: " + ", ".join(f["config"] for f in finalists))  # fmt: skip

    def _ensure_ws_row(self, ws: str, title: str) -> None:
        if self.store.workstream(ws) is None:
            self.store.upsert_workstream({"id": ws, "parent": self.cid, "parent_title":
                                          self.plan.workstream.parent_title, "title": title,
                                          "kernel": self.plan.kernel, "status": "open", "campaign": self.cid})  # fmt: skip
        else:
            self.store.update_workstream(ws, campaign=self.cid)

    @property
    def executor(self):
        if getattr(self, "_ex", None) is None:
            from kinv.agent.tools.executor import get_executor

            self._ex = get_executor(self.s.executor, self.s.backend, self.s.ray_address, self.s.ray_actors)
            if self._ex.name != "local":
                self.say(f"screening on {self._ex.width} Ray actors: {', '.join(self._ex.places)}")
        return self._ex

    def close(self) -> None:
        if getattr(self, "_ex", None) is not None:
            self._ex.close()
            self._ex = None

    def _measure_batch(self, be, exp, incumbent, todo, rounds, round0) -> tuple[dict[str, dict], float]:
        """Time a batch of candidates against the incumbent: split into one shard per executor place (each with
        its own incumbent worker: every paired comparison on one GPU), run, store every row here.  Returns
        ({config hash: {level: throughput change}}, GPU s).  A candidate whose worker fails is dropped (its
        trial fails, with the reason); a lost actor's shard re-runs and the loss is recorded."""
        from kinv.agent.tools.screening import IncumbentFailed

        if not todo:
            return {}, 0.0
        ex = self.executor
        n = max(1, min(ex.width, len(todo)))
        shards = [todo[i::n] for i in range(n)]
        jobs = [{"backend": self.s.backend, "kernel": self.plan.kernel, "env": dict(self.plan.environment),
                 "incumbent": incumbent, "candidates": {h: cand for _t, cand, h in shard},
                 "levels": [lv.to_dict() for lv in self.plan.levels()], "rounds": rounds, "round0": round0,
                 "exp": exp} for shard in shards]  # fmt: skip
        try:
            results, losses = ex.run(jobs)
        except IncumbentFailed as exc:
            raise CampaignError(str(exc)) from None
        for loss in losses:
            self.store.event(None, "executor-loss", f"{self.cid}: {loss}")
            self.say(loss)
        self.losses = getattr(self, "losses", []) + losses
        gains, gpu = {}, 0.0
        by_hash = {h: t for t, _c, h in todo}
        for res in results:
            device = self.store.device(res["fingerprint"]) if res["fingerprint"] else None
            self.store.add_samples([{**row, "device": device} for row in res["rows"]])
            gpu += res["gpu_s"]
            for h, g in res["gains"].items():
                gains[h] = g
                by_hash[h].set_user_attr("measured_on", res["where"])
                by_hash[h].set_user_attr("gain_ci", res.get("intervals", {}).get(h))
            for h, why in res["failed"].items():
                by_hash[h].set_user_attr("failed", why)
        return gains, gpu

    def _screened(self, study) -> list[dict]:
        import optuna

        out, seen = [], set()
        for t in study.trials:
            if t.state != optuna.trial.TrialState.COMPLETE or t.user_attrs.get("duplicate"):
                continue
            h = t.user_attrs["config_hash"]
            if h in seen or "gains" not in t.user_attrs:
                continue
            seen.add(h)
            out.append({"trial": t.number, "config": t.user_attrs["config"], "config_hash": h,
                        "config_json": json.loads(t.user_attrs["config_json"]), "gains": t.user_attrs["gains"],
                        "gain_ci": t.user_attrs.get("gain_ci"), "measured_on": t.user_attrs.get("measured_on")})  # fmt: skip
        return out

    def _finalists(self, screened: list[dict]) -> list[dict]:
        """The best screened candidate at each level (per_level), or the best on average; only gains above
        min_gain; at most screen.finalists, best first."""
        c = self.plan.campaign
        if not screened:
            return []
        picks: list[tuple[float, dict]] = []
        if c.per_level:
            for lv in self.plan.levels():
                best = max(screened, key=lambda s: s["gains"][lv.key])
                if best["gains"][lv.key] > c.screen.min_gain:
                    picks.append((best["gains"][lv.key], best))
        else:
            best = max(screened, key=lambda s: sum(s["gains"].values()))
            mean = sum(best["gains"].values()) / len(best["gains"])
            if mean > c.screen.min_gain:
                picks.append((mean, best))
        out, seen = [], set()
        for _g, s in sorted(picks, key=lambda p: -p[0]):
            if s["config_hash"] not in seen:
                seen.add(s["config_hash"])
                out.append(s)
        return out[: c.screen.finalists]

    # ---- the confirmation workstream ----------------------------------------------------------
    def write_plan(self, step: dict, final: bool = False) -> Path:
        """The workstream's plan file, written as a person would write it (``<state>/campaigns/<id>/``)."""
        import yaml

        plan, c = self.plan, self.plan.campaign
        adapter = plan.adapter
        base = {k: v for k, v in step["incumbent_before"].items() if k not in ("kernel", "description")}
        gpu, _ = self.spent()
        # the final A/B has the plan's own per-workstream budget; a search step what the campaign has left
        left_gpu = plan.budget.gpu_seconds if final else max(1.0, c.budget.gpu_seconds - gpu - self.final_reserve())
        variants, ids = [], []
        screened = {s["config_hash"]: s for s in step.get("screened", [])}
        for n, cfg in enumerate(step["finalists"], 1):
            s = screened.get(config_hash(cfg))
            labels = {lv.key: lv.label for lv in plan.levels()}
            where = (", ".join(f"{labels[k]} {g:+.1%}{_interval((s.get('gain_ci') or {}).get(k))}"
                               for k, g in s["gains"].items()) if s else "")  # fmt: skip
            variants.append({"id": f"V{n}", "title": describe(cfg)[:200],
                             "rationale": (f"screened against the incumbent in {c.screen.rounds} paired rounds: "
                                           f"{where}" if s else "the campaign's composed config: every level's "
                                           "confirmed winner"),
                             "patch": patch_of(adapter, cfg), "targets": self._targets(step)})  # fmt: skip
            ids.append(f"V{n}")
        if final:
            hyp = (f"The configs campaign {self.cid} confirmed step by step ({describe(step['finalists'][0])}) beat "
                   f"the starting baseline {describe(step['incumbent_before'])} at every level where a step "
                   "improved, and regress nowhere.")  # fmt: skip
            title = f"Campaign {self.cid}: its config against the starting baseline"
        else:
            item = next(i for i in plan.backlog if i.id == step["item"])
            hyp = (f"{item.rationale} Screening {', '.join(item.tunables)} around the incumbent "
                   f"{describe(step['incumbent_before'])} ({len(step.get('screened', []))} candidates, "
                   f"{c.screen.rounds} paired rounds each) ranked {', '.join(ids)} first; the full paired A/B "
                   "decides whether each improves on the incumbent.")  # fmt: skip
            title = f"{item.title} (campaign {self.cid})"
        done_items = {s["item"] for s in self.row["steps"]}
        data = {
            "workstream": {"id": step["ws"], "title": title[:200], "parent": self.cid,
                           "parent_title": plan.workstream.parent_title},
            "kernel": plan.kernel, "hypothesis": hyp, "device": plan.device,
            "workload": json.loads(json.dumps(plan.workload)), "environment": dict(plan.environment),
            "baseline": base, "baseline_on_disk": bool(final) and plan.baseline_on_disk, "variants": variants,
            "bounds": {k: list(v) for k, v in plan.bounds.items()},
            "stats": plan.stats.model_dump(), "budget": {"gpu_seconds": round(min(plan.budget.gpu_seconds, left_gpu), 1),
                                                        "wall_seconds": plan.budget.wall_seconds},
            "backlog": [i.model_dump() for i in plan.backlog if i.id not in done_items or not i.tunables],
        }  # fmt: skip
        path = self.dir / f"{step['ws'].lstrip('#')}.yaml"
        text = (f"# Written by kinv campaign {self.cid} (from {Path(self.s.plan_path).name}), step "
                f"{step['item']}.\n" + yaml.safe_dump(data, sort_keys=False, width=110))  # fmt: skip
        path.write_text(text)
        load_plan(path)  # a plan kinv cannot read again is a bug here, not later
        return path

    def _targets(self, step: dict) -> str | None:
        """The lever a step's variants pull: its backlog item's; for the final A/B (no item of its own), that of
        the first item whose step changed the incumbent (None when no step did)."""
        items = {i.id: i for i in self.plan.backlog}
        if step["item"] in items:
            return items[step["item"]].targets
        won = (s["item"] for s in self.row["steps"] if s.get("incumbent_after") and s["item"] in items
               and config_hash(s["incumbent_after"]) != config_hash(s["incumbent_before"]))  # fmt: skip
        return next((items[i].targets for i in won), None)

    def confirm(self, step: dict) -> tuple[int, str]:
        from kinv.agent.investigation import EXIT_OK, run_plan

        be = self.executor.measuring_backend() if self.executor.name == "ray" else None
        seen = len(be.losses) if be else 0
        code, line = run_plan(step["plan_path"], self.s.backend, self.s.approval, self.s.state_dir, self.s.console,
                              backend_obj=be)  # fmt: skip
        if be and be.losses[seen:]:  # the workstream recorded each loss as it happened (its close-out says so)
            self.losses = getattr(self, "losses", []) + be.losses[seen:]
            step["losses"] = list(step.get("losses") or []) + be.losses[seen:]
            self._update_step(step)
        self.store.update_workstream(step["ws"], campaign=self.cid)
        if code != EXIT_OK:
            if "; then kinv resume" in line:  # the campaign, not the lone workstream, is what goes on
                line = (line.split("; then kinv resume")[0]
                        + f"; then continue: kinv campaign {self.s.plan_path}{state_flag(self.s.state_dir)}")
            elif "; continue with: kinv resume" in line:  # interrupted inside the workstream's graph
                line = (line.split("; continue with: kinv resume")[0]
                        + f"; continue with: kinv campaign {self.s.plan_path}{state_flag(self.s.state_dir)}")
            return code, line
        ws = step["ws"]
        wrow = self.store.workstream(ws)
        ws_plan = load_plan(step["plan_path"])[0]
        by_level = per_level(self.plan, step["incumbent_before"])
        best: dict[str, tuple[float, str]] = {}
        levels: dict[str, dict] = {}
        results = {}
        for e in self.store.experiments(ws):
            if e["kind"] != "ab" or e["status"] != "done":
                continue
            results[e["variant"]] = e["verdict"]
            if e["verdict"] in ("void", "incorrect", "infeasible", "failed"):
                continue
            cfg = ws_plan.variant_config(ws_plan.variant(e["variant"]))
            cand = per_level(self.plan, cfg)
            for v in self.store.verdicts(e["id"]):
                lv = v["level"]
                if step["item"] == FINAL:  # the final config against the start: every level's change
                    levels[lv] = {"us": v["variant_us"], "by": e["variant"], "effect": math.expm1(v["effect"]),
                                  "ci": [math.expm1(v["ci_low"]), math.expm1(v["ci_high"])], "conf": v["conf"],
                                  "verdict": v["verdict"]}  # fmt: skip
                    continue
                levels.setdefault(lv, {"us": v["base_us"], "by": "incumbent"})
                if v["verdict"] == "improved" and v["effect"] > best.get(lv, (0.0, ""))[0]:
                    best[lv] = (v["effect"], e["variant"])
                    by_level[lv] = cand[lv]
                    levels[lv] = {"us": v["variant_us"], "by": e["variant"], "effect": math.expm1(v["effect"]),
                                  "ci": [math.expm1(v["ci_low"]), math.expm1(v["ci_high"])], "conf": v["conf"]}  # fmt: skip
        if step["item"] == FINAL:
            new = step["finalists"][0]
        elif self.plan.campaign.per_level:
            new = compose(self.plan, by_level)
        else:
            new = self._best_uniform(step, results, ws)
        from kinv.agent import planner

        for t in self.store.todos(ws):  # a mixed verdict's level-conditional follow-up is what the campaign does
            if t["status"] == "pending" and t["id"].endswith("-cond"):
                planner.finish(self.store, ws, t["id"].split(".", 1)[1], "completed",
                               f"taken up by campaign {self.cid}: the incumbent per level is {describe(new)}")  # fmt: skip
        step.update(phase="done", verdicts=results, levels=levels, closeout=wrow.get("report_path"),
                    incumbent_after=new, finished=time.time())  # fmt: skip
        self._update_step(step)
        if step["item"] != FINAL:
            changed = config_hash(new) != config_hash(step["incumbent_before"])
            self.save(incumbent=new)
            self.say(f"{ws} closed: " + ", ".join(f"{k} {v}" for k, v in results.items()) +
                     (f"; incumbent now {describe(new)}" if changed else "; the incumbent stays"))  # fmt: skip
        return EXIT_OK, line

    def _best_uniform(self, step, results, ws) -> dict:
        """per_level: false: the accepted finalist with the largest mean effect, else the incumbent."""
        best, best_eff = step["incumbent_before"], 0.0
        ws_plan = load_plan(step["plan_path"])[0]
        for e in self.store.experiments(ws):
            if e["kind"] == "ab" and e["verdict"] == "accept":
                vs = self.store.verdicts(e["id"])
                eff = sum(v["effect"] for v in vs) / max(1, len(vs))
                if eff > best_eff:
                    best, best_eff = ws_plan.variant_config(ws_plan.variant(e["variant"])), eff
        return best

    # ---- the end ------------------------------------------------------------------------------
    def finish(self, last: dict) -> tuple[int, str]:
        """Propose the final config through the approval gate (auto: write it as a journaled patch)."""
        from kinv.agent.investigation import EXIT_OK, EXIT_PAUSED

        row = self.row
        why = row["stop_reason"] or "done"
        if not last.get("ws"):
            self.save(status="done")
            return EXIT_OK, f"campaign {self.cid} done ({why}); {last.get('note', '')}"
        ws = last["ws"]
        verdict = (last.get("verdicts") or {}).get("V1")
        if verdict not in ("accept", "mixed"):
            last["adoption"] = f"not proposed: the final A/B against the starting baseline says {verdict}"
            self._update_step(last)
            self.save(status="done")
            return EXIT_OK, f"campaign {self.cid} done ({why}); {last['adoption']}"
        if last.get("adopted"):
            self.save(status="done")
            return EXIT_OK, f"campaign {self.cid} done ({why}); adopted: {last['adopted']}"
        aid = f"{self.cid.lstrip('#')}-adopt"
        appr = self.store.approval(aid)
        if appr is not None and appr["status"] == "rejected":  # a person's no stands, whatever the policy now
            last["adoption"] = f"rejected by a person ({appr.get('reason') or 'no reason given'})"
            self._update_step(last)
            self.save(status="done")
            return EXIT_OK, (f"campaign {self.cid} done ({why}); adoption {last['adoption']}: the recorded rejection "
                             f"of {aid} stands under --approval {self.s.approval}")  # fmt: skip
        from kinv.agent.investigation import EXIT_BAD_INPUT
        from kinv.agent.tools.adopt import AdoptError, NoGain

        try:
            a = self.adoption(ws)  # measured against the live file it would replace, first
        except NoGain as exc:
            last["adoption"] = f"not proposed: {exc}"
            self._update_step(last)
            self.save(status="done")
            return EXIT_OK, f"campaign {self.cid} done ({why}); {last['adoption']}"
        except AdoptError as exc:  # e.g. no replay recording of the pair: nothing written, run it again elsewhere
            self.save(status="paused")
            return EXIT_BAD_INPUT, str(exc)
        if self.s.approval != "auto" and appr is None:
            self.store.add_approval(id=aid, workstream=ws, todo=f"{ws}.adopt", variant="V1", kind="adopt",
                                    diff=a.diff, hypothesis=a.message, resources="{}")  # fmt: skip
            appr = self.store.approval(aid)
        if self.s.approval != "auto" and appr["status"] == "pending":
            self.s.console.print(a.diff, markup=False, highlight=False)
            self.s.console.print(a.message, markup=False, highlight=False)
            self.save(status="paused")
            sd = state_flag(self.s.state_dir)
            return EXIT_PAUSED, (f"campaign {self.cid} proposes {describe(a.new_config)}: approve it with kinv approve "
                                 f"{aid}{sd} (or kinv reject {aid} --reason ...{sd}), then run kinv campaign "
                                 f"{self.s.plan_path}{sd} again")  # fmt: skip
        if self.s.approval != "auto" and appr["status"] != "approved":
            last["adoption"] = f"rejected by a person ({appr.get('reason') or 'no reason given'})"
            self._update_step(last)
            self.save(status="done")
            return EXIT_OK, f"campaign {self.cid} done ({why}); adoption {last['adoption']}"
        if appr is not None and appr["status"] == "pending":  # --approval auto decides it: none is left pending
            self.store.decide_approval(aid, "approved", "decided by --approval auto (kinv campaign)")
            self.store.event(ws, "approval", f"{aid} approved: decided by --approval auto (kinv campaign)")
        done = self.write_adoption(a)
        last["adopted"] = f"{describe(a.new_config)} into {done['path']} (patch #{done['patch']})"
        last["commit_message"] = done["message_file"]
        self._update_step(last)
        self.save(status="done")
        rec = f" {done['recording']}" if done.get("recording") else ""
        return EXIT_OK, (f"campaign {self.cid} done ({why}); adopted {last['adopted']}; commit it: git commit -F "
                         f"{done['message_file']} {done['path']}{rec}")  # fmt: skip

    def adoption(self, ws: str):
        from kinv.agent.tools import adopt

        # compared with the live file it replaces (a confirming A/B when the final one ran against another
        # baseline), and written only at the levels where it improved on that file
        say = getattr(self.s.console, "print", None)
        a = adopt.prepare(self.store, ws, "V1", backend=self.s.backend,
                          progress=(lambda m: say(m, markup=False)) if say else None)  # fmt: skip
        lines = [a.message.rstrip("\n"), "", f"Campaign {self.cid} ({Path(self.s.plan_path).name}): the chain of "
                 "close-outs behind it:"]  # fmt: skip
        for st in self.row["steps"]:
            if st.get("ws"):
                lines.append(f"  {st['ws']} {st['item']}: {st.get('closeout') or st.get('note') or '(no close-out)'}")
        a.message = "\n".join(lines) + "\n"
        return a

    def write_adoption(self, a) -> dict:
        from kinv.agent.tools import adopt, configs

        lock = f"kernel:{self.plan.kernel}"
        self.store.acquire_lock(lock, os.getpid())
        try:
            with configs.ConfigFileLock(a.path, self.store.dir):
                return adopt.apply(self.store, a)
        finally:
            self.store.release_lock(lock, os.getpid())

    # ---- the summary ----------------------------------------------------------------------------
    def summary(self) -> dict:
        row = self.row
        plan = self.plan
        gpu, n = self.spent()
        final = next((s for s in row["steps"] if s.get("item") == FINAL and s.get("ws")), None)
        chosen = per_level(plan, row["incumbent"])
        per = {}
        for lv in plan.levels():
            info = (final or {}).get("levels", {}).get(lv.key, {}) if final and final.get("phase") == "done" else {}
            # a level the final A/B never measured has no change: None, never 0.0
            per[lv.label] = {"level": lv.key, "config": describe(chosen[lv.key]), "change_vs_start": info.get("effect"),
                             "ci": info.get("ci"), "conf": info.get("conf"),
                             "measured": "effect" in info}  # fmt: skip
        return {
            "campaign": self.cid, "plan": row["plan_path"], "status": row["status"], "backend": row["backend"],
            "start_config": describe(row["start_config"]), "config": describe(row["incumbent"]),
            "config_json": row["incumbent"], "levels": per,
            "workstreams": [{"ws": s.get("ws"), "item": s["item"], "phase": s["phase"],
                             "finalists": [describe(f) for f in s.get("finalists", [])],
                             "screened": len(s.get("screened", [])), "pruned": s.get("pruned", 0),
                             "sampler": s.get("sampler"), "trials": s.get("trials"),
                             "executor": s.get("executor"), "places": s.get("places"), "losses": s.get("losses"),
                             "measured_on": sorted({x.get("measured_on") or "" for x in s.get("screened", [])} - {""}),
                             "verdicts": s.get("verdicts", {}), "closeout": s.get("closeout"),
                             "note": s.get("note")} for s in row["steps"]],  # fmt: skip
            "gpu_seconds": round(gpu, 3), "samples": n, "wall_seconds": round(self.wall(), 1),
            "stop_reason": row["stop_reason"], "adopted": (final or {}).get("adopted"),
            "adoption": (final or {}).get("adoption"),
            "incumbent_us": self.incumbent_us(), "roofline_fraction": self.roofline_fractions(),
            "roofline": self.goal_bound(),
            "recommendation": (self.store.workstream(final["ws"]) or {}).get("recommendation") if final else None,
            "beyond_reach": [{"id": i.id, "title": i.title, "targets": i.targets} for i in plan.backlog
                             if not i.tunables],  # fmt: skip
        }
