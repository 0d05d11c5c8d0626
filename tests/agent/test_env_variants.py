"""Variants over environment variables: a variant's ``env`` is given to its own processes only (its gate, its
workers), the env check confirms it there, the close-out and the approval diff say it, and a backend that cannot
serve that environment refuses it with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kinv.agent.plan_file import load_plan
from tests.utils import kinv_in_process, replay_env, run_kinv

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "plans" / "3e-target-ctas.yaml"


def test_a_variant_gets_the_plans_environment_with_its_own_values_on_top():
    plan, _ = load_plan(PLAN)
    assert plan.environment == {"TARGET_CTAS": "512"}
    assert {v.id: plan.variant_env(v)["TARGET_CTAS"] for v in plan.variants} == {
        "S128": "128", "S256": "256", "S1024": "1024", "S2048": "2048"}  # fmt: skip
    assert all(plan.variant_config(v) == {**plan.baseline, "kernel": "mla_decode"} for v in plan.variants)


@pytest.mark.parametrize("env, says", [
    ({"target ctas": "1"}, "'target ctas' is not an environment variable name"),
    ({"TARGET_CTAS": "many"}, "TARGET_CTAS"),
])  # fmt: skip
def test_a_bad_variant_environment_is_refused_with_one_line_naming_the_variant(tmp_path, env, says):
    data = yaml.safe_load(PLAN.read_text())
    data["variants"][0]["env"] = env
    bad = tmp_path / "plan.yaml"
    bad.write_text(yaml.safe_dump(data))
    r = kinv_in_process(replay_env(tmp_path, tmp_path / "state"), "run", str(bad), "--backend", "replay")
    assert r.returncode == 2 and "variants.S128.env" in r.stderr and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "state" / "kinv.db").exists()


@pytest.mark.slow
def test_replay_refuses_an_environment_it_never_recorded_and_the_close_out_says_what_was_asked(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    cfg = tmp_path / "configs" / "mla_decode.json"
    before = cfg.read_bytes()
    run = run_kinv(env, "run", PLAN, "--backend", "replay", "--approval", "auto", timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "S1024: patched to BT16/BH16/w4/s2 with TARGET_CTAS=1024 in its processes" in run.stdout
    assert "S1024: not measured: replay has no recording with TARGET_CTAS='1024'" in run.stdout
    text = (tmp_path / "state" / "reports" / "3e-closeout.md").read_text()
    assert "TARGET_CTAS=2048 in its processes (the baseline's: 512)" in text
    assert cfg.read_bytes() == before  # nothing left patched
