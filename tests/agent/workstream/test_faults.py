"""Faulty variants and integrity: the fault drill on replay + the interpreter.

Each planted fault is stopped at its gate and recorded with its reason, the baseline source and config
are restored byte for byte, and the investigation still closes out with the sound variant decided.
The drill runs in a copy of the project's kernels/ and plans/ so the repository is never patched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinv.agent.workstream.context import _integrity
from tests.utils import project_copy

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[3]


def tree_hash(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(d.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(d)).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def drill(tmp_path, state_dir):
    root, pythonpath = project_copy(tmp_path / "project")  # kinv.kernels = the copy
    env = dict(os.environ, KINV_STATE_DIR=str(state_dir), KINV_CONFIG_DIR=str(root / "kernels" / "configs"),
               TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", KINV_RECORDINGS=str(ROOT / "kernels" / "recordings"),
               PYTHONPATH=pythonpath)  # fmt: skip
    return root, env


def kinv(root, env, *args):
    return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *args], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_fault_drill_records_each_fault_restores_the_baseline_and_closes_out(drill):
    root, env = drill
    before = tree_hash(root / "kernels")
    r = kinv(root, env, "run", "plans/6a-fault-drill.yaml", "--backend", "replay", "--approval", "auto")
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree_hash(root / "kernels") == before  # kernel sources and config byte-identical
    # every patch and backup was of the copy's files, never of the checkout the copy was made from
    files = {b["path"] for b in json.loads(kinv(root, env, "backups", "--json").stdout)}
    assert files and all(f.startswith(str(root)) for f in files), files
    exps = {e["variant"]: e for e in json.loads(kinv(root, env, "experiments", "6a", "--json").stdout)}
    assert exps["F1"]["verdict"] == "failed" and "compile" in exps["F1"]["reason"]
    assert exps["F2"]["verdict"] == "infeasible" and "shared memory" in exps["F2"]["reason"] and "227.0 KB" in exps["F2"]["reason"]
    assert exps["F3"]["verdict"] == "incorrect" and "outside atol" in exps["F3"]["reason"]  # fast but wrong: never timed
    assert exps["F4"]["verdict"] == "crashed" and "signal 11" in exps["F4"]["reason"]
    # edits the reference: no verdict may stand. A source patch may only touch the adapter's kernel_files, so the
    # reference edit is refused before anything runs (integrity would void it if it ever ran: see the test below)
    assert exps["F5"]["verdict"] in ("failed", "void", "not measured") and exps["F5"]["samples"] == 0
    assert "kernels/mla_decode_ref.py" in exps["F5"]["reason"] and "may only patch" in exps["F5"]["reason"]
    # lazy: writes nothing; its output buffer was poisoned with NaN, so no earlier result can pass for it
    assert exps["F6"]["verdict"] == "incorrect" and "not finite" in exps["F6"]["reason"]
    assert exps["V1"]["verdict"] == "accept"
    assert exps["F7"]["verdict"] == "failed" and "patch failed" in exps["F7"]["reason"]  # stale patch: no wedge
    # the known ways to fool a benchmark that a CPU check can show are failed at the gate, with what caught them
    assert exps["F9"]["verdict"] == "incorrect" and "rewritten in place at the same addresses" in exps["F9"]["reason"]
    assert exps["F10"]["verdict"] == "incorrect" and "outside atol" in exps["F10"]["reason"]
    assert exps["F11"]["verdict"] == "incorrect" and "replaced the harness's timer" in exps["F11"]["reason"]
    # a side stream (no stream on CPU) and a subset wrong past 2048 tokens (the stand-in has 64) pass the CPU
    # check; the recordings hold no times for their source, so neither gets a verdict (live, the GPU gate fails them)
    for fid in ("F8", "F12"):
        assert exps[fid]["verdict"] in ("not measured", "failed", "void"), exps[fid]
    for fid in ("F1", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "F10", "F11", "F12"):
        assert exps[fid]["samples"] == 0, f"{fid} was timed"
    store_dir = Path(env["KINV_STATE_DIR"])
    closeout = (store_dir / "reports" / "6a-closeout.md").read_text()
    assert "**F5** (edits the reference it is judged against): **failed**" in closeout
    assert "may only patch the kernel's files" in closeout
    status = json.loads(kinv(root, env, "status", "--json").stdout)
    ws = next(w for w in status["workstreams"] if w["id"] == "#6a")
    assert ws["status"] == "closed" and not ws["pending_approvals"]
    # and every number it decided and measured is as pinned (the drill's one replay run serves both checks)
    from tests.agent.workstream.test_replay_outcomes import _pinned, outcome

    rep = kinv(root, env, "report", "6a", "--json")
    assert rep.returncode == 0, rep.stderr
    _pinned("6a", outcome(json.loads(rep.stdout)))


def _rows(harness, reference):
    return [{"harness_hash": harness, "reference_hash": reference}]


class _Store:
    def __init__(self, rows):
        self.rows = rows

    def samples(self, exp):
        return self.rows


def test_integrity_voids_a_changed_harness_or_reference_and_passes_an_unchanged_run():
    base = {"harness": "h0", "reference": "r0"}
    assert _integrity(_Store(_rows("h0", "r0")), 1, base) is None
    assert "benchmark harness changed" in _integrity(_Store(_rows("h1", "r0")), 1, base)
    assert "reference changed" in _integrity(_Store(_rows("h0", "r9")), 1, base)
