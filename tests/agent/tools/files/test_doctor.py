"""`kinv doctor` and a lost or damaged state dir: every finding names its fix; a lost
checkpoints.db never silently restarts an investigation; a damaged kinv.db is reported, not crashed on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinv.kernels.launch_config import config_hash
from tests.utils import kinv_in_process, leave_kinv_patch_live, replay_env, run_kinv

PLAN = "plans/3a-attention-occupancy.yaml"


def _findings(env) -> tuple[int, dict]:
    r = kinv_in_process(env, "doctor", "--json")
    return r.returncode, {f["check"]: f for f in json.loads(r.stdout)}


def test_doctor_on_a_healthy_then_a_damaged_state_dir(tmp_path, state_dir, closed_3a):
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    rc, f = _findings(env)
    assert rc == 0 and {x["status"] for x in f.values()} == {"ok"}, f
    assert "baseline of" in f["config mla_decode"]["detail"]

    cfg.write_text(cfg.read_text().replace('"num_warps": 4', '"num_warps": 8'))  # a hand edit
    rc, f = _findings(env)
    assert f["config mla_decode"]["status"] == "warn" and "--to-plan" in f["config mla_decode"]["fix"]

    db = Path(state_dir) / "kinv.db"
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(db.read_bytes()[:4096] + b"\0" * 8192)  # truncated and zeroed: damaged
    before = db.read_bytes()
    rc, f = _findings(env)
    assert rc == 1 and f["kinv.db"]["status"] == "bad" and "damaged" in f["kinv.db"]["detail"]
    assert "kinv revert --to-plan" in f["kinv.db"]["fix"]
    assert db.read_bytes() == before  # the doctor only reads
    # and the way back that needs no kinv.db
    r = kinv_in_process(env, "revert", "--to-plan", PLAN)
    assert r.returncode == 0, r.stderr
    assert json.loads(cfg.read_text())["num_warps"] == 4


def test_a_deleted_checkpoints_db_is_refused_not_silently_restarted(tmp_path, state_dir, paused_3a):
    env = replay_env(tmp_path, state_dir)  # a run of #3a paused at V1's approval
    n_exps = len(json.loads(kinv_in_process(env, "experiments", "3a", "--json").stdout))
    (Path(state_dir) / "checkpoints.db").unlink()
    rc, f = _findings(env)
    assert rc == 1 and f["checkpoints"]["status"] == "bad" and "--new-version" in f["checkpoints"]["fix"]
    r = kinv_in_process(env, "resume", "3a", "--backend", "replay")
    assert r.returncode == 1 and "checkpoints of #3a are missing" in r.stderr and "--new-version" in r.stderr
    assert len(json.loads(kinv_in_process(env, "experiments", "3a", "--json").stdout)) == n_exps  # nothing re-run


def test_revert_without_kinv_db_never_says_nothing_to_revert_over_a_live_variant(tmp_path, state_dir):
    """kinv.db deleted while V1 (num_warps 8) was live: revert says the live config is no known
    baseline and how to restore it (exit 1), and --to-plan restores it, verified, with no state at all."""
    env = replay_env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    baseline = cfg.read_bytes()
    leave_kinv_patch_live(cfg, {"num_warps": 8})  # the variant a lost run left live
    r = kinv_in_process(env, "revert")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mla_decode.json is BT16/BH16/w8/s2" in r.stdout and "kinv revert --to-plan PLAN" in r.stderr
    assert "nothing to revert: no kernel file is patched" not in r.stdout
    r = kinv_in_process(env, "revert", "--to-plan", PLAN)
    # the same config (optional tunables it wrote at their defaults change neither its label nor its hash)
    assert r.returncode == 0 and config_hash(json.loads(cfg.read_text())) == config_hash(json.loads(baseline))
    assert kinv_in_process(env, "revert").returncode == 0


@pytest.mark.slow
def test_damaged_checkpoints_are_one_line_and_the_fix_doctor_names_works(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    assert run_kinv(env, "run", PLAN, "--backend", "replay", "--approval", "ask").returncode == 3  # paused at V1
    ck = Path(state_dir) / "checkpoints.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{ck}{suffix}").unlink(missing_ok=True)
    ck.write_bytes(b"not a database at all" * 512)
    rc, f = _findings(env)
    assert rc == 1 and f["checkpoints"]["status"] == "bad" and str(ck) in f["checkpoints"]["detail"]
    fix = f["checkpoints"]["fix"]
    assert "--new-version" in fix
    r = run_kinv(env, "resume", "3a", "--backend", "replay")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "internal error" not in r.stderr, r.stderr
    assert str(ck) in lines[0] and "--new-version" in lines[0], lines
    # the fix doctor names, followed literally
    cmd = fix.split("kinv ", 1)[1].split(" (")[0].split()
    r = run_kinv(env, *[PLAN if a == "PLAN" else a for a in cmd], "--backend", "replay", "--approval", "ask")
    assert r.returncode == 3, r.stdout + r.stderr  # started again as version 2, paused at V1's approval
    assert "version 2" in r.stdout
    assert run_kinv(env, "doctor").returncode == 0
