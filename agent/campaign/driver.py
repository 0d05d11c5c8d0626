"""The campaign's driver: ``run`` checks its input, takes the campaign's lock and drives the campaign's graph
(agent/campaign/flow.py); ``Campaign`` is what its nodes call: where the campaign stands (its row in kinv.db),
which backlog item is next, and its steps (screen.py, steps.py, finish.py).

A campaign resumes where it stopped: its graph from its checkpoint, routed on its row in kinv.db (the incumbent
and the steps); each workstream resumes from its own checkpoints, and a screening from its screened rows (the
Optuna study asks again what a kill left untold)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kinv.agent.campaign.finish import Ending
from kinv.agent.campaign.levels import per_level, with_params
from kinv.agent.campaign.results import FINAL, CampaignOutcome
from kinv.agent.campaign.screen import Screening
from kinv.agent.campaign.steps import Confirmation
from kinv.agent.errors import BackendError, CampaignError
from kinv.agent.fmt import kv
from kinv.agent.plan import Plan
from kinv.agent.plan_file import load_plan
from kinv.agent.store.db import Store
from kinv.kernels.errors import BadInput
from kinv.kernels.launch_config import config_hash, describe


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


def run(s: Settings) -> CampaignOutcome:
    """Run (or resume) the campaign; returns how its pass ended.  Raises :class:`BadInput` for input it cannot
    use (nothing created) and a :class:`StepFailed` for a campaign that cannot go on."""
    from kinv.agent.tools import backends
    from kinv.agent.tools.runners import bench
    from kinv.agent.workstream.graph import APPROVAL_POLICIES

    if s.approval not in APPROVAL_POLICIES:
        raise BadInput(f"--approval {s.approval!r} is not valid; use {', '.join(APPROVAL_POLICIES)}")
    if s.backend not in backends.BACKENDS:
        raise BadInput(f"--backend {s.backend!r} is not valid; use {', '.join(backends.BACKENDS)}")
    from kinv.agent.tools.runners.executor import EXECUTORS

    if s.executor not in EXECUTORS:
        raise BadInput(f"--executor {s.executor!r} is not valid; use {', '.join(EXECUTORS)}")
    if s.executor == "local" and (s.ray_address or s.ray_actors):
        raise BadInput("--ray-address and --ray-actors need --executor ray")
    if s.ray_actors is not None and not 1 <= s.ray_actors <= 1024:
        raise BadInput(f"--ray-actors {s.ray_actors} must be from 1 to 1024")
    plan, plan_hash = load_plan(s.plan_path)
    if plan.campaign is None:
        raise BadInput(f"{s.plan_path} has no campaign: section; run a workstream plan with kinv run, or add "
                       "campaign: (see plans/7-decode-ceiling.yaml)")
    try:  # a missing GPU (or recording) is bad input: said before anything is written
        bench.get_backend(s.backend, plan.kernel)
    except BackendError as exc:
        raise BadInput(str(exc).splitlines()[0]) from None
    store = Store(s.state_dir)
    cid = campaign_id(plan)
    # one driver per campaign: a second `kinv campaign` of it is refused (a StoreError, exit 1), naming the first
    store.acquire_lock(f"campaign:{cid}", os.getpid())
    from kinv.agent import signals

    restore_signals = signals.install()  # SIGTERM and SIGHUP end a campaign the way Ctrl-C does
    try:
        # a start after a kill: a patch the killed start left on disk (an adoption cut between its write and its
        # journal's "adopted", say) is reverted first, so the step it belonged to runs again from the baseline
        _restore_kernel_files(store, plan)
        return _run_locked(s, store, plan, plan_hash, cid)
    except KeyboardInterrupt as exc:  # outside a workstream's graph (screening, between steps): run_plan had none
        signals.handled()
        how = getattr(exc, "signame", "SIGINT")
        _restore_kernel_files(store, plan)
        store.upsert_campaign({"id": cid, "status": "interrupted"})
        store.event(None, "interrupted", f"campaign {cid}: {how}: stopped; every kernel file restored to its baseline")
        return CampaignOutcome("interrupted", f"interrupted ({how}): kernel files restored, campaign {cid} marked "
                               f"interrupted; continue with: kinv campaign {s.plan_path}")  # fmt: skip
    finally:
        restore_signals()
        store.release_lock(f"campaign:{cid}", os.getpid())


def _restore_kernel_files(store: Store, plan: Plan) -> None:
    """Revert any patch the campaign's workstreams left on disk, under the kernel's lock (a patch another live run
    holds is that run's own: it is left alone)."""
    from kinv.agent.errors import StoreError
    from kinv.agent.tools.files import configs

    lock = f"kernel:{plan.kernel}"
    try:
        store.acquire_lock(lock, os.getpid())
    except StoreError:
        return
    try:
        configs.recover(store)
    finally:
        store.release_lock(lock, os.getpid())


def _run_locked(s: Settings, store: Store, plan: Plan, plan_hash: str, cid: str) -> CampaignOutcome:

    row = store.campaign(cid)
    if row and row["plan_hash"] != plan_hash:
        raise BadInput(f"campaign {cid} was started from plan sha {row['plan_hash']}; {s.plan_path} now hashes "
                       f"{plan_hash}: restore the plan, or give the changed plan a new workstream id")
    if row and row["status"] == "done":
        return CampaignOutcome("done", f"campaign {cid} is done: {row['stop_reason']}", row.get("summary") or {})
    if row is None:
        start = {**plan.baseline, "kernel": plan.adapter.name}
        store.upsert_campaign({"id": cid, "plan_path": str(Path(s.plan_path).resolve()), "plan_hash": plan_hash,
                               "kernel": plan.adapter.name, "status": "running", "backend": s.backend,
                               "approval": s.approval, "start_config": start, "incumbent": start, "steps": [],
                               "stop_reason": "", "summary": {}})  # fmt: skip
    else:
        store.upsert_campaign({"id": cid, "status": "running", "backend": s.backend, "approval": s.approval})
    c = Campaign(store, plan, cid, s)
    from kinv.agent.campaign.flow import drive
    from kinv.agent.errors import ExecutorError

    try:
        end, line = drive(c)  # the campaign's graph: it ends at summarise, which saves the summary
    except (CampaignError, ExecutorError) as exc:
        store.upsert_campaign({"id": cid, "status": "stopped", "stop_reason": str(exc)})
        raise
    finally:
        c.close()
    return CampaignOutcome(end, line, store.campaign(cid)["summary"])




class Campaign(Screening, Confirmation, Ending):
    def __init__(self, store: Store, plan: Plan, cid: str, s: Settings):
        self.store, self.plan, self.cid, self.s = store, plan, cid, s
        self.t0 = time.time()
        self.dir = store.dir / "campaigns" / cid.lstrip("#")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.losses: list[str] = []  # Ray actors lost while this process ran the campaign
        self._be = None  # the backend, made on first use
        self._ex = None  # the executor, made on first use

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
        """The campaign's GPU seconds (its ledger: every sample taken, lost ones included) and samples stored."""
        from kinv.agent.tools.measure.protocol import Ledger

        led = Ledger.of(self.store, workstreams=self.ws_list())
        return led.gpu_s, led.kept

    def wall(self) -> float:
        """Seconds the campaign has spent running: its screenings and its workstreams' graph nodes (kinv.db's
        history), counted as a workstream's wall budget counts them: never the time paused for a person."""
        return self.store.campaign_wall_s(self.ws_list())

    # ---- where the campaign stands (the graph, agent/campaign/flow.py, routes on these) ----------
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
        if self._be is None:
            from kinv.agent.tools.runners import bench

            self._be = bench.get_backend(self.s.backend)
        return self._be

    def copy_gbps(self) -> float | None:

        try:
            return self.backend.copy_bandwidth()
        except BackendError:
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
        """The backlog items a search can run: tunables inside the space with a choice among them, or environment
        variables with values to try."""
        space = self.plan.search_space()
        return [i for i in self.plan.backlog
                if (i.tunables and set(i.tunables) <= set(space) and any(len(space[t]) > 1 for t in i.tunables))
                or i.env]  # fmt: skip

    def next_item(self):
        from kinv.agent.workstream import planner

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
        if item.env:  # an environment is screened in its own item: no other step tried it
            return None
        seen, by = set(), []
        for st in self.row["steps"]:
            if not st.get("exhaustive"):
                continue
            by.append(st["ws"])
            for cfg in [st["incumbent_before"], *(self.tried(st) if st.get("screen_exp") else st.get("tried", []))]:
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
        from kinv.agent.tools.measure import protocol

        st = self.plan.stats
        for step in self.row["steps"]:
            if not step.get("ws"):
                continue
            for e in self.store.experiments(step["ws"]):
                if e["kind"] == "noise" and e["status"] == "done":
                    aa = protocol.Ledger.of(self.store, [e["id"]]).gpu_s
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
        self.say(f"{ws}: {item.id} ({item.title}): screening {', '.join(item.tunables or item.env)}")

    def begin_final(self) -> None:
        steps = self.row["steps"]
        start, inc = self.row["start_config"], self.row["incumbent"]
        if config_hash(start) == config_hash(inc):
            found = "; ".join(f"{lv} with {kv(x['env'])} ({st['ws']})"
                              for st in steps if st.get("env_found") for lv, x in st["env_found"].items())  # fmt: skip
            note = ("no confirmed config win: nothing to adopt in the config file; the environment improved "
                    f"{found}: set it where the kernel runs" if found else "no confirmed win: nothing to adopt")
            steps.append({"item": FINAL, "ws": None, "phase": "done", "note": note})
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

    def _update_step(self, step: dict) -> None:
        steps = self.row["steps"]
        steps[-1] = step
        self.save(steps=steps)


    def _ensure_ws_row(self, ws: str, title: str) -> None:
        if self.store.workstream(ws) is None:
            self.store.upsert_workstream({"id": ws, "parent": self.cid, "parent_title":
                                          self.plan.workstream.parent_title, "title": title,
                                          "kernel": self.plan.kernel, "status": "open", "campaign": self.cid})  # fmt: skip
        else:
            self.store.update_workstream(ws, campaign=self.cid)

    @property
    def executor(self):
        if self._ex is None:
            from kinv.agent.tools.runners.executor import get_executor

            self._ex = get_executor(self.s.executor, self.s.backend, self.s.ray_address, self.s.ray_actors)
            if self._ex.name != "local":
                self.say(f"screening on {self._ex.width} Ray actors: {', '.join(self._ex.places)}")
        return self._ex

    def close(self) -> None:
        if self._ex is not None:
            self._ex.close()
            self._ex = None

