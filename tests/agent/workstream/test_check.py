"""``kinv check PLAN``: a plan checked end to end without timing anything, on a machine with no GPU and no recording
of its kernel: every arm's config at every level, the gate of the baseline and every variant, each edit as its
approval would show it, and a close-out skeleton that says nothing was timed.  Exit 0, 1 (a gate failed: the line
names the variant and the level) or 2 (bad input, nothing written)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.utils import kinv_in_process, replay_env

# A plugin nobody recorded: its "kernel" is torch (the gate is the point, not Triton), and BLOCK=128 is a bug.
PLUGIN = """
import torch

from kinv.kernels import quick


def make_inputs(level, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(level.N, generator=g).to(device=device, dtype=dtype), "scale": 2.0}


def launch(inputs, p, out=None):
    x = inputs["x"]
    out = torch.empty_like(x) if out is None else out
    out.copy_(x * inputs["scale"] + (1.0 if p.BLOCK == 128 else 0.0))
    return out


def reference(inputs):
    return inputs["x"].float() * inputs["scale"]


Doubler = quick.kernel("doubler", tunables={"BLOCK": [32, 64, 128]}, default={"BLOCK": 32},
                       levels=[{"N": 100}, {"N": 1000}], make_inputs=make_inputs, launch=launch,
                       reference=reference)
"""

PLAN = {
    "workstream": {"id": "#40a", "title": "Block size of a doubler"},
    "kernel": "kinv_doubler.adapter:Doubler",
    "hypothesis": "A larger block does more per program.",
    "device": "sm_90",
    "workload": {},
    "baseline": {"BLOCK": 32},
    "variants": [
        {"id": "V1", "title": "BLOCK 64", "patch": {"BLOCK": 64}},
        {"id": "V2", "title": "BLOCK 128", "patch": {"BLOCK": 128}},
    ],
}


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """The plugin's folder, importable in this process (as a plan's package.module:Class is from its project)."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "kinv_doubler").mkdir()
    (root / "kinv_doubler" / "__init__.py").write_text("")
    (root / "kinv_doubler" / "adapter.py").write_text(textwrap.dedent(PLUGIN))
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))


def _plugin(tmp_path, plugin_dir, variants=None) -> tuple[Path, dict]:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({**PLAN, "variants": variants or PLAN["variants"]}, sort_keys=False))
    return plan, replay_env(tmp_path, tmp_path / "state")


def test_a_check_of_an_unrecorded_plugin_runs_every_gate_and_names_the_variant_and_level_that_fail(
    tmp_path, plugin_dir
):
    plan, env = _plugin(tmp_path, plugin_dir)
    r = kinv_in_process(env, "check", plan)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "a gate failed: V2 at N100" in line and "nothing was timed" in line
    assert "V1: correct at 2 level(s) (cpu" in r.stdout  # V1's gate ran and passed
    assert "NOTHING WAS TIMED" in r.stdout
    # each edit shown as kinv pending shows an approval: the live file's diff (written from the declared default)
    assert '-  "BLOCK": 32\n+  "BLOCK": 64' in r.stdout or "does not exist yet" in r.stdout
    skeleton = (tmp_path / "state" / "checks" / "40a-check.md").read_text()
    assert skeleton.startswith("# #40a check") and "**NOTHING WAS TIMED.**" in skeleton
    assert "| V2 | N100 | — | — | would not run (gate failed) |" in skeleton
    assert "| V1 | N1000 | — | — | not timed |" in skeleton
    assert not (tmp_path / "state" / "kinv.db").exists()  # nothing recorded as if it had run


