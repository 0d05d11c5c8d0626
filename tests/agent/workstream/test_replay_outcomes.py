"""The outcomes of #3a, #3b, #3c, #4a and #6a on replay, pinned: verdicts, per-level effects and intervals,
A/A bands, rounds, samples and GPU seconds.  Replay serves recorded samples by round, so a change in how
rounds, arms or seeds are drawn shows here as a changed number.  ``tests/data/replay_outcomes.json`` holds
them as the measurement code produced them before it became one protocol module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, project_copy, replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[3]
PINNED = Path(__file__).resolve().parents[2] / "data" / "replay_outcomes.json"
PLANS = {"3a": "plans/3a-attention-occupancy.yaml", "3b": "plans/3b-tile-shape.yaml",
         "3c": "plans/3c-null-batch-aware.yaml", "4a": "plans/4a-expert-gemm-tiles.yaml",
         "6a": "plans/6a-fault-drill.yaml"}  # fmt: skip
EFFECT = ("level", "n", "verdict", "effect", "ci_low", "ci_high", "conf", "offset_sd")
NOISE = ("level", "band", "round_sd", "offset_sd", "effect", "ci_low", "ci_high", "outliers", "equivalent")


def outcome(report: dict) -> dict:
    """What a replayed run decided and measured, from `kinv report --json` (no times, paths or prose)."""
    exps = []
    for e in report["experiments"]:
        x = e["experiment"]
        exps.append({
            "todo": x["todo"], "kind": x["kind"], "status": x["status"], "verdict": x["verdict"],
            "rounds": x["rounds"], "samples": x["samples"], "gpu_s": x["gpu_s"],
            "effects": [{k: v.get(k) for k in EFFECT} for v in e.get("effects") or []],
            "noise": [{k: n.get(k) for k in NOISE} for n in e.get("noise") or []],
        })  # fmt: skip
    ws = report["workstream"]
    return {"status": ws["status"], "verdicts": [[v["variant"], v["verdict"]] for v in ws["latest_verdicts"]],
            "experiments": exps}  # fmt: skip


def _pinned(ws: str, got: dict) -> None:
    want = json.loads(PINNED.read_text())[ws]
    assert got["status"] == want["status"] and got["verdicts"] == want["verdicts"]
    assert [(e["todo"], e["kind"], e["status"], e["verdict"], e["rounds"], e["samples"]) for e in got["experiments"]] \
        == [(e["todo"], e["kind"], e["status"], e["verdict"], e["rounds"], e["samples"]) for e in want["experiments"]]
    assert got == want  # every number as pinned (replay is deterministic)


@pytest.mark.parametrize("ws", ["3a", "3b"])
def test_the_shared_closed_run_decides_and_measures_exactly_as_pinned(ws, request, tmp_path, state_dir):
    """The runs the read-only tests share are the same `kinv run ... --backend replay --approval auto` as below."""
    request.getfixturevalue(f"closed_{ws}")  # this test's copy of it, in state_dir
    rep = kinv_in_process(replay_env(tmp_path, state_dir, seed_config=False), "report", ws, "--json")
    assert rep.returncode == 0, rep.stderr
    _pinned(ws, outcome(json.loads(rep.stdout)))


# the fault drill's and the null drill's outcomes are pinned by the tests that already run them (test_faults.py,
# tests/agent/cli/test_run.py): one replay run of each serves both checks
@pytest.mark.slow
@pytest.mark.parametrize("ws", ["4a"])
def test_a_replayed_workstream_decides_and_measures_exactly_as_pinned(ws, tmp_path):
    # #6a plants source patches: every run here is of a copy of the project, never of this checkout
    root, pythonpath = project_copy(tmp_path / "project")
    env = replay_env(tmp_path, tmp_path / "state", PYTHONPATH=pythonpath)
    for f in (ROOT / "kernels" / "configs").glob("*.json"):  # the other kernels' live configs as shipped
        if not (tmp_path / "configs" / f.name).exists():
            shutil.copy(f, tmp_path / "configs" / f.name)
    run = run_kinv(env, "run", PLANS[ws], "--backend", "replay", "--approval", "auto", timeout=600, cwd=root)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rep = run_kinv(env, "report", ws, "--json")
    assert rep.returncode == 0, rep.stderr
    _pinned(ws, outcome(json.loads(rep.stdout)))


if __name__ == "__main__":  # python -m tests.agent.workstream.test_replay_outcomes 3a=report.json ...: write the pinned file
    import sys

    PINNED.parent.mkdir(exist_ok=True)
    pinned = {a.split("=")[0]: outcome(json.loads(Path(a.split("=")[1]).read_text())) for a in sys.argv[1:]}
    PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
