"""`kinv campaign` end to end on a small campaign (campaign #7 cut to one search item and two levels): it runs on
its own, waits for a person before touching the live config, and once approved adopts its config as a journaled
patch citing its close-outs.  The whole campaign #7, judged against the exhaustive H200 sweep, is in
tests/agent/campaign/test_campaign.py (the slow lane)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.utils import ROOT, kinv_in_process, replay_env

PLAN = ROOT / "plans" / "7-decode-ceiling.yaml"


def _small_campaign(tmp_path) -> Path:
    """Campaign #7 with only its token-tile sweep (and one item beyond a launch config's reach), at b1 and b96."""
    import yaml

    data = yaml.safe_load(PLAN.read_text())
    data["backlog"] = [b for b in data["backlog"] if b["id"] in ("BTSWEEP", "OEA")]
    data["workload"]["levels"] = [1, 96]
    data["campaign"]["goal"]["levels"] = ["b96"]
    data["campaign"]["screen"]["trials"] = 4
    path = tmp_path / "7-small.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_campaign_runs_on_its_own_waits_for_a_person_then_adopts_its_config_citing_its_closeouts(tmp_path,
                                                                                                  state_dir):
    env = replay_env(tmp_path, state_dir)
    plan = _small_campaign(tmp_path)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()

    def kinv(*args):
        return kinv_in_process(env, *args)

    first = kinv("campaign", plan, "--backend", "replay", "--approval", "auto-config")
    assert first.returncode == 3, first.stdout + first.stderr
    assert "kinv approve 7-adopt" in first.stderr
    assert cfg.read_bytes() == before  # the baseline is never silently changed
    assert [p["id"] for p in json.loads(kinv("pending", "--json").stdout)] == ["7-adopt"]
    status = kinv("status").stdout
    assert "campaign #7" in status and "#7a BTSWEEP" in status

    assert kinv("approve", "7-adopt").returncode == 0
    done = kinv("campaign", plan, "--backend", "replay", "--approval", "auto-config", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "done" and summary["adopted"]
    assert json.loads(cfg.read_text()) != json.loads(before)
    final = [w for w in summary["workstreams"] if w["item"] == "final"][0]
    msg = Path(env["KINV_STATE_DIR"], "adoptions", f"{final['ws'].lstrip('#')}-V1.txt").read_text()
    closeouts = [w["closeout"] for w in summary["workstreams"] if w["ws"] and w["closeout"]]
    assert closeouts and all(Path(c).is_file() and c in msg for c in closeouts)
    assert {i["id"] for i in summary["beyond_reach"]} == {"OEA"}  # what a launch config cannot reach
    assert kinv("doctor").returncode == 0  # the journal knows the adoption
