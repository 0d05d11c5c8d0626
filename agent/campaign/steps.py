"""A campaign step's confirmation workstream: the plan file it writes (one a person could have written) and
what the campaign takes from the closed workstream (a typed result read from kinv.db)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kinv.agent.campaign.levels import compose, patch_of, per_level
from kinv.agent.campaign.results import FINAL, CampaignEnd, best_accepted, read_workstream
from kinv.agent.fmt import interval, kv, signed
from kinv.agent.plan_file import load_plan
from kinv.kernels.launch_config import config_hash, describe


def _interval(ci) -> str:
    """A screened change's 95% interval as ``[low, high]``; nothing after a single round (it has none)."""
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f" {interval(ci[0], ci[1], 1)}"


class Confirmation:
    """The confirmation step of a Campaign (a mixin: it uses the campaign's store, plan, settings and steps)."""

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
        screened = {s.config_hash: s for s in self.screened(step)}
        labels = {lv.key: lv.label for lv in plan.levels()}
        for n, cfg in enumerate(step["finalists"], 1):
            s = screened.get(config_hash(cfg))
            where = (", ".join(f"{labels[k]} {signed(g, 1)}{_interval((s.gain_ci or {}).get(k))}"
                               for k, g in s.gains.items()) if s else "")  # fmt: skip
            env = cfg.get("env") or {}  # a candidate over environment variables: the incumbent config in its env
            variants.append({"id": f"V{n}", "title": describe(cfg)[:200],
                             "rationale": (f"screened against the incumbent in {c.screen.rounds} paired rounds: "
                                           f"{where}" if s else "the campaign's composed config: every level's "
                                           "confirmed winner"),
                             **({"env": dict(env)} if env else {"patch": patch_of(adapter, cfg)}),
                             "targets": self._targets(step)})  # fmt: skip
            ids.append(f"V{n}")
        if final:
            hyp = (f"The configs campaign {self.cid} confirmed step by step ({describe(step['finalists'][0])}) beat "
                   f"the starting baseline {describe(step['incumbent_before'])} at every level where a step "
                   "improved, and regress nowhere.")  # fmt: skip
            title = f"Campaign {self.cid}: its config against the starting baseline"
        else:
            item = next(i for i in plan.backlog if i.id == step["item"])
            hyp = (f"{item.rationale} Screening {', '.join(item.tunables or item.env)} around the incumbent "
                   f"{describe(step['incumbent_before'])} ({len(screened)} candidates, "
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
            "allowed": plan.allowed_values(),
            "stats": plan.stats.model_dump(), "budget": {"gpu_seconds": round(min(plan.budget.gpu_seconds, left_gpu), 1),
                                                        "wall_seconds": plan.budget.wall_seconds},
            "backlog": [i.model_dump() for i in plan.backlog
                        if i.id not in done_items or not i.searchable],
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

    def confirm(self, step: dict) -> tuple[CampaignEnd, str]:
        """Run the step's workstream through the graph (``kinv run``'s); once it is closed, adopt in the campaign
        what it confirmed.  A pause or an interrupt comes back as the workstream said it, whose continue hint
        names the campaign (agent.ids.continue_command)."""
        from kinv.agent.workstream.investigation import run_plan
        from kinv.kernels.errors import BadInput, KinvError

        be = self.executor.measuring_backend() if self.executor.name == "ray" else None
        seen = len(be.losses) if be else 0
        try:
            out = run_plan(step["plan_path"], self.s.backend, self.s.approval, self.s.state_dir, self.s.console,
                           backend_obj=be)  # fmt: skip
            end, line = ("done" if out.closed else out.end), out.message
        except KinvError as exc:  # a workstream that failed (or refused) ends the campaign with its line
            end = "refused" if isinstance(exc, BadInput) else "failed"
            line = (str(exc).splitlines() or [type(exc).__name__])[0]
        if be and be.losses[seen:]:  # the workstream recorded each loss as it happened (its close-out says so)
            self.losses += be.losses[seen:]
            step["losses"] = list(step.get("losses") or []) + be.losses[seen:]
            self._update_step(step)
        self.store.update_workstream(step["ws"], campaign=self.cid)
        if end != "done":
            return end, line
        ws = step["ws"]
        final = step["item"] == FINAL
        res = read_workstream(self.store, ws, final)
        ws_plan = load_plan(step["plan_path"])[0]

        def config_of(vid: str) -> dict:
            return ws_plan.variant_config(ws_plan.variant(vid))

        item = next((i for i in self.plan.backlog if i.id == step["item"]), None)
        if final:
            new = step["finalists"][0]
        elif item is not None and item.env:  # the config stays; what the environment did is the step's finding
            new = step["incumbent_before"]
            step["env_found"] = {lv: {"variant": vid, "env": ws_plan.variant(vid).env}
                                 for lv, vid in res.winners.items()}  # fmt: skip
        elif self.plan.campaign.per_level:
            by_level = per_level(self.plan, step["incumbent_before"])
            for lv, vid in res.winners.items():
                by_level[lv] = per_level(self.plan, config_of(vid))[lv]
            new = compose(self.plan, by_level)
        else:  # one config everywhere: the accepted finalist with the largest mean effect, else the incumbent
            vid = best_accepted(self.store, ws)
            new = config_of(vid) if vid else step["incumbent_before"]
        from kinv.agent.workstream import planner

        for t in self.store.todos(ws):  # a mixed verdict's level-conditional follow-up is what the campaign does
            if t["status"] == "pending" and t["id"].endswith("-cond"):
                planner.finish(self.store, ws, t["id"].split(".", 1)[1], "completed",
                               f"taken up by campaign {self.cid}: the incumbent per level is {describe(new)}")  # fmt: skip
        step.update(phase="done", verdicts=res.verdicts, levels=res.levels_json(),
                    closeout=self.store.workstream(ws).get("report_path"), incumbent_after=new, finished=time.time())
        self._update_step(step)
        if not final:
            changed = config_hash(new) != config_hash(step["incumbent_before"])
            self.save(incumbent=new)
            self.say(f"{ws} closed: " + ", ".join(f"{k} {v}" for k, v in res.verdicts.items()) +
                     (f"; incumbent now {describe(new)}" if changed else "; the incumbent stays"))  # fmt: skip
            if step.get("env_found"):
                self.say(f"{ws}: the environment improved " + "; ".join(
                    f"{lv} with {kv(x['env'])}" for lv, x in step["env_found"].items())
                    + ": a deployment's setting, not the config file's (the campaign's config is unchanged)")  # fmt: skip
        return "done", line
