"""What a campaign records and decides between its steps: the wall budget counts running time (not the hours an
approval waited), a person's rejection stands whatever policy the campaign is re-run under, the summary never
reports a change the final A/B did not measure, and a signal during screening ends it like a workstream's."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.utils import replay_env

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "plans" / "7-decode-ceiling.yaml"


def _campaign(state_dir, steps, approval="auto", created=None):
    from rich.console import Console

    from kinv.agent.campaign import driver as camp
    from kinv.agent.plan_file import load_plan
    from kinv.agent.store.db import Store

    plan, plan_hash = load_plan(str(PLAN))
    store = Store(str(state_dir))
    start = {**plan.baseline, "kernel": plan.adapter.name}
    row = {"id": "#7", "plan_path": str(PLAN), "plan_hash": plan_hash, "kernel": plan.adapter.name,
           "status": "running", "backend": "replay", "approval": approval, "start_config": start, "incumbent": start,
           "steps": steps, "stop_reason": "", "summary": {}}  # fmt: skip
    if created is not None:
        row["created"] = created
    store.upsert_campaign(row)
    out = io.StringIO()
    s = camp.Settings(str(PLAN), "replay", approval, str(state_dir), Console(file=out, width=200))
    return camp.Campaign(store, plan, "#7", s), store, plan, start


def _final(start, **extra):
    return {"item": "final", "title": "the campaign's config against the starting baseline", "ws": "#7c",
            "phase": "done", "incumbent_before": start, "finalists": [start], "verdicts": {"V1": "accept"},
            "levels": {}, **extra}  # fmt: skip


def test_the_summary_says_not_measured_for_levels_the_final_ab_never_measured(state_dir):
    from kinv.agent.plan_file import load_plan

    plan = load_plan(str(PLAN))[0]
    levels = plan.levels()
    start = {**plan.baseline, "kernel": plan.adapter.name}
    measured = {levels[0].key: {"us": 10.0, "by": "V1", "effect": 0.05, "ci": [0.01, 0.09], "conf": 0.95,
                                "verdict": "improved"}}  # fmt: skip
    c, *_ = _campaign(state_dir, [_final(start, levels=measured, verdicts={"V1": "mixed"})])
    per = c.summary()["levels"]
    assert per[levels[0].label]["change_vs_start"] == 0.05
    for lv in levels[1:]:
        assert per[lv.label]["change_vs_start"] is None, (lv.label, per[lv.label])  # not measured is not 0.0
        assert per[lv.label]["ci"] is None


def test_the_wall_budget_excludes_time_spent_waiting_for_a_person(state_dir):
    """Started two hours ago (the plan's wall budget is one hour), but it ran for a minute: an approval of #7a
    waited the rest.  The campaign goes on."""
    long_ago = time.time() - 7200
    c, store, plan, start = _campaign(state_dir, [], created=long_ago)
    store.upsert_workstream({"id": "#7a", "parent": "#7", "title": "screening", "kernel": "mla_decode",
                             "status": "open", "campaign": "#7"})  # fmt: skip
    steps = [{"item": "BTSWEEP", "title": "Token-tile sweep (BLOCK_T)", "ws": "#7a", "phase": "confirm",
              "incumbent_before": start, "started": long_ago}]  # fmt: skip
    c.save(steps=steps)
    exp = store.new_experiment(workstream="#7a", todo="#7a.screen", variant="screen", kind="screen", backend="replay")
    store.update_experiment(exp, status="done", started=long_ago, finished=long_ago + 30)
    store.add_node_run("#7a", 1, "setup", time.time() - 20, None, "ok")  # the graph ran 20 s, then its approval
    store.add_approval(id="3a-V1-3", workstream="#7a", todo="#7a.V1", variant="V1", kind="config", diff="",
                       hypothesis="", resources="{}")  # fmt: skip
    wall = c.wall()
    assert 45 <= wall <= 120, wall  # 30 s of screening and 20 s of the graph, not two hours
    assert c.plan.campaign.budget.wall_seconds == 3600 and wall < 3600
    why = c.stop_reason() or ""
    assert "wall budget" not in why, why


def _adopting(monkeypatch, written):
    from kinv.agent.campaign import driver as camp

    def adoption(self, ws):
        return SimpleNamespace(diff="--- a\n+++ b\n", message="adopt it\n", new_config=self.row["incumbent"],
                               path=Path("mla_decode.json"))  # fmt: skip

    def write_adoption(self, a):
        written.append(a)
        return {"path": "mla_decode.json", "patch": 1, "message_file": "7c-V1.txt"}

    monkeypatch.setattr(camp.Campaign, "adoption", adoption)
    monkeypatch.setattr(camp.Campaign, "write_adoption", write_adoption)


def test_a_recorded_rejection_stands_when_the_campaign_is_run_again_under_approval_auto(state_dir, monkeypatch):
    written = []
    _adopting(monkeypatch, written)
    c, store, _plan, start = _campaign(state_dir, [], approval="auto")
    c.save(steps=[_final(start)])
    store.add_approval(id="7-adopt", workstream="#7c", todo="#7c.adopt", variant="V1", kind="adopt", diff="d",
                       hypothesis="m", resources="{}")  # fmt: skip
    assert store.decide_approval("7-adopt", "rejected", "b1 matters more than b96 here")
    end, line = c.finish(c.row["steps"][-1])
    assert end == "done" and not written, line  # nothing written over a person's no
    assert "rejected by a person" in line and "b1 matters more" in line
    assert store.approval("7-adopt")["status"] == "rejected"
    assert c.row["status"] == "done" and "rejected" in c.row["steps"][-1]["adoption"]


def test_approval_auto_decides_a_pending_adoption_instead_of_leaving_it_pending(state_dir, monkeypatch):
    written = []
    _adopting(monkeypatch, written)
    c, store, _plan, start = _campaign(state_dir, [], approval="auto")
    c.save(steps=[_final(start)])
    store.add_approval(id="7-adopt", workstream="#7c", todo="#7c.adopt", variant="V1", kind="adopt", diff="d",
                       hypothesis="m", resources="{}")  # an earlier run under ask proposed it  # fmt: skip
    end, line = c.finish(c.row["steps"][-1])
    assert end == "done" and len(written) == 1, line
    appr = store.approval("7-adopt")
    assert appr["status"] == "approved" and "--approval auto" in appr["reason"]
    assert not store.approvals(status="pending")


@pytest.mark.slow
def test_sigterm_during_screening_restores_marks_the_campaign_interrupted_and_exits_130(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state", PYTHONUNBUFFERED="1")
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    p = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "campaign", str(PLAN), "--backend", "replay",
                          "--approval", "auto"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if "screening" in line:
                break
        assert p.poll() is None, "".join(seen)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, "".join(seen) + out
    assert "interrupted" in out and "kinv campaign" in out
    assert cfg.read_bytes() == before
    from kinv.agent.store.db import Store

    store = Store(env["KINV_STATE_DIR"])
    assert store.campaign("#7")["status"] == "interrupted"
    assert not [lk for lk in store.conn.execute("select workstream from locks")]  # the driver's lock is released


def test_a_roofline_goal_is_met_against_the_bound_the_kernels_adapter_names(state_dir, monkeypatch):
    """``roofline_fraction``: the incumbent against the fewest seconds the adapter allows at each goal level (here
    a compute bound it names), not copy bandwidth; said in the stop reason."""
    from kinv.agent.plan_sections import CampaignGoal

    c, store, plan, start = _campaign(state_dir, [])
    labels = ["b32", "b64", "b96"]
    c.plan.campaign.goal = CampaignGoal(roofline_fraction=0.5, levels=labels)
    floor = {lv.key: 1e-5 * (i + 1) for i, lv in enumerate(plan.levels())}  # seconds, per level
    monkeypatch.setattr(type(plan.adapter), "roofline", lambda self, lv, copy, peak: (floor[lv.key], "compute"))
    us = {lv.key: floor[lv.key] * 1e6 / 0.6 for lv in plan.levels()}  # 60% of the bound everywhere
    step = {"item": "BTSWEEP", "ws": "#7a", "phase": "done", "incumbent_before": start, "incumbent_after": start,
            "levels": {k: {"us": v, "by": "V1"} for k, v in us.items()}}  # fmt: skip
    c.save(steps=[step])
    assert c.goal_met() == "goal met: >= 50% of the matrix peak at b32, b64, b96"
    c.plan.campaign.goal = CampaignGoal(roofline_fraction=0.7, levels=labels)
    assert c.goal_met() is None  # 60% < 70%


def test_a_campaign_goal_names_one_bound():
    from pydantic import ValidationError

    from kinv.agent.plan_sections import CampaignGoal

    with pytest.raises(ValidationError, match="copy_fraction or roofline_fraction"):
        CampaignGoal(copy_fraction=0.8, roofline_fraction=0.8)


def test_the_campaign_graph_ends_a_closed_chain_through_adopt_and_summarise_on_its_own_thread(state_dir, monkeypatch):
    """The last step (the final A/B) is done: the campaign's graph routes plan_next -> adopt -> summarise, the
    adoption is written under --approval auto, the summary is in kinv.db, and the graph's checkpoints are a thread
    of checkpoints.db named after the campaign, which a later open of the state dir does not take for lost runs."""
    from kinv.agent.campaign.flow import drive, thread
    from kinv.agent.store.db import Store
    from kinv.agent.store.state import checkpoint_threads

    written = []
    _adopting(monkeypatch, written)
    c, store, _plan, start = _campaign(state_dir, [], approval="auto")
    c.save(steps=[_final(start)])
    end, line = drive(c)
    assert end == "done" and len(written) == 1 and "adopted" in line, line
    row = store.campaign("#7")
    assert row["status"] == "done" and row["summary"]["adopted"], row["summary"]
    assert thread("#7") in checkpoint_threads(state_dir)
    Store(str(state_dir))  # reopened: the campaign's thread is known, not a sign of lost records
    from kinv.agent.tools.files.doctor import diagnose

    assert not [f for f in diagnose(Path(state_dir)) if f.check == "kinv.db" and f.status == "bad"]
    end, line = drive(c)  # a second pass starts again at plan_next and finds the campaign adopted
    assert end == "done" and "adopted" in line and len(written) == 1, line


def test_a_campaign_killed_inside_a_node_resumes_at_that_node(state_dir, monkeypatch):
    """A kill (here an interrupt raised by the adoption) leaves the graph's checkpoint at the node it was in;
    the next pass resumes there instead of starting over."""
    from kinv.agent.campaign import driver as camp
    from kinv.agent.campaign.flow import build_campaign_graph, drive, thread
    from kinv.agent.workstream.context import open_checkpointer

    written = []
    _adopting(monkeypatch, written)
    c, store, _plan, start = _campaign(state_dir, [], approval="auto")
    c.save(steps=[_final(start)])
    real = camp.Campaign.finish

    def killed(self, last):
        raise KeyboardInterrupt

    monkeypatch.setattr(camp.Campaign, "finish", killed)
    with pytest.raises(KeyboardInterrupt):
        drive(c)
    saver = open_checkpointer(store)
    config = {"configurable": {"thread_id": thread("#7")}}
    assert build_campaign_graph(saver).get_state(config).next == ("adopt",)
    saver.conn.close()
    monkeypatch.setattr(camp.Campaign, "finish", real)
    end, line = drive(c)
    assert end == "done" and len(written) == 1, line
