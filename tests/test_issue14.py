"""Issue 14: the MLA kernel kinv ships is the one kinv measured and adopted on the H200.

These tests read the state kinv wrote live on the H200 for #8a and #8b (benchmarks/results/issue14_kinv_h200.db,
copied into a temporary state dir): the shipped config and kernel source must be what those workstreams
accepted, and `kinv adopt` must refuse what they did not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kinv.agent.store import Store
from kinv.kernels.launch_config import config_hash, load_config
from tests.utils import replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[1]
H200_DB = ROOT / "benchmarks" / "results" / "issue14_kinv_h200.db"


def _h200_state(tmp_path) -> tuple[dict, Path]:
    """A state dir holding the H200's kinv.db of #8a/#8b, its plan paths pointed at this checkout."""
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(H200_DB, state / "kinv.db")
    store = Store(state)
    for ws, plan in (("#8a", "8a-decode-source.yaml"), ("#8b", "8b-decode-configs.yaml")):
        store.update_workstream(ws, plan_path=str(ROOT / "plans" / plan))
    store.close()
    return replay_env(tmp_path, state), state


def _verdicts(tmp_path, ws: str) -> dict[str, str]:
    shutil.copy(H200_DB, tmp_path / "kinv.db")
    store = Store(tmp_path)
    try:
        return {e["variant"]: e["verdict"] for e in store.experiments(ws) if e["kind"] == "ab"}
    finally:
        store.close()


def test_the_shipped_config_is_8b_v1_which_kinv_accepted_on_the_h200(tmp_path):
    from kinv.agent.models import load_plan

    plan, _ = load_plan(ROOT / "plans" / "8b-decode-configs.yaml")
    shipped = load_config(ROOT / "kernels" / "configs" / "mla_decode.json")
    assert config_hash(shipped) == config_hash(plan.variant_config(plan.variant("V1")))
    assert _verdicts(tmp_path, "#8b") == {"V1": "accept"}
    # the source it runs on is #8a's patch, the variant that won everywhere; the others were mixed
    assert _verdicts(tmp_path, "#8a") == {"S1": "mixed", "S2": "mixed", "S3": "accept"}


def test_adopt_refuses_a_mixed_source_patch_and_shows_the_accepted_one(tmp_path):
    env, _ = _h200_state(tmp_path)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
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
