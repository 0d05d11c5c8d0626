"""examples/quick_rmsnorm: a small, memory-bound Triton kernel (a row-wise RMSNorm) as a kinv plugin.

Its reference is checked against torch's own ``rms_norm``, its kernel against the reference on odd shapes (a row
count that is not a multiple of the rows per program, a hidden size that is not a multiple of the block), and its
plan end to end with ``kinv check``: the package built and installed with ``pip install --target`` into a temporary
folder (never into the shared venv), found by its entry point through PYTHONPATH, every arm's correctness gate run
in the Triton interpreter.  A source patch with a real RMSNorm bug (the mean taken over the block instead of the row)
is caught by the gate, and a config outside the kernel's restriction is refused as bad input.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.utils import run_kinv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quick_rmsnorm"
PKG = "kinv_quick_rmsnorm"
REF = f"{PKG}.adapter:QuickRmsnorm"
BASE = {"BLOCK_N": 4096, "ROWS_PER_PROGRAM": 1, "num_warps": 4}
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="a GPU is visible: Triton kernels are not interpreted")


def _copy_example(dest: Path) -> Path:
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", "recordings", "*.egg-info", "build"))
    return dest


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """A copy of the example package, importable in this process."""
    src = _copy_example(tmp_path_factory.mktemp("rmsnorm") / "quick_rmsnorm")
    sys.path.insert(0, str(src))
    try:
        yield src
    finally:
        sys.path.remove(str(src))


def _adapter():
    from kinv.kernels.adapter import get_adapter

    return get_adapter(REF)


# --------------------------------------------------------------------------- #
# the kernel and its reference
# --------------------------------------------------------------------------- #
def test_the_adapter_declares_rows_as_its_level_and_x_as_the_input_that_changes(example):
    a = _adapter()
    assert a.name == "quick_rmsnorm" and a.level_dims == ("rows", "hidden") and a.throughput_unit == "GB/s"
    assert [(t.name, t.abbr) for t in a.spec.tunables] == [("BLOCK_N", "BN"), ("ROWS_PER_PROGRAM", "RPP"),
                                                           ("num_warps", "w")]  # fmt: skip
    levels = a.levels(a.workload_model().model_validate({}))
    assert [a.level_label(lv.dims) for lv in levels] == ["rows4096", "rows8192", "rows16384"]  # hidden is fixed
    assert a.bytes_moved(levels[0]) == 2 * (2 * 4096 * 4096) + 2 * 4096  # bf16 x in, y out, and the weight
    assert a.stand_in(levels[2], "cpu").key == "rows64/hidden4096"  # the real hidden size: both paths run on CPU
    inputs = a.make_inputs(a.level({"rows": 2, "hidden": 8}), 0, "cpu")
    assert a.fresh_names(inputs) == ["x"]  # refreshed before every timed launch (undeclared: the weight, the smallest)
    assert json.loads((EXAMPLE / PKG / "configs" / "quick_rmsnorm.json").read_text()) == {"kernel": a.name, **BASE}
    assert not a.spec.restrictions[0].check({"BLOCK_N": 8192, "ROWS_PER_PROGRAM": 4, "num_warps": 4})


@interpreted
@pytest.mark.parametrize("rows, hidden", [(37, 1000), (1, 4096), (64, 4096), (5, 100)])
@pytest.mark.parametrize("cfg", [BASE, {"BLOCK_N": 256, "ROWS_PER_PROGRAM": 4, "num_warps": 8},
                                 {"BLOCK_N": 1024, "ROWS_PER_PROGRAM": 2, "num_warps": 4}])  # fmt: skip
def test_the_kernel_agrees_with_the_reference_and_the_reference_with_torchs_rms_norm(example, rows, hidden, cfg):
    import torch

    a = _adapter()
    level = a.level({"rows": rows, "hidden": hidden})
    inputs = a.make_inputs(level, 7, "cpu")
    x, w = inputs["x"], inputs["w"]
    assert x.dtype == torch.float16  # bf16 runs as fp16 in the interpreter
    ref = a.reference(inputs)
    torch.testing.assert_close(ref, torch.nn.functional.rms_norm(x.float(), (hidden,), w.float(), inputs["eps"]),
                               atol=1e-5, rtol=1e-5)  # fmt: skip
    out, _ = a.launch(inputs, a.params_for(a.validate_config({"kernel": a.name, **cfg}), level))
    assert out.dtype == x.dtype and out.shape == (rows, hidden)
    atol, rtol = a.tolerance(x.dtype)
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)  # says how many elements differ, and where


@interpreted
def test_the_gate_passes_the_kernel_at_an_odd_level_and_fails_one_that_drops_the_weight(example):
    from kinv.agent.tools.worker.gate import check
    from kinv.kernels import quick

    m = importlib.import_module(f"{PKG}.adapter")
    a = _adapter()
    odd = [a.level({"rows": 37, "hidden": 1000})]
    cfg = {"kernel": a.name, "BLOCK_N": 256, "ROWS_PER_PROGRAM": 4, "num_warps": 8}
    res = check(a, cfg, odd, seed=3, device="cpu")
    assert res["ok"] and res["levels"][0]["ran"] == "rows37/hidden1000", res

    def unweighted(inputs, p, out=None):  # a launch that forgets the weight: RMSNorm without its scale
        return m.launch({**inputs, "w": inputs["w"].new_ones(inputs["w"].shape)}, p, out)

    wrong = quick.kernel("rmsnorm_unweighted", tunables={"BLOCK_N": [256], "ROWS_PER_PROGRAM": [4], "num_warps": [8]},
                         default={"BLOCK_N": 256, "ROWS_PER_PROGRAM": 4, "num_warps": 8},
                         levels=[{"rows": 37, "hidden": 1000}], make_inputs=m.make_inputs, launch=unweighted,
                         reference=m.reference, dtype="bfloat16", module=f"{PKG}.adapter")()  # fmt: skip
    res = check(wrong, {**cfg, "kernel": wrong.name}, odd, seed=3, device="cpu")
    assert not res["ok"] and "outside atol" in res["reason"], res


# --------------------------------------------------------------------------- #
# installed, found by its entry point, its plan checked with kinv check
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example installed with ``pip install --target`` into a temporary folder, and the environment of a kinv
    process that finds it by its entry point (PYTHONPATH) and runs its gates in the Triton interpreter."""
    root = tmp_path_factory.mktemp("rmsnorm-installed")
    src = _copy_example(root / "src")
    target = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(target), str(src)]  # fmt: skip
    r = subprocess.run(pip, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("KINV_")}
    env.update(TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", KINV_STATE_DIR=str(root / "state"),
               PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))  # fmt: skip
    work = root / "work"
    work.mkdir()
    return target, env, work


