"""A source patch that reaches for the harness, end to end: a variant whose patch adds ``import gc`` to the kernel is
refused by ``kinv check`` (exit 1, the line that names the construct and its line) and by a replay run's gate (never
timed, recorded as incorrect with the line, named in the close-out, the kernel file byte-identical afterwards); a
plan that opts in gets the same patch through the screen, and its close-out says which construct it allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.agent.tools.measure.test_reach import gc_patch
from tests.utils import kinv_in_process, project_copy, replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[3]


def gc_plan(where: Path, **variant) -> tuple[Path, int]:
    """plans/6g.yaml under ``where`` (#6a's shape at one level): the baseline and G1, whose source patch adds
    ``import gc`` to the kernel; returns the plan and the line of the import."""
    patch, line = gc_patch(where)
    p = yaml.safe_load((ROOT / "plans" / "6a-fault-drill.yaml").read_text())
    p["workstream"] = {"id": "#6g", "title": "A source patch that walks the garbage collector is refused"}
    p["workload"]["levels"] = [1]
    p["stats"].update(aa_rounds=8, aa_arms=2)
    p["variants"] = [{"id": "G1", "title": "walks the garbage collector", "source_patch": patch, **variant}]
    f = where / "plans" / "6g.yaml"
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f, line


def test_kinv_check_refuses_a_patch_that_imports_gc_with_its_line(tmp_path, state_dir):
    plan, line = gc_plan(tmp_path)
    r = kinv_in_process(replay_env(tmp_path, state_dir), "check", plan, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    said = (f"G1: kernels/mla_decode.py:{line}: gc reaches for the harness (import gc: the garbage collector hands "
            "out every live object, the harness's timing state too); refused — a plan may allow it with "
            "`allow_harness_reach: [gc]`")  # fmt: skip
    assert said in r.stderr
    assert "G1: correctness gate" not in r.stdout  # refused before its gate ran


@pytest.mark.slow  # a replay run of one level (the baseline's gate in the Triton interpreter, its A/A)
def test_a_run_refuses_the_variant_at_its_gate_and_restores_the_kernel(tmp_path, state_dir):
    root, pythonpath = project_copy(tmp_path / "proj")
    plan, line = gc_plan(root)
    kernel = root / "kernels" / "mla_decode.py"
    before = kernel.read_bytes()
    env = replay_env(tmp_path, state_dir, PYTHONPATH=pythonpath)
    r = run_kinv(env, "run", "plans/6g.yaml", "--backend", "replay", "--approval", "auto", cwd=root, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert kernel.read_bytes() == before
    rep = json.loads(run_kinv(env, "report", "#6g", "--json", cwd=root).stdout)
    exp = next(e["experiment"] for e in rep["experiments"] if e["experiment"]["variant"] == "G1")
    assert (exp["verdict"], exp["samples"]) == ("incorrect", 0)
    assert f"kernels/mla_decode.py:{line}: gc reaches for the harness" in exp["reason"]
    closeout = (state_dir / "reports" / "6g-closeout.md").read_text()
    assert f"**incorrect** — kernels/mla_decode.py:{line}: gc reaches for the harness (import gc" in closeout


def test_kinv_check_lets_an_allowed_construct_through_and_says_so(tmp_path, state_dir):
    plan, line = gc_plan(tmp_path, allow_harness_reach=["gc"])
    r = kinv_in_process(replay_env(tmp_path, state_dir), "check", plan, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"kernels/mla_decode.py:{line}: gc reaches for the harness (import gc: the garbage collector hands out "
            "every live object, the harness's timing state too); allowed by the plan (allow_harness_reach: [gc])"
            in r.stdout)  # fmt: skip
    assert "G1: correct" in r.stdout


def test_the_closeout_names_each_construct_the_plan_allowed():
    from kinv.agent.plan_sections import Variant
    from kinv.agent.report.closeout import _reach_lines

    line = "kernels/mla_decode.py:5: gc reaches for the harness (import gc: ...); allowed by the plan (...)"
    events = [{"kind": "reach.allowed", "message": line, "data": json.dumps({"variant": "G1"})}] * 2 + [
        {"kind": "reach.allowed", "message": "other", "data": json.dumps({"variant": "G2"})}]
    v = Variant(id="G1", title="x", source_patch="plans/patches/gc.diff", allow_harness_reach=["gc"])
    assert _reach_lines(events, v) == [
        "Allowed to reach for the harness by the plan (allow_harness_reach: `gc`); the static screen let through:",
        f"- {line}", ""]
    assert _reach_lines([], v)[0].endswith("no gate of this run found one.")
    assert _reach_lines(events, Variant(id="G1", title="x")) == []
