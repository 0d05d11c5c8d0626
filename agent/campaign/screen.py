"""A campaign step's screening: the search proposes candidates, the resource model prunes, and each batch is
timed in paired rounds against one incumbent worker (every arm of the batch at every level in every round).
Every candidate's outcome is a row of kinv.db's screened table; the study is told what that row says."""

from __future__ import annotations

import json
import time

from kinv.agent.campaign.levels import per_level, with_params
from kinv.agent.campaign.results import STUDY_DB
from kinv.agent.campaign.search import open_search
from kinv.agent.errors import CampaignError
from kinv.agent.fmt import signed
from kinv.agent.store.screened import Screened
from kinv.agent.tools.measure.protocol import Ledger
from kinv.kernels.launch_config import config_hash, describe


class Screening:
    """The screening step of a Campaign (a mixin: it uses the campaign's store, plan, executor and steps)."""

    def screen(self, step: dict) -> None:
        from kinv.agent.tools.runners.space import feasibility

        self.losses = []  # this screening's lost actors (its step records them)
        plan, c = self.plan, self.plan.campaign
        item = next(i for i in plan.backlog if i.id == step["item"])
        # an item over environment variables screens their values around the incumbent config: each candidate is
        # the incumbent with the values under "env" (screen_shard opens its arm in the plan's environment plus them)
        space = {k: list(item.env[k]) for k in item.env} if item.env else {k: plan.search_space()[k] for k in item.tunables}
        incumbent, ws = step["incumbent_before"], step["ws"]
        self._ensure_ws_row(ws, item.title)
        be = self.backend
        levels = plan.levels()
        search = open_search(self.store.dir / STUDY_DB, f"{self.cid}-{ws}", space, c.screen.trials, c.seed,
                             len(levels) if c.per_level else 1)  # fmt: skip
        row = self.store.running_experiment(ws, f"{ws}.screen", "screen")
        exp = row["id"] if row else self.store.new_experiment(
            workstream=ws, todo=f"{ws}.screen", variant="screen", kind="screen", backend=be.name,
            config_hash=config_hash(incumbent), base_config_hash=config_hash(incumbent),
            config_json=json.dumps(incumbent))  # fmt: skip
        inc_levels = {k: config_hash(v) for k, v in per_level(plan, incumbent).items()}

        def objective(gains: dict) -> list[float]:
            return [gains[lv.key] for lv in levels] if c.per_level else [sum(gains.values()) / len(gains)]

        # what a killed screening measured already is kinv.db's: told again, never timed again
        known = {r.config_hash: objective(r.gains) for r in self.store.screened(exp)
                 if r.status in ("measured", "incumbent")}  # fmt: skip
        first = True
        round0 = plan.stats.max_rounds  # the A/B's rounds are 0..max_rounds-1: screening never re-uses them
        while search.finished() < search.budget:
            asked, todo = [], []
            for _ in range(search.batch(first)):
                t = search.ask()
                cand = ({**incumbent, "env": dict(t.params)} if item.env
                        else with_params(plan, incumbent, dict(t.params)))  # fmt: skip
                h = config_hash(cand)
                self.store.screen_asked(exp, h, t.number, describe(cand), json.dumps(cand))
                asked.append((t, h))
                if h in known or h in {x[2] for x in todo}:
                    continue  # a duplicate: told what its first ask measured
                if item.env:
                    if all(plan.environment.get(k) == v for k, v in cand["env"].items()):
                        self.store.screen_result(exp, h, "incumbent", gains={lv.key: 0.0 for lv in levels})
                        known[h] = [0.0] * search.n_objectives
                    else:
                        todo.append((t, cand, h))
                    continue
                ok, why = feasibility(plan, cand)
                if not ok:
                    self.store.screen_result(exp, h, "pruned", reason=f"infeasible: {why}")
                    search.prune(t)
                    continue
                if {k: config_hash(v) for k, v in per_level(plan, cand).items()} == inc_levels:
                    self.store.screen_result(exp, h, "incumbent", gains={lv.key: 0.0 for lv in levels})
                    known[h] = [0.0] * search.n_objectives
                    continue
                todo.append((t, cand, h))
            self._measure_batch(exp, incumbent, todo, c.screen.rounds, round0)
            for r in self.store.screened(exp):
                if r.status == "measured" and r.config_hash not in known:
                    known[r.config_hash] = objective(r.gains)
            for t, h in asked:
                if search.is_told(t.number):
                    continue  # told above (pruned)
                if h in known:
                    search.tell(t, known[h])
                else:
                    search.fail(t)  # its worker failed on the GPU (the reason is stored)
            first = False
        ledger = Ledger.of(self.store, [exp])  # every batch's, a killed screening's before it included
        self.store.update_experiment(exp, status="done", gpu_s=ledger.gpu_s, finished=time.time(),
                                     rounds=c.screen.rounds)  # fmt: skip
        rows = self.store.screened(exp)
        screened = [r for r in rows if r.status in ("measured", "incumbent")]
        finalists = self._finalists(screened)
        pruned = [r for r in rows if r.status == "pruned"]
        failed = [r.reason for r in rows if r.status == "failed"]
        n_pruned = sum(r.asked for r in pruned)
        step.update(screened=len(screened), pruned=n_pruned,
                    pruned_why=sorted({r.reason for r in pruned if r.reason})[:4],
                    failed=failed[:4],
                    finalists=[f.config_json for f in finalists], sampler=search.label,
                    trials=len(search.study.trials), screen_exp=exp, exhaustive=search.exhaustive,
                    executor=self.executor.name, places=list(self.executor.places), losses=list(self.losses))  # fmt: skip
        if not finalists and failed and len(screened) <= 1:  # only the incumbent was timed: nothing was compared
            step.update(phase="done", levels={}, note=f"{len(failed)} candidates could not be measured here (the "
                        f"first: {failed[0]}): no workstream to confirm")  # fmt: skip
            self.say(f"{ws}: {item.id}: {step['note']}")
            self._update_step(step)
            self.store.update_workstream(ws, status="closed", closed=time.time(), recommendation=step["note"])
            return
        if not finalists:
            step.update(phase="done", note=f"no screened candidate beat the incumbent by {signed(c.screen.min_gain, 1)} "
                        "at any level: no workstream to confirm", levels={})  # fmt: skip
            self.say(f"{ws}: {len(screened)} candidates screened, none above {signed(c.screen.min_gain, 1)}: "
                     f"{item.id} closed without a confirmation workstream")  # fmt: skip
            self._update_step(step)
            self.store.update_workstream(ws, status="closed", closed=time.time(), recommendation=step["note"])
            return
        step["phase"] = "confirm"
        self._update_step(step)
        path = self.write_plan(step)
        step["plan_path"] = str(path)
        self._update_step(step)
        self.say(f"{ws}: {len(screened)} screened ({n_pruned} pruned by the resource model), "
                 f"{len(finalists)} finalists: " + ", ".join(f.config for f in finalists))  # fmt: skip

    def screened(self, step: dict) -> list[Screened]:
        """The step's screened candidates (kinv.db's screened table), in the order first asked."""
        if not step.get("screen_exp"):
            return []
        return [r for r in self.store.screened(step["screen_exp"]) if r.status in ("measured", "incumbent")]

    def tried(self, step: dict) -> list[dict]:
        """Every config the step's screening asked for and did not lose to a failure (timed or pruned)."""
        if not step.get("screen_exp"):
            return []
        return [r.config_json for r in self.store.screened(step["screen_exp"]) if r.status != "failed"]

    def _measure_batch(self, exp, incumbent, todo, rounds, round0) -> None:
        """Time a batch of candidates against the incumbent: split into one shard per executor place (each with
        its own incumbent worker: every paired comparison on one GPU), run, store every row, every lost sample
        (its GPU seconds in the ledger) and every candidate's outcome here.  A candidate whose worker fails is
        recorded failed (with the reason); a lost actor's shard re-runs and the loss is recorded."""
        from kinv.agent.errors import IncumbentFailed

        if not todo:
            return
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
        self.losses += losses
        ws = self.store.experiment(exp)["workstream"]
        for shard in results:
            device = self.store.device(shard.fingerprint) if shard.fingerprint else None
            self.store.add_samples([{**row, "device": device} for row in shard.rows])
            for ev in shard.lost:
                self.store.event(ws, "sample.lost", f"round {ev['round']}: {ev['why']}",
                                 {k: v for k, v in ev.items() if k != "why"})  # fmt: skip
            for s in shard.screened:
                self.store.screen_result(exp, s)

    def _finalists(self, screened: list[Screened]) -> list[Screened]:
        """The best screened candidate at each level (per_level), or the best on average; only gains above
        min_gain; at most screen.finalists, best first."""
        c = self.plan.campaign
        if not screened:
            return []
        picks: list[tuple[float, Screened]] = []
        if c.per_level:
            for lv in self.plan.levels():
                best = max(screened, key=lambda s: s.gains[lv.key])
                if best.gains[lv.key] > c.screen.min_gain:
                    picks.append((best.gains[lv.key], best))
        else:
            best = max(screened, key=lambda s: sum(s.gains.values()))
            mean = sum(best.gains.values()) / len(best.gains)
            if mean > c.screen.min_gain:
                picks.append((mean, best))
        out, seen = [], set()
        for _g, s in sorted(picks, key=lambda p: -p[0]):
            if s.config_hash not in seen:
                seen.add(s.config_hash)
                out.append(s)
        return out[: c.screen.finalists]
