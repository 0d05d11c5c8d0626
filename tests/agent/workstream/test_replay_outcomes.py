"""The outcomes of #3a, #3b, #3c, #4a and #6a on replay, pinned: verdicts, per-level effects and intervals,
A/A bands, rounds, samples and GPU seconds.  Replay serves recorded samples by round, so a change in how
rounds, arms or seeds are drawn shows here as a changed number.  ``tests/data/replay_outcomes.json`` holds
them as the measurement code produced them before it became one protocol module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, replay_env

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


# #3c's, #4a's and the fault drill's outcomes are pinned on the README session's runs of them (tests/test_readme.py):
# one replay run of each serves both checks


if __name__ == "__main__":  # python -m tests.agent.workstream.test_replay_outcomes 3a=report.json ...: write the pinned file
    import sys

    PINNED.parent.mkdir(exist_ok=True)
    pinned = {a.split("=")[0]: outcome(json.loads(Path(a.split("=")[1]).read_text())) for a in sys.argv[1:]}
    PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
