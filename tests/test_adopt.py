"""`kinv adopt WS VARIANT`: a measured winner becomes the live config as a journaled, reviewed change."""

from __future__ import annotations

import json
from pathlib import Path

from tests.utils import replay_env, run_kinv


def test_adopt_shows_then_writes_the_winner_journaled_with_a_message_citing_the_close_out(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    assert run_kinv(env, "run", "plans/3b-tile-shape.yaml", "--backend", "replay", "--approval", "auto").returncode == 0
    before = cfg.read_bytes()

    shown = run_kinv(env, "adopt", "3b", "V1")  # review first: nothing is written
    assert shown.returncode == 0, shown.stderr
    assert cfg.read_bytes() == before
    assert '-  "BLOCK_T": 16,' in shown.stdout and '+  "BLOCK_T": 32,' in shown.stdout
    assert "3b-closeout.md" in shown.stdout and "b64  +" in shown.stdout and "kinv adopt 3b V1 --yes" in shown.stdout

    done = json.loads(run_kinv(env, "adopt", "3b", "V1", "--yes", "--json").stdout)
    assert json.loads(cfg.read_text())["BLOCK_T"] == 32 and done["written"] and done["kind"] == "config"
    message = Path(done["message_file"]).read_text()
    assert message.startswith("mla_decode: adopt #3b V1 (BLOCK_T 32)") and "Close-out:" in message
    # final: neither a revert nor the next start puts the old baseline back
    assert run_kinv(env, "revert").returncode == 0
    assert json.loads(cfg.read_text())["BLOCK_T"] == 32
    backups = json.loads(run_kinv(env, "backups", "--json").stdout)
    assert any(b["sha"] and b["path"] == str(cfg.resolve()) for b in backups)  # the old file is kept
    # the file moved on: a second adoption from the same measurements is refused
    again = run_kinv(env, "adopt", "3b", "V1", "--yes")
    assert again.returncode == 2 and "not the baseline" in again.stderr


def test_adopt_refuses_what_was_not_a_win_and_names_what_was_measured(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    assert run_kinv(env, "run", "plans/3a-attention-occupancy.yaml", "--backend", "replay", "--approval",
                    "auto").returncode == 0  # fmt: skip
    before = cfg.read_bytes()
    r = run_kinv(env, "adopt", "3a", "V1", "--yes")
    assert r.returncode == 2 and "was not a win (reject" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_kinv(env, "adopt", "3a", "V9")
    assert r.returncode == 2 and "measured: V1, V2" in r.stderr
    assert cfg.read_bytes() == before


def test_a_mixed_variant_whose_change_is_an_override_is_adopted_only_where_it_won():
    # #9c on the H200: V1 adds {shape: v3, batch_min: 96, ...}; improved at b96, regressed at b128. Adopting it
    # where it won must put the b96 change first (the first matching override wins) and only for V3, the shape
    # it was measured on; it used to find "no per-level overrides" because the base tunables were unchanged.
    from kinv.agent import planner
    from kinv.agent.models import load_plan
    from kinv.kernels.launch_config import describe

    plan, _ = load_plan("plans/9c-decode-shape.yaml")
    key = {lv.dims["batch"]: lv.key for lv in plan.levels()}
    cond = planner.level_conditional(plan, plan.variant("V1"), {key[64]: "equivalent", key[96]: "improved",
                                                                key[128]: "regressed"})  # fmt: skip
    assert describe(cond) == "BT64/BH16/w4/s2/cps2 [v3 b96-96: BT32,cps3,mrg1; b<=1: w8,tma1; b>=64: mrg1]"
    a = plan.adapter
    for shape, b, want in (("v3", 96, "BT32/BH16/w4/s2/cps3/mrg1"), ("v3", 128, "BT64/BH16/w4/s2/cps2/mrg1"),
                           ("v4flash", 96, "BT64/BH16/w4/s2/cps2/mrg1"), ("v3", 1, "BT64/BH16/w8/s2/cps2/tma1")):
        level = a.level({"shape": shape, "heads": 16, "page_size": 64, "context": 4096, "batch": b})
        assert a.params_for(cond, level).short() == want
    # nothing improved: nothing to adopt
    assert planner.level_conditional(plan, plan.variant("V1"), {key[128]: "regressed"}) is None
