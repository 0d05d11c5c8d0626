"""One run, one backend: `kinv resume` continues on the backend the run started with, so no A/B mixes replay
rounds with rounds timed on a GPU; naming another backend is refused."""

from __future__ import annotations

import json

import pytest

from kinv.agent.errors import BackendError
from tests.utils import replay_env, run_kinv

PLAN = "plans/3a-attention-occupancy.yaml"


@pytest.mark.slow
def test_resume_keeps_the_backend_the_run_started_with_and_refuses_another(tmp_path, state_dir, monkeypatch, capsys):
    env = replay_env(tmp_path, state_dir)
    first = run_kinv(env, "run", PLAN, "--backend", "replay", "--approval", "ask")
    assert first.returncode == 3, first.stdout + first.stderr  # paused at V1's approval, mid-run

    # an explicit other backend: one line naming the run's backend, exit 2, nothing changed
    r = run_kinv(env, "resume", "3a", "--backend", "cuda")
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "replay" in r.stderr and "Traceback" not in r.stderr
    assert json.loads(run_kinv(env, "pending", "--json").stdout)[0]["status"] == "pending"

    aid = json.loads(run_kinv(env, "pending", "--json").stdout)[0]["id"]
    assert run_kinv(env, "approve", aid).returncode == 0
    # resumed on a machine where `auto` would pick the GPU: the run goes on on replay, as it started
    for k in ("KINV_CONFIG_DIR", "TRITON_INTERPRET", "KINV_FORCE_NO_GPU", "PYTHONPATH"):
        monkeypatch.setenv(k, env[k])
    from kinv.agent.cli import app as cli
    from kinv.agent.store.db import Store
    from kinv.agent.tools.runners import bench

    real = bench.get_backend
    asked = []

    def get_backend(name, *rest):
        asked.append(name)
        if name in ("auto", "cuda"):  # what this machine would give: a GPU
            raise BackendError("this machine would time on its GPU")
        return real(name, *rest)

    monkeypatch.setattr(bench, "get_backend", get_backend)
    assert cli.main(["resume", "3a", "--approval", "auto"]) == 0, capsys.readouterr()
    assert asked and set(asked) == {"replay"}
    exps = Store(str(state_dir)).experiments("#3a")
    assert {e["backend"] for e in exps} == {"replay"} and any(e["variant"] == "V2" for e in exps)
