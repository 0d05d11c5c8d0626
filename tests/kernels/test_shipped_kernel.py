"""The MLA kernel kinv ships is the one kinv measured and adopted on the H200.

These tests read the state kinv wrote live on the H200 for #8a and #8b
(tests/fixtures/h200-state/mla-decode-source-and-configs.db) and for #9a-#9c (mla-decode-source-and-merge.db,
mla-decode-shape.db), copied into a temporary state dir: the shipped config and kernel source must be what those workstreams
accepted, and `kinv adopt` must refuse what they did not.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from kinv.agent.store.db import Store
from kinv.kernels.launch_config import config_hash, load_config
from tests.utils import kinv_in_process as run_kinv
from tests.utils import replay_env

ROOT = Path(__file__).resolve().parents[2]
H200_STATE = ROOT / "tests" / "fixtures" / "h200-state"  # kinv.db files written live on the H200
H200_DB = H200_STATE / "mla-decode-source-and-configs.db"  # #8a, #8b
H200_DB_9 = H200_STATE / "mla-decode-source-and-merge.db"  # #9a, #9b
H200_DB_9C = H200_STATE / "mla-decode-shape.db"  # #9c
MEASURED_PLANS = ROOT / "tests" / "fixtures" / "h200-plans"  # #8a, #8b as measured


def _h200_state(tmp_path) -> tuple[dict, Path]:
    """A state dir holding the H200's kinv.db of #8a/#8b, its plan paths pointed at the plans as they were measured
    (tests/fixtures/h200-plans: the bytes whose hashes that kinv.db holds)."""
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(H200_DB, state / "kinv.db")
    store = Store(state)
    for ws, plan in (("#8a", "8a-decode-source.yaml"), ("#8b", "8b-decode-configs.yaml")):
        store.update_workstream(ws, plan_path=str(MEASURED_PLANS / plan))
    store.close()
    return replay_env(tmp_path, state), state


def _verdicts(tmp_path, ws: str, db: Path = H200_DB) -> dict[str, str]:
    shutil.copy(db, tmp_path / "kinv.db")
    store = Store(tmp_path)
    try:
        return {e["variant"]: e["verdict"] for e in store.experiments(ws) if e["kind"] == "ab"}
    finally:
        store.close()


def _code(line: str) -> str:
    """A line of Python without its comment and surrounding blanks."""
    return line.split("#", 1)[0].strip()


def test_the_shipped_config_and_source_are_what_kinv_accepted_on_the_h200(tmp_path):
    # the chain: #8a S3 (source) and #8b V1 (config), then #9a S1 (source), #9b V1 (config: MERGE from batch 64)
    # and #9c V1 (mixed: adopted where it won, V3 at batch 96), each `kinv adopt`ed from a live H200 run
    from kinv.agent.plan_file import load_plan
    from kinv.agent.workstream import planner

    assert _verdicts(tmp_path, "#8b") == {"V1": "accept"}
    assert _verdicts(tmp_path, "#8a") == {"S1": "mixed", "S2": "mixed", "S3": "accept"}
    assert _verdicts(tmp_path, "#9a", H200_DB_9) == {"S1": "accept"}
    assert _verdicts(tmp_path, "#9b", H200_DB_9) == {"V1": "accept"}
    assert _verdicts(tmp_path, "#9c", H200_DB_9C) == {"V1": "mixed"}
    plan_9b, _ = load_plan(ROOT / "plans" / "9b-decode-merge.yaml")
    plan_9c, _ = load_plan(ROOT / "plans" / "9c-decode-shape.yaml")
    # #9c measured against #9b's adopted config, and what it adopted is V1 at the levels it improved
    assert config_hash(plan_9c.baseline) == config_hash(plan_9b.variant_config(plan_9b.variant("V1")))
    shutil.copy(H200_DB_9C, tmp_path / "kinv.db")
    store = Store(tmp_path)
    try:
        exp = next(e for e in store.experiments("#9c") if e["kind"] == "ab")
        levels = {v["level"]: v["verdict"] for v in store.verdicts(exp["id"])}
    finally:
        store.close()
    adopted = planner.level_conditional(plan_9c, plan_9c.variant("V1"), levels)
    shipped = load_config(ROOT / "kernels" / "configs" / "mla_decode.json")
    # the shipped file pins V1's override to b96 (the proposal of its day); today's proposal covers b65-96, the
    # batches between the measured levels too: at every level #9c measured, both run the same launch
    a = plan_9c.adapter
    for lv in plan_9c.levels():
        assert a.params_for(shipped, lv).short() == a.params_for(adopted, lv).short(), lv.key
    # the source it runs on is #9a's accepted S1: every line of code its patch adds is in the shipped kernel
    # (code, not comments: a comment edit changes no kernel #9b and #9c measured)
    plan_9a, _ = load_plan(ROOT / "plans" / "9a-decode-source.yaml")
    patch = Path(plan_9a.variant("S1").source_patch)
    patch = patch if patch.is_absolute() else ROOT / patch
    shipped_text = (ROOT / "kernels" / "mla_decode.py").read_text()
    doc_end = ast.parse(shipped_text).body[0].end_lineno  # the module docstring is prose, reworded since
    added, line = [], 0
    for ln in patch.read_text().splitlines():
        if ln.startswith("@@"):
            line = int(ln.split("+", 1)[1].split(",")[0])
        elif ln.startswith("+") and not ln.startswith("+++"):
            if line > doc_end:
                added.append(_code(ln[1:]))
            line += 1
        elif not ln.startswith("-") and line:
            line += 1
    assert len(added) > 20  # the patch's code, not only its prose
    shipped_code = {_code(ln) for ln in shipped_text.splitlines()}
    assert [ln for ln in added if ln and ln not in shipped_code] == [], "the shipped kernel is not #9a's S1"


def test_adopt_refuses_a_mixed_source_patch_and_shows_the_accepted_one(tmp_path):
    from kinv.agent.plan_file import load_plan

    env, _ = _h200_state(tmp_path)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    # the live file is the config #8a measured its source patches with (a source change is adopted only then)
    plan, _ = load_plan(ROOT / "plans" / "8a-decode-source.yaml")
    cfg.write_text(json.dumps({"kernel": "mla_decode", **plan.baseline}, indent=2) + "\n")
    before = cfg.read_bytes()
    r = run_kinv(env, "adopt", "8a", "S1", "--yes")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "mixed and carries a source patch" in r.stderr and "Traceback" not in r.stderr
    shown = run_kinv(env, "adopt", "8a", "S3", "--json")  # review only: nothing is written
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    text = json.dumps(data)
    assert "8a-kernel-source.diff" in text and "+9.76%" in text and "+12.06%" in text
    assert cfg.read_bytes() == before


def test_bench_shows_the_peer_kernel_beside_each_level_it_has_a_figure_for(tmp_path):
    # the seed's config on replay (recorded on the H200): every level of #3a's workload has a vLLM figure
    from tests.utils import SEED_MLA_CONFIG

    cfg = tmp_path / "seed.json"
    cfg.write_text(SEED_MLA_CONFIG)
    env = replay_env(tmp_path, tmp_path / "state")
    r = run_kinv(env, "bench", "--backend", "replay", "--config", cfg, "--samples", "3", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["level"].rsplit("/", 1)[1]: row for row in json.loads(r.stdout)}
    assert rows["b1"]["peer"] == "vLLM Triton MLA decode" and rows["b1"]["peer_us"] == 25.8
    for row in rows.values():
        assert abs(row["vs_peer"] - row["peer_us"] / row["us"]) < 1e-9 and 0 < row["frac_copy"] < 1
    text = run_kinv(env, "bench", "--backend", "replay", "--config", cfg, "--samples", "3").stdout
    assert "vLLM Triton MLA decode 264.8 µs" in text  # b96, in the table a person reads