def test_a_check_where_every_gate_passes_exits_0_and_says_json_what_runs_where(tmp_path, plugin_dir):
    plan, env = _plugin(tmp_path, plugin_dir, variants=[PLAN["variants"][0]])
    r = kinv_in_process(env, "check", plan, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert out["ok"] is True and out["timed"] is False and out["device"] == "cpu"
    assert [a["name"] for a in out["arms"]] == ["baseline", "V1"]
    assert [lv["runs"] for lv in out["arms"][1]["levels"]] == ["BLOCK64", "BLOCK64"]


def test_a_bad_plan_is_refused_in_one_line_and_nothing_is_written(tmp_path, plugin_dir):
    plan, env = _plugin(tmp_path, plugin_dir, variants=[{"id": "V1", "title": "no such block", "patch": {"BLOCK": 48}}])
    r = kinv_in_process(env, "check", plan)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "variants.V1.patch" in r.stderr and not (tmp_path / "state" / "checks").exists()


def test_without_a_gpu_an_unrecorded_plugin_is_pointed_at_kinv_check_not_at_other_kernels_recordings(
    tmp_path, plugin_dir
):
    plan, env = _plugin(tmp_path, plugin_dir)
    r = kinv_in_process(env, "run", plan, "--backend", "cuda")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "doubler has no recording to replay" in r.stderr and "kinv check PLAN" in r.stderr
    assert "h200" not in r.stderr


def test_listing_and_checking_never_write_into_a_plugins_source_tree_and_a_run_writes_the_default_once(
    tmp_path, plugin_dir, monkeypatch
):
    from kinv.kernels.adapter import get_adapter

    monkeypatch.delenv("KINV_CONFIG_DIR", raising=False)
    adapter = get_adapter("kinv_doubler.adapter:Doubler")
    path = adapter.config_path()
    assert path == plugin_dir / "kinv_doubler" / "configs" / "doubler.json" and not path.exists()
    assert adapter.ensure_config() == path and json.loads(path.read_text()) == {"kernel": "doubler", "BLOCK": 32}
    path.unlink()
    path.parent.rmdir()


def test_kinv_kernels_piped_prints_blocks_not_a_table_padded_to_its_widest_cell(tmp_path):
    r = kinv_in_process(replay_env(tmp_path, tmp_path / "state"), "kernels")
    assert r.returncode == 0 and "mla_decode (kinv.kernels.mla_decode_adapter:MLADecodeAdapter)" in r.stdout
    lines = r.stdout.splitlines()
    assert not [ln for ln in lines if ln != ln.rstrip()]  # no padding
    assert "  tunables: BLOCK_T 16/32/64/128/256;" in r.stdout


@pytest.mark.slow  # about 15 s each on a loaded 2-core machine: the interpreter runs every arm at every level
@pytest.mark.parametrize("plan", ["plan-outer-product.yaml", "plan-outer-product-autotune.yaml"])
def test_pytorchs_own_triton_kernel_checks_on_cpu_through_both_short_paths(tmp_path, plan):
    """examples/torch_kernels: a Triton kernel nobody here wrote, imported from the installed torch, through
    quick.kernel and through from_autotune (a batch dimension beyond the autotune key), checked without a GPU."""
    root = Path(__file__).resolve().parents[3]
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "check", root / "examples" / "torch_kernels" / plan, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert out["ok"] and out["device"] == "cpu" and len(out["arms"]) == 3
    assert all(a["gate"]["ok"] for a in out["arms"])


def test_a_check_names_the_public_replacement_of_a_plugins_private_imports(tmp_path, plugin_dir):
    """The plugin imports kinv.kernels.quick, which is internal: the check names kinv.plugin's kernel instead."""
    plan, env = _plugin(tmp_path, plugin_dir, variants=[PLAN["variants"][0]])
    r = kinv_in_process(env, "check", plan, "--json")
    out = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert out["plugin_imports"] == ["kinv_doubler/adapter.py:4: private import from kinv.kernels: import kernel, "
                                     "from_autotune from kinv.plugin"]  # fmt: skip


def test_on_cpu_the_resource_lines_say_registers_are_unknown_and_the_premise_is_not_judged(monkeypatch):
    """#3a's V1 (8 warps): on CPU the model sees shared memory alone (6 CTAs/SM, 24 -> 48 warps/SM), while the
    compiled kernel on an H100 is register-limited (16 -> 16): each line says what it does not know."""
    from kinv.agent.plan_file import load_plan
    from kinv.agent.report.check import predicted_lines
    from kinv.agent.workstream import check

    monkeypatch.setattr(check, "gpu_visible", lambda: False)
    plan, _ = load_plan(str(Path(__file__).resolve().parents[3] / "plans" / "3a-attention-occupancy.yaml"))
    v1 = plan.variant("V1")
    base = {**plan.baseline, "kernel": plan.adapter.name}
    lines = predicted_lines(check._resources(plan, plan.adapter, base, plan.variant_config(v1)))
    assert lines[-1].endswith("CTAs/SM 6 -> 6, warps/SM 24 -> 48 (limited by shared_memory -> shared_memory; "
                              "registers unknown on CPU: occupancy from shared memory and thread limits only)")  # fmt: skip
    assert all("registers unknown on CPU" in ln for ln in lines)
    assert check._premise(plan.adapter, v1) == ("premise occupancy (warps per SM up, achieved occupancy up): not judged "
                                                "on CPU; a run reads it from the compiled kernel (registers included) "
                                                "and its profile")  # fmt: skip
