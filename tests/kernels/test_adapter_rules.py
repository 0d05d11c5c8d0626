"""What kinv knows about a kernel comes from its adapter or its recordings: the environment a plan may expect is
the adapter's rule (a plugin's own variable is checked by the plugin, MLA's TARGET_CTAS only for MLA), and a
close-out names the GPU its recordings name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.kernels.test_plugin import PKG, _write_package

ROOT = Path(__file__).resolve().parents[2]
REF = f"{PKG}.adapter:SplitMatmulAdapter"

SPLIT_ADAPTER = '''

class SplitMatmulAdapter(TiledMatmulAdapter):
    """The demo matmul, reading MATMUL_SPLITS from its environment: 1, 2 or 4."""

    def invalid_env(self, env):
        v = env.get("MATMUL_SPLITS")
        return [] if v is None or v in ("1", "2", "4") else [f"MATMUL_SPLITS={v!r}, which must be 1, 2 or 4"]
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The demo matmul package, importable from its folder (not installed), with an adapter that has an env rule."""
    src = _write_package(tmp_path)
    with open(src / PKG / "adapter.py", "a") as f:
        f.write(textwrap.dedent(SPLIT_ADAPTER))
    monkeypatch.syspath_prepend(str(src))
    return src


def _plan(src: Path, env: dict, name: str = "plan-env.yaml") -> Path:
    data = yaml.safe_load((src / "plan.yaml").read_text())
    data.update(kernel=REF, environment=env)
    path = src / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_plugin_plan_expecting_a_value_its_adapter_refuses_is_bad_input_naming_the_rule(plugin):
    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan

    with pytest.raises(PlanError) as err:
        load_plan(_plan(plugin, {"MATMUL_SPLITS": "3"}))
    said = str(err.value)
    assert "MATMUL_SPLITS" in said and "'3'" in said and "1, 2 or 4" in said, said
    plan, _ = load_plan(_plan(plugin, {"MATMUL_SPLITS": "4"}))
    assert plan.environment == {"MATMUL_SPLITS": "4"}


def test_another_kernels_rule_does_not_apply_to_a_plugin(plugin):
    """TARGET_CTAS is MLA's variable: a plugin's plan may expect any value of it, an MLA plan may not."""
    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan

    plan, _ = load_plan(_plan(plugin, {"TARGET_CTAS": "abc"}))
    assert plan.environment == {"TARGET_CTAS": "abc"}
    data = yaml.safe_load((ROOT / "plans" / "3a-attention-occupancy.yaml").read_text())
    data["environment"] = {"TARGET_CTAS": "abc"}
    mla = plugin / "mla-env.yaml"
    mla.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PlanError, match="TARGET_CTAS"):
        load_plan(mla)


def _env_cmd(src: Path, state: Path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KINV_") and k != "MATMUL_SPLITS"}
    full.update(KINV_STATE_DIR=str(state), KINV_FORCE_NO_GPU="1", PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "env", "--plan", "plan-env.yaml"], env=full,
                          cwd=src, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_kinv_env_applies_the_plugins_rule_to_the_shell(plugin, tmp_path):
    _plan(plugin, {"MATMUL_SPLITS": "4"})
    state = tmp_path / "state"
    bad = _env_cmd(plugin, state, MATMUL_SPLITS="3")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "MATMUL_SPLITS='3'" in lines[0] and "1, 2 or 4" in lines[0], bad.stderr
    assert "Traceback" not in bad.stderr and not state.exists()
    good = _env_cmd(plugin, state, MATMUL_SPLITS="4")
    assert good.returncode == 0, good.stdout + good.stderr


def test_a_replay_close_out_names_the_gpu_its_recordings_name(tmp_path, monkeypatch):
    from kinv.agent.report import figure
    from kinv.agent.workstream import collect as closeout
    from tests.closeout_fixture import FakeReplay, build

    be = FakeReplay([{"fingerprint": {"gpu": "NVIDIA B200", "sms": 148, "l2_bytes": 132 << 20}}])
    measured = {"V1": ("reject", {"b1": ("regressed", -0.3, -0.32, -0.28)})}
    store, plan, state, ctx = build(tmp_path, measured=measured, backend=be)
    titles = []
    monkeypatch.setattr(figure, "plot", lambda data, path, adapter, levels, title="", **kw: titles.append(title))
    text = closeout.write_closeout(store, plan, state, ctx, out_dir=tmp_path / "reports").read_text()
    where = text.split("## Where this was measured")[1].split("##")[0]
    assert "NVIDIA B200 recordings" in where, where
    assert titles and "NVIDIA B200" in titles[0], titles
    assert "H200" not in text


def test_the_peer_figure_is_the_one_measured_on_the_card_in_use():
    from kinv.kernels.adapter import get_adapter

    adapter = get_adapter("mla_decode")
    level = adapter.level({"shape": "v3", "heads": 16, "page_size": 64, "context": 4096, "batch": 32})
    h200 = adapter.peer(level, "NVIDIA H200")
    h100 = adapter.peer(level, "NVIDIA H100 80GB HBM3")
    assert h200 == {"peer": "vLLM Triton MLA decode", "us": 93.1}  # docs/gpu.md's H200 sweep
    assert h100["peer"] == h200["peer"] and 60 < h100["us"] < 120 and h100["us"] != h200["us"]
    assert adapter.peer(level, "NVIDIA RTX PRO 6000 Blackwell") is None and adapter.peer(level, None) is None
