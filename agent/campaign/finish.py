"""A campaign's end: the final config proposed through the approval gate (written as a journaled patch whose
commit message cites every close-out), and the summary ``kinv campaign --json`` prints."""

from __future__ import annotations

import os
from pathlib import Path

from kinv.agent.campaign.levels import per_level
from kinv.agent.campaign.results import FINAL, CampaignEnd
from kinv.agent.ids import state_flag
from kinv.agent.report.views import n_screened
from kinv.kernels.launch_config import describe

SCREENING_SKIPS = ("a screening's short paired rounds decide no verdict (no A/A offsets, no sequential looks, no "
                   "integrity or plausibility rule): they rank candidates, and each finalist is then decided by its "
                   "workstream's sequential A/B with every rule")


class Ending:
    """The last steps of a Campaign (a mixin: it uses the campaign's store, plan, settings and steps)."""

    def finish(self, last: dict) -> tuple[CampaignEnd, str]:
        """Propose the final config through the approval gate (auto: write it as a journaled patch)."""
        row = self.row
        why = row["stop_reason"] or "done"
        if not last.get("ws"):
            self.save(status="done")
            return "done", f"campaign {self.cid} done ({why}); {last.get('note', '')}"
        ws = last["ws"]
        verdict = (last.get("verdicts") or {}).get("V1")
        if verdict not in ("accept", "mixed"):
            last["adoption"] = f"not proposed: the final A/B against the starting baseline says {verdict}"
            self._update_step(last)
            self.save(status="done")
            return "done", f"campaign {self.cid} done ({why}); {last['adoption']}"
        if last.get("adopted"):
            self.save(status="done")
            return "done", f"campaign {self.cid} done ({why}); adopted: {last['adopted']}"
        aid = f"{self.cid.lstrip('#')}-adopt"
        appr = self.store.approval(aid)
        if appr is not None and appr["status"] == "rejected":  # a person's no stands, whatever the policy now
            last["adoption"] = f"rejected by a person ({appr.get('reason') or 'no reason given'})"
            self._update_step(last)
            self.save(status="done")
            return "done", (f"campaign {self.cid} done ({why}); adoption {last['adoption']}: the recorded rejection "
                             f"of {aid} stands under --approval {self.s.approval}")  # fmt: skip
        from kinv.agent.errors import AdoptError, NoGain

        try:
            a = self.adoption(ws)  # measured against the live file it would replace, first
        except NoGain as exc:
            last["adoption"] = f"not proposed: {exc}"
            self._update_step(last)
            self.save(status="done")
            return "done", f"campaign {self.cid} done ({why}); {last['adoption']}"
        except AdoptError as exc:  # e.g. no replay recording of the pair: nothing written, run it again elsewhere
            self.save(status="paused")
            return "failed", str(exc)
        if self.s.approval != "auto" and appr is None:
            self.store.add_approval(id=aid, workstream=ws, todo=f"{ws}.adopt", variant="V1", kind="adopt",
                                    diff=a.diff, hypothesis=a.message, resources="{}")  # fmt: skip
            appr = self.store.approval(aid)
        if self.s.approval != "auto" and appr["status"] == "pending":
            self.s.console.print(a.diff, markup=False, highlight=False)
            self.s.console.print(a.message, markup=False, highlight=False)
            self.save(status="paused")
            sd = state_flag(self.s.state_dir)
            return "paused", (f"campaign {self.cid} proposes {describe(a.new_config)}: approve it with kinv approve "
                                 f"{aid}{sd} (or kinv reject {aid} --reason ...{sd}), then run kinv campaign "
                                 f"{self.s.plan_path}{sd} again")  # fmt: skip
        if self.s.approval != "auto" and appr["status"] != "approved":
            last["adoption"] = f"rejected by a person ({appr.get('reason') or 'no reason given'})"
            self._update_step(last)
            self.save(status="done")
            return "done", f"campaign {self.cid} done ({why}); adoption {last['adoption']}"
        if appr is not None and appr["status"] == "pending":  # --approval auto decides it: none is left pending
            self.store.decide_approval(aid, "approved", "decided by --approval auto (kinv campaign)")
            self.store.event(ws, "approval", f"{aid} approved: decided by --approval auto (kinv campaign)")
        done = self.write_adoption(a)
        last["adopted"] = f"{describe(a.new_config)} into {done['path']} (patch #{done['patch']})"
        last["commit_message"] = done["message_file"]
        self._update_step(last)
        self.save(status="done")
        rec = f" {done['recording']}" if done.get("recording") else ""
        return "done", (f"campaign {self.cid} done ({why}); adopted {last['adopted']}; commit it: git commit -F "
                         f"{done['message_file']} {done['path']}{rec}")  # fmt: skip

    def adoption(self, ws: str):
        from kinv.agent.workstream import adopt

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
        from kinv.agent.tools.files import configs
        from kinv.agent.workstream import adopt

        lock = f"kernel:{self.plan.kernel}"
        self.store.acquire_lock(lock, os.getpid())
        try:
            with configs.ConfigFileLock(a.path, self.store.dir):
                return adopt.apply(self.store, a)
        finally:
            self.store.release_lock(lock, os.getpid())

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
                             "screened": n_screened(s), "pruned": s.get("pruned", 0),
                             "sampler": s.get("sampler"), "trials": s.get("trials"),
                             "executor": s.get("executor"), "places": s.get("places"), "losses": s.get("losses"),
                             "measured_on": sorted({x.measured_on or "" for x in self.screened(s)} - {""}),
                             "verdicts": s.get("verdicts", {}), "closeout": s.get("closeout"),
                             "note": s.get("note")} for s in row["steps"]],  # fmt: skip
            "gpu_seconds": round(gpu, 3), "samples": n, "wall_seconds": round(self.wall(), 1),
            "stop_reason": row["stop_reason"], "adopted": (final or {}).get("adopted"),
            "adoption": (final or {}).get("adoption"),
            "incumbent_us": self.incumbent_us(), "roofline_fraction": self.roofline_fractions(),
            "roofline": self.goal_bound(),
            "recommendation": (self.store.workstream(final["ws"]) or {}).get("recommendation") if final else None,
            "beyond_reach": [{"id": i.id, "title": i.title, "targets": i.targets} for i in plan.backlog
                             if not i.searchable],  # fmt: skip
            "environment_found": {s["ws"]: s["env_found"] for s in row["steps"] if s.get("env_found")},
            # what a screening skips, said: it only ranks; every verdict comes from the sequential A/B with every rule
            "rules_skipped": {"screening": SCREENING_SKIPS},
        }
