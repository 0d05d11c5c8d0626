"""`kinv run PLAN PLAN ...`: several workstreams at once, each in its own process on its own GPU (on replay, a
CPU process), deciding exactly what each decides alone; plans of one kernel never patch its live file at once."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from kinv.kernels.errors import BadInput
from tests.agent.workstream.test_replay_outcomes import PLANS, _pinned, outcome
from tests.utils import kinv_in_process, replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[3]


def _env(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    for f in (ROOT / "kernels" / "configs").glob("*.json"):  # the other kernels' live configs as shipped
        if not (tmp_path / "configs" / f.name).exists():
            shutil.copy(f, tmp_path / "configs" / f.name)
    return env


def test_plans_of_one_kernel_share_a_group_and_a_workstream_named_twice_is_refused():
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.runners import placement

    loaded = [(PLANS[w], load_plan(PLANS[w])[0]) for w in ("3a", "4a", "3b")]
    rows = placement.group(loaded)
    assert [(r.ws, r.group) for r in rows] == [("#3a", 0), ("#4a", 1), ("#3b", 0)]
    with pytest.raises(BadInput, match="both workstream #3a"):
        placement.group([loaded[0], loaded[0]])
    # exit codes: a failure outranks a pause for approval, which outranks a close-out
    rows[0].exit_code, rows[1].exit_code, rows[2].exit_code = 0, 3, 0
    assert placement.exit_code(rows) == 3
    rows[2].exit_code = 1
    assert placement.exit_code(rows) == 1


@pytest.mark.parametrize("args,says", [
    (["plans/3a-attention-occupancy.yaml", "plans/3a-attention-occupancy.yaml", "--backend", "replay"],
     "are both workstream #3a"),
    (["plans/3a-attention-occupancy.yaml", "plans/no-such-plan.yaml", "--backend", "replay"], "no-such-plan.yaml"),
    (["plans/3a-attention-occupancy.yaml", "plans/4a-expert-gemm-tiles.yaml", "--backend", "cuda"],
     "--backend cuda needs a GPU and none is visible"),
])  # fmt: skip
def test_bad_multi_plan_runs_are_refused_in_one_line_and_run_nothing(tmp_path, args, says):
    env = _env(tmp_path)
    r = kinv_in_process(env, "run", *args, "--approval", "auto")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "state" / "runs").exists() and not (tmp_path / "state" / "kinv.db").exists()


def _report(env, ws):
    rep = run_kinv(env, "report", ws, "--json")
    assert rep.returncode == 0, rep.stderr
    return json.loads(rep.stdout)


@pytest.mark.slow
def test_two_kernels_workstreams_run_at_once_and_decide_exactly_as_each_alone(tmp_path):
    env = _env(tmp_path)
    r = run_kinv(env, "run", PLANS["3a"], PLANS["4a"], "--backend", "replay", "--approval", "auto", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 workstreams in 2 group(s) (one per kernel) on 2 CPU process(es)" in r.stdout
    assert "#3a exit 0, #4a exit 0" in r.stdout
    for ws in ("3a", "4a"):  # the pinned outcome of each workstream run alone, number for number
        _pinned(ws, outcome(_report(env, ws)))
        assert (tmp_path / "state" / "runs" / f"{ws}.log").read_text().strip().splitlines()[-1].startswith("close-out:")
    # both ran at the same time: each started before the other ended
    db = sqlite3.connect(tmp_path / "state" / "kinv.db")
    spans = {w: (t0, t1) for w, t0, t1 in db.execute("select workstream, min(t), max(t) from events group by workstream")}
    (a0, a1), (b0, b1) = spans["#3a"], spans["#4a"]
    assert a0 < b1 and b0 < a1


@pytest.mark.slow
def test_two_workstreams_of_one_kernel_never_patch_its_live_file_at_once(tmp_path):
    env = _env(tmp_path)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    r = run_kinv(env, "run", PLANS["3a"], PLANS["3b"], "--backend", "replay", "--approval", "auto", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 workstreams in 1 group(s)" in r.stdout and "on 1 CPU process(es)" in r.stdout
    db = sqlite3.connect(tmp_path / "state" / "kinv.db")
    rows = db.execute("select workstream, created, updated, state from patches where path like '%mla_decode.json' "
                      "order by created").fetchall()  # fmt: skip
    assert {w for w, *_ in rows} == {"#3a", "#3b"} and all(s == "reverted" for *_, s in rows)
    for (_, _, end, _), (_, start, _, _) in zip(rows, rows[1:]):
        assert end <= start  # each patch was reverted before the next one was written
    assert cfg.read_bytes() == before
    for ws in ("3a", "3b"):
        _pinned(ws, outcome(_report(env, ws)))
