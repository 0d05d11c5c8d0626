"""`kinv campaign --executor ray` on replay: a local Ray cluster of CPU actors stands in for GPUs (replay needs
none).  It reaches the single-process run's decisions, every screening shard pairs its candidates with an
incumbent on its own actor, and an actor killed mid-campaign costs only its in-flight shard."""

from __future__ import annotations

import json
import socket
import sqlite3

import pytest

from tests.utils import replay_env, run_kinv

pytest.importorskip("ray")

PLAN = "plans/7-decode-ceiling.yaml"
# the chosen config per level of the single-process replay campaign (benchmarks/RESULTS.md, issue 14 re-record)
EXPECTED_LEVELS = {"b1": "BT64/BH16/w8/s1", "b8": "BT128/BH16/w4/s2", "b32": "BT64/BH16/w4/s2",
                   "b64": "BT64/BH16/w4/s2", "b96": "BT64/BH16/w4/s2"}  # fmt: skip


def _campaign(tmp_path, name, *extra, **env_extra):
    env = replay_env(tmp_path / name, tmp_path / name / "state", **env_extra)
    r = run_kinv(env, "campaign", PLAN, "--backend", "replay", "--approval", "auto", "--json", *extra, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout)


def _decisions(summary):
    return ({k: v["config"] for k, v in summary["levels"].items()},
            [(w["ws"], w["item"], w["verdicts"], w["finalists"]) for w in summary["workstreams"]])


@pytest.mark.slow
def test_two_ray_actors_reach_the_single_process_decisions_and_survive_losing_one(tmp_path):
    for d in ("local", "ray"):
        (tmp_path / d).mkdir()
    local = _campaign(tmp_path, "local")
    # actor 1 dies (os._exit) the first time it is handed a shard; the driver re-runs that shard on a new actor
    where = f"actor1@{socket.gethostname()}/cpu"
    ray = _campaign(tmp_path, "ray", "--executor", "ray", "--ray-actors", "2", KINV_EXECUTOR_FAULT=f"screen:{where}",
                    KINV_EXECUTOR_FAULT_MARKER=str(tmp_path / "fault-fired"))  # fmt: skip
    assert (tmp_path / "fault-fired").exists()
    assert _decisions(ray) == _decisions(local)
    first = ray["workstreams"][0]
    assert first["executor"] == "ray" and len(first["places"]) == 2
    assert any("died" in loss for loss in first["losses"])
    joint = next(w for w in ray["workstreams"] if w["item"] == "JOINT")
    assert len(joint["measured_on"]) == 2  # the candidates were spread over both actors
    # every candidate was paired with an incumbent on its own actor: two incumbent workers, one per shard
    assert ray["samples"] > local["samples"]

    # the confirmation workstreams measured on the actors too: every level on one actor, both arms there
    store = tmp_path / "ray" / "state"
    con = sqlite3.connect(store / "kinv.db")
    rows = con.execute("select e.workstream, s.level, s.arm, s.place from samples s join experiments e "
                       "on s.experiment = e.id where e.kind in ('ab', 'noise')").fetchall()  # fmt: skip
    assert rows and all(place for *_x, place in rows)
    by_level = {}
    for ws, level, _arm, place in rows:
        by_level.setdefault((ws, level), set()).add(place)
    assert all(len(p) == 1 for p in by_level.values()), by_level  # a level's pairs never span two GPUs
    assert len({p for ps in by_level.values() for p in ps}) == 2  # and the levels were spread over both
    closeout = (store / "reports" / "7c-closeout.md").read_text()
    assert "Measured on (each level's baseline and variant on one GPU" in closeout and "actor1@" in closeout


@pytest.mark.slow
def test_an_actor_lost_during_an_ab_round_costs_that_round_only(tmp_path):
    """Actor 1 dies at its first A/A or A/B round (the first confirmation workstream's); a new actor takes its
    place with the arms reopened, the round runs again, the decisions are the single-process run's (the
    replay serves each round's recorded samples, so a re-run round is the same round), and the close-out
    of that workstream records the loss."""
    (tmp_path / "ray").mkdir()
    where = f"actor1@{socket.gethostname()}/cpu"
    ray = _campaign(tmp_path, "ray", "--executor", "ray", "--ray-actors", "2", KINV_EXECUTOR_FAULT=f"sample:{where}",
                    KINV_EXECUTOR_FAULT_MARKER=str(tmp_path / "fault-fired"))  # fmt: skip
    assert (tmp_path / "fault-fired").exists()
    levels, chain = _decisions(ray)
    assert [c[1] for c in chain] == ["BTSWEEP", "JOINT", "STAGES", "WARPS", "final"]
    assert chain[-1][2] == {"V1": "accept"}
    assert levels == EXPECTED_LEVELS
    closeout = (tmp_path / "ray" / "state" / "reports" / "7a-closeout.md").read_text()
    assert "Lost during the workstream: actor 1" in closeout and "its round runs again" in closeout
    # no A/A or A/B round was stored twice: each (experiment, round, level, arm) once (a screening has an
    # incumbent per shard, so it is left out)
    con = sqlite3.connect(tmp_path / "ray" / "state" / "kinv.db")
    dup = con.execute("select count(*) from (select s.experiment, s.round, s.level, s.arm, count(*) c from samples s "
                      "join experiments e on s.experiment = e.id where e.kind in ('ab', 'noise') "
                      "group by s.experiment, s.round, s.level, s.arm having c > 1)").fetchone()[0]  # fmt: skip
    assert dup == 0


def test_bad_executor_arguments_are_one_line_and_change_nothing(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    for args, needle in ((["--executor", "dask"], "--executor 'dask' is not valid"),
                         (["--ray-actors", "2"], "need --executor ray"),
                         (["--executor", "ray", "--ray-actors", "0"], "--ray-actors 0")):  # fmt: skip
        r = run_kinv(env, "campaign", PLAN, "--backend", "replay", *args)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()
