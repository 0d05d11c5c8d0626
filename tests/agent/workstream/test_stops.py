"""Stops at awkward instants leave a state that says what it is: a run stopped just after its close-out was written
resumes to closed, and the graph's checkpoint file deleted or overwritten under a live run is noticed at the next
step (one line, exit 1, kernel files restored) with kinv doctor naming the way on.  Runs of a command plan whose
runs end at once, in this process."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from kinv.agent.store.db import Store
from kinv.agent.workstream import graph
from tests.agent.test_one_process import quick_plan
from tests.utils import kinv_in_process, replay_env


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "11a.yaml"
    path.write_text(yaml.safe_dump(quick_plan("#11a", {"T1": "1"})))
    return path


def _status(env, ws="#11a") -> str:
    return next(w["status"] for w in json.loads(kinv_in_process(env, "status", "--json").stdout)["workstreams"]
                if w["id"] == ws)  # fmt: skip


def test_a_run_stopped_after_its_close_out_was_written_resumes_to_closed(tmp_path, plan, monkeypatch):
    env = replay_env(tmp_path, tmp_path / "state")
    report = tmp_path / "state" / "reports" / "11a-closeout.md"
    intact = Store.check_intact

    def ctrl_c_once_closed_out(self):  # Ctrl-C lands just after "close-out written", before the run returns
        if report.exists() and not (tmp_path / "stopped").exists():
            (tmp_path / "stopped").touch()
            raise KeyboardInterrupt
        intact(self)

    monkeypatch.setattr(Store, "check_intact", ctrl_c_once_closed_out)
    r = kinv_in_process(env, "run", str(plan), "--backend", "command", "--approval", "auto")
    assert r.returncode == 130 and "kinv resume 11a" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "stopped").exists() and _status(env) == "interrupted"
    r = kinv_in_process(env, "resume", "11a")
    assert r.returncode == 0 and "already closed out" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr
    assert _status(env) == "closed"  # it said "interrupted" for good before
    doctor = json.loads(kinv_in_process(env, "doctor", "--json").stdout)
    assert not [f for f in doctor if f["status"] == "bad"], doctor


@pytest.mark.parametrize("damage", ["deleted", "replaced"])
def test_the_checkpoint_file_lost_under_a_live_run_stops_it_at_the_next_step_resumable(tmp_path, plan, monkeypatch,
                                                                                         damage):  # fmt: skip
    env = replay_env(tmp_path, tmp_path / "state")
    ck = tmp_path / "state" / "checkpoints.db"
    noise = graph.NODES["noise"]

    def noise_then_damage(state, runtime):  # between two graph steps: after the A/A, before the first pick
        out = noise(state, runtime)
        if damage == "deleted":
            os.unlink(ck)
        else:  # a copy of something else put in its place
            (tmp_path / "other.db").write_bytes(b"not a checkpoint file\n" * 50)
            os.replace(tmp_path / "other.db", ck)
        return out

    monkeypatch.setitem(graph.NODES, "noise", noise_then_damage)
    r = kinv_in_process(env, "run", str(plan), "--backend", "command", "--approval", "auto")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stdout[-2000:] + r.stderr
    assert f"{ck} was {damage} during the run" in lines[0] and "continue with kinv resume 11a" in lines[0]
    exps = {e["variant"] for e in json.loads(kinv_in_process(env, "experiments", "11a", "--json").stdout)}
    assert "T1" not in exps  # stopped at the step after the loss: nothing more was measured
    monkeypatch.undo()
    if damage == "replaced":  # what stood in its place is kept aside, never deleted
        assert [p.read_bytes()[:21] for p in ck.parent.glob("checkpoints.db.replaced-*") if not p.name.endswith(
            ("-wal", "-shm"))] == [b"not a checkpoint file"]  # fmt: skip
    assert not [f for f in json.loads(kinv_in_process(env, "doctor", "--json").stdout) if f["status"] == "bad"]
    r = kinv_in_process(env, "resume", "11a")  # at the step it stopped at, never from the start
    assert r.returncode == 0 and "resuming #11a at pick" in r.stdout, r.stdout[-2000:] + r.stderr
    assert _status(env) == "closed" and "T1" in {e["variant"] for e in json.loads(
        kinv_in_process(env, "experiments", "11a", "--json").stdout)}  # fmt: skip


def test_checkpoints_lost_while_no_run_holds_them_are_named_by_kinv_doctor_with_the_way_on(tmp_path, plan):
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "run", str(plan), "--backend", "command", "--approval", "ask")
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr
    (tmp_path / "state" / "checkpoints.db").unlink()
    r = kinv_in_process(env, "doctor", "--json")
    found = {f["check"]: f for f in json.loads(r.stdout)}
    assert r.returncode == 1 and found["checkpoints"]["status"] == "bad", found
    assert f"kinv run {plan} --new-version" in found["checkpoints"]["fix"]
    assert "kinv.db and the journal keep every decision" in found["checkpoints"]["detail"]
    r = kinv_in_process(env, "resume", "11a")  # the way doctor names: one line too, never a silent fresh start
    assert r.returncode == 1 and "--new-version" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
