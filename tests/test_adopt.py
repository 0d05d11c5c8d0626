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
