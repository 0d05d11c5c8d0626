"""What a person approves is what runs: source-patch approvals show the diff, title and rationale; an edit
changed after approval is refused; a recorded decision is never overwritten by a re-run node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, project_copy, replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def env(tmp_path, state_dir):
    return replay_env(tmp_path, state_dir)


@pytest.fixture
def copy_env(tmp_path, state_dir):
    """The fault drill plants source patches: it runs on a copy of the project (its root, and the environment)."""
    root, pythonpath = project_copy(tmp_path / "project")
    return root, replay_env(tmp_path, state_dir, PYTHONPATH=pythonpath)


def kinv(env, *args):
    return kinv_in_process(env, *args)


@pytest.mark.slow  # a run of #6a up to its first approval
def test_a_source_patch_approval_shows_its_diff_title_and_rationale(copy_env):
    root, env = copy_env
    r = run_kinv(env, "run", "plans/6a-fault-drill.yaml", "--backend", "replay", "--approval", "auto-config", cwd=root)
    assert r.returncode == 3, r.stdout + r.stderr  # F1 is a source patch: a person must see it
    item = json.loads(kinv(env, "pending", "--json").stdout)[0]
    assert item["variant"] == "F1" and item["kind"] == "source"
    assert "+++ b/kernels/mla_decode.py" in item["diff"] and "tl.dot(q0, kv0)" in item["diff"]
    assert item["title"].startswith("does not compile") and item["rationale"]
    assert item["plan_hash"] and item["patch_sha"]
    table = kinv(env, "pending")
    assert "tl.dot(q0, kv0)" in table.stdout and "does not compile" in table.stdout
    ws = next(w for w in json.loads(kinv(env, "status", "--json").stdout)["workstreams"] if w["id"] == "#6a")
    assert ws["status"] == f"waiting for approval {item['id']}"  # paused, not "running"


@pytest.mark.slow  # three runs of #3a
def test_a_plan_changed_after_approval_is_refused_then_runs_as_a_new_version(env, tmp_path):
    plan = tmp_path / "3a.yaml"
    plan.write_text((ROOT / "plans" / "3a-attention-occupancy.yaml").read_text())
    before = (Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json").read_bytes()
    assert kinv(env, "run", str(plan), "--backend", "replay", "--approval", "ask").returncode == 3
    aid = json.loads(kinv(env, "pending", "--json").stdout)[0]["id"]
    assert kinv(env, "approve", aid).returncode == 0
    plan.write_text(plan.read_text().replace("patch: {num_warps: 8}", "patch: {num_warps: 8, num_stages: 3}"))  # edited after
    r = kinv(env, "resume", "3a", "--backend", "replay")
    assert r.returncode == 2 and "--new-version" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json").read_bytes() == before  # the edited V1 never written
    r = kinv(env, "run", str(plan), "--backend", "replay", "--approval", "auto", "--new-version")
    assert r.returncode == 0 and "plan version 2" in r.stdout, r.stdout + r.stderr
    from kinv.agent.store.db import Store

    store = Store(env["KINV_STATE_DIR"])
    old = store.plan_versions("#3a")
    assert len(old) == 1 and old[0]["version"] == 1 and old[0]["status"] != "closed"  # version 1 kept as it was
    assert store.workstream("#3a")["version"] == 2 and store.workstream("#3a")["status"] == "closed"
    exps = [e for e in store.experiments("#3a") if e["variant"] == "V1"]
    assert {e.get("version") or 1 for e in exps} == {1, 2}  # both versions' experiments are kept


@pytest.mark.slow  # two runs of #6a up to its first kernel edit
def test_a_source_patch_edited_after_approval_is_refused(copy_env):
    root, env = copy_env
    run = ["run", "plans/6a-fault-drill.yaml", "--backend", "replay", "--approval", "auto-config"]
    r = run_kinv(env, *run, cwd=root)
    assert r.returncode == 3, r.stdout + r.stderr
    aid = json.loads(kinv(env, "pending", "--json").stdout)[0]["id"]
    assert kinv(env, "approve", aid).returncode == 0
    diff = root / "plans" / "patches" / "compile-fail.diff"
    diff.write_text(diff.read_text().replace("planted: wrong operand shape", "planted: edited after approval"))
    r = run_kinv(env, *run, cwd=root)
    assert r.returncode == 1 and "not what was approved" in r.stderr, r.stdout + r.stderr
    for kernels in (root / "kernels", ROOT / "kernels"):  # neither the copy's kernel nor this checkout's
        assert "edited after approval" not in (kernels / "mla_decode.py").read_text()


def test_a_recorded_decision_is_never_overwritten(tmp_path):
    from kinv.agent.store.db import Store

    store = Store(tmp_path / "state")
    row = dict(id="3a-V1-3", workstream="#3a", todo="#3a.V1", variant="V1", kind="config", diff="d", resources={},
               hypothesis="h", plan_hash="p1", patch_sha="e1")  # fmt: skip
    store.add_approval(**row)
    store.decide_approval("3a-V1-3", "rejected", "not on this fleet")
    store.add_approval(**{**row, "diff": "changed"})  # the design node re-runs after a kill
    got = store.approval("3a-V1-3")
    assert got["status"] == "rejected" and got["reason"] == "not on this fleet" and got["diff"] == "d"
