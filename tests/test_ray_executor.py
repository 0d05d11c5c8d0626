"""`kinv campaign --executor ray` on replay: a local Ray cluster of CPU actors stands in for GPUs (replay needs
none).  It reaches the single-process run's decisions, every screening shard pairs its candidates with an
incumbent on its own actor, and an actor killed mid-campaign costs only its in-flight shard."""

from __future__ import annotations

import json
import socket

import pytest

from tests.utils import replay_env, run_kinv

pytest.importorskip("ray")

PLAN = "plans/7-decode-ceiling.yaml"


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


def test_bad_executor_arguments_are_one_line_and_change_nothing(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    for args, needle in ((["--executor", "dask"], "--executor 'dask' is not valid"),
                         (["--ray-actors", "2"], "need --executor ray"),
                         (["--executor", "ray", "--ray-actors", "0"], "--ray-actors 0")):  # fmt: skip
        r = run_kinv(env, "campaign", PLAN, "--backend", "replay", *args)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()