def _json(stdout: str) -> dict:
    return json.loads(stdout[: stdout.rindex("}") + 1])


def test_kinv_check_of_the_example_plan_passes_every_arms_gate(installed):
    target, env, work = installed
    r = run_kinv(env, "check", EXAMPLE / "plan.yaml", "--json", cwd=work, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = _json(r.stdout)
    assert out["ok"] and out["timed"] is False and out["device"] == "cpu" and out["kernel"] == "quick_rmsnorm"
    assert [a["name"] for a in out["arms"]] == ["baseline", "V1", "V2", "V3"]
    assert [a["config"] for a in out["arms"]] == ["BN4096/RPP1/w4", "BN4096/RPP1/w8", "BN4096/RPP2/w4",
                                                  "BN1024/RPP1/w4"]  # fmt: skip
    for arm in out["arms"]:
        assert arm["gate"]["ok"] and arm["gate"]["dtype"] == "float16", arm["gate"]
        assert [lv["ran"] for lv in arm["gate"]["levels"]] == ["rows64/hidden4096"] * 3
        assert [lv["label"] for lv in arm["levels"]] == ["rows4096", "rows8192", "rows16384"]
    assert (target / PKG / "configs" / "quick_rmsnorm.json").read_text() == (
        EXAMPLE / PKG / "configs" / "quick_rmsnorm.json").read_text()  # fmt: skip


def _mean_over_the_block(kernel: Path) -> str:
    """A unified diff of kernel.py whose two-walk path divides the sum of squares by BLOCK_N instead of the row's
    hidden size: right whenever one block covers the row, wrong at hidden 4096 with a 1024 block."""
    old = kernel.read_text()
    new = old.replace("tl.sum(acc, axis=1) / hidden", "tl.sum(acc, axis=1) / BLOCK_N")
    assert new != old
    rel = f"{PKG}/kernel.py"
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))


def _plan(work: Path, name: str, variants: list[dict]) -> Path:
    plan = yaml.safe_load((EXAMPLE / "plan.yaml").read_text())
    plan.pop("allowed")
    plan["variants"] = variants
    path = work / name
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


@pytest.mark.slow  # the patched copy is gated beside the baseline: about 12 s alone, 30 s on a busy machine
def test_kinv_check_fails_a_source_patch_that_takes_the_mean_over_the_block_and_leaves_the_kernel_as_it_was(installed):
    target, env, work = installed
    kernel = target / PKG / "kernel.py"
    before = kernel.read_bytes()
    (work / "plans").mkdir(exist_ok=True)
    (work / "plans" / "mean-over-block.diff").write_text(_mean_over_the_block(kernel))
    plan = _plan(work, "wrong.yaml", [{"id": "W1", "title": "mean over the block", "patch": {"BLOCK_N": 1024},
                                       "source_patch": "plans/mean-over-block.diff"}])  # fmt: skip
    r = run_kinv(env, "check", plan, cwd=work, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "a gate failed: W1 at rows4096" in line and "nothing was timed" in line, line
    assert "baseline: correct at 3 level(s)" in r.stdout
    assert kernel.read_bytes() == before  # the patch went to a copy of the package, never the installed file


def test_kinv_check_refuses_a_config_outside_the_kernels_restriction_in_one_line(installed, tmp_path):
    _, env, work = installed
    env = {**env, "KINV_STATE_DIR": str(tmp_path / "state")}
    plan = _plan(work, "too-wide.yaml", [{"id": "V9", "title": "8192 x 4 at 4 warps",
                                          "patch": {"BLOCK_N": 8192, "ROWS_PER_PROGRAM": 4}}])  # fmt: skip
    r = run_kinv(env, "check", plan, cwd=work, timeout=600)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stdout[-2000:] + r.stderr
    assert "V9" in r.stderr and "BLOCK_N * ROWS_PER_PROGRAM <= 2048 * num_warps" in r.stderr, r.stderr
    assert not (tmp_path / "state" / "checks").exists()  # bad input writes nothing
