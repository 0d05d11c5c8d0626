"""What a person approves is what runs: source-patch approvals show the diff, title and rationale; an edit
changed after approval is refused; a recorded decision is never overwritten by a re-run node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path, state_dir):
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    shutil.copy(ROOT / "kernels" / "configs" / "mla_decode.json", cfg_dir)
    return dict(os.environ, KINV_STATE_DIR=str(state_dir), KINV_CONFIG_DIR=str(cfg_dir), TRITON_INTERPRET="1",
                KINV_FORCE_NO_GPU="1", PYTHONPATH=str(ROOT))  # fmt: skip


def kinv(env, *args):
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_a_source_patch_approval_shows_its_diff_title_and_rationale(env):
    r = kinv(env, "run", "plans/6a-fault-drill.yaml", "--backend", "replay", "--approval", "auto-config")
    assert r.returncode == 3, r.stdout + r.stderr  # F1 is a source patch: a person must see it
    item = json.loads(kinv(env, "pending", "--json").stdout)[0]
    assert item["variant"] == "F1" and item["kind"] == "source"
    assert "+++ b/kernels/mla_decode.py" in item["diff"] and "tl.dot(q, kv)" in item["diff"]
    assert item["title"].startswith("does not compile") and item["rationale"]
    assert item["plan_hash"] and item["patch_sha"]
    table = kinv(env, "pending")
    assert "tl.dot(q, kv)" in table.stdout and "does not compile" in table.stdout


def test_a_plan_changed_after_approval_is_refused_and_nothing_is_patched(env, tmp_path):
    plan = tmp_path / "3a.yaml"
    plan.write_text((ROOT / "plans" / "3a-attention-occupancy.yaml").read_text())
    before = (Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json").read_bytes()
    assert kinv(env, "run", str(plan), "--backend", "replay", "--approval", "ask").returncode == 3
    aid = json.loads(kinv(env, "pending", "--json").stdout)[0]["id"]
    assert kinv(env, "approve", aid).returncode == 0
    plan.write_text(plan.read_text().replace("patch: {num_warps: 8}", "patch: {num_warps: 16}"))  # edited after
    r = kinv(env, "resume", "3a", "--backend", "replay")
    assert r.returncode == 1 and "not what was approved" in r.stderr and "--new-version" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json").read_bytes() == before  # w16 never written


def test_a_recorded_decision_is_never_overwritten(tmp_path):
    from agent.store import Store

    store = Store(tmp_path / "state")
    row = dict(id="3a-V1-3", workstream="#3a", todo="#3a.V1", variant="V1", kind="config", diff="d", resources={},
               hypothesis="h", plan_hash="p1", patch_sha="e1")  # fmt: skip
    store.add_approval(**row)
    store.decide_approval("3a-V1-3", "rejected", "not on this fleet")
    store.add_approval(**{**row, "diff": "changed"})  # the design node re-runs after a kill
    got = store.approval("3a-V1-3")
    assert got["status"] == "rejected" and got["reason"] == "not on this fleet" and got["diff"] == "d"
