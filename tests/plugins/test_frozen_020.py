"""A plugin written against kinv 0.2.0, kept unchanged in tests/plugins/frozen_020/, installed and run by every
kinv since: its adapter imports from the 0.2.0 paths (``kinv.kernels.launch_config.Restriction`` and ``Tunable``
among them), which must keep working, with their DeprecationWarning, until the release that removes them.

The package is built with ``pip install --target`` into a temporary folder (never into the venv) and found through
PYTHONPATH by its entry point; ``kinv check`` runs its gate in the Triton interpreter, and ``kinv run --backend
replay`` runs its plan from a synthetic recording the test writes (its header says so): the point is that the old
plugin still runs end to end, not the numbers.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.utils import run_kinv

ROOT = Path(__file__).resolve().parents[2]
FROZEN = Path(__file__).with_name("frozen_020")
PKG = "kinv_frozen_softmax"
#: the sha256 of the frozen plugin's files as committed: the plugin is never edited (a new kinv must run it as is)
FROZEN_SHA256 = "2393495413ef87c273148684e030bac112c3838de7323d4711bd5ce415a56cd4"
DEPRECATED = [
    "kinv_frozen_softmax/adapter.py:8: DeprecationWarning: kinv.kernels.launch_config.Restriction is deprecated since "
    "0.3.0: import Restriction from kinv.plugin (the old path is removed in 0.5.0)",
    "kinv_frozen_softmax/adapter.py:8: DeprecationWarning: kinv.kernels.launch_config.Tunable is deprecated since "
    "0.3.0: import Tunable from kinv.plugin (the old path is removed in 0.5.0)",
]  # fmt: skip


def _frozen_files() -> list[Path]:
    return sorted(p for p in FROZEN.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and not any(part.endswith(".egg-info") or part == "build" for part in p.parts))  # fmt: skip


def _digest() -> str:
    h = hashlib.sha256()
    for p in _frozen_files():
        h.update(p.relative_to(FROZEN).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def test_the_frozen_plugin_is_unchanged():
    """Its files are what was committed with it: a kinv change that needs the plugin edited breaks 0.2.0 plugins."""
    assert _digest() == FROZEN_SHA256, "tests/plugins/frozen_020/ was edited: it is a 0.2.0 plugin, kept as written"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("frozen")
    src = root / "src"
    shutil.copytree(FROZEN, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    target = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(target), str(src)]  # fmt: skip
    r = subprocess.run(pip, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    work = root / "work"
    work.mkdir()
    shutil.copy(FROZEN / "plan.yaml", work / "plan.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KINV_")}
    env.update(TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", KINV_STATE_DIR=str(root / "state"),
               PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))  # fmt: skip
    return root, target, work, env


def test_kinv_check_passes_the_old_plugin_and_prints_its_deprecated_and_private_imports(installed):
    root, target, work, env = installed
    r = run_kinv(env, "check", "plan.yaml", cwd=work, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    for line in DEPRECATED:
        assert out.count(line) == 1, r.stdout  # one line each, as the import's own warning says it
    assert ("kinv_frozen_softmax/adapter.py:8: private import from kinv.kernels.launch_config: import Params, "
            "Restriction, Tunable, TunableSpec from kinv.plugin") in out, r.stdout  # fmt: skip
    assert ("kinv_frozen_softmax/adapter.py:7: private import from kinv.kernels.errors: import BadInput from "
            "kinv.plugin") in out, r.stdout  # fmt: skip
    assert "baseline: correct at 2 level(s) (cpu" in r.stdout and "V1: correct at 2 level(s) (cpu" in r.stdout
    assert "premise parallelism (CTAs up): not judged on CPU" in r.stdout
    skeleton = (root / "state" / "checks" / "31a-check.md").read_text()
    assert "**NOTHING WAS TIMED.**" in skeleton and all(f"- {line}" in skeleton for line in DEPRECATED)


def test_the_old_imports_warn_naming_the_new_path_and_the_release_that_removes_them(installed):
    root, target, work, env = installed
    code = "import warnings; warnings.simplefilter('always'); import kinv_frozen_softmax.adapter as a; print(a.SPEC)"
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "DeprecationWarning" in ln]
    assert len(warned) == 2 and all(ln.endswith(d.split("DeprecationWarning: ")[1]) for ln, d in zip(warned, DEPRECATED))


HASHES = textwrap.dedent("""
    import json, sys
    from kinv.agent.plan_file import load_plan
    from kinv.agent.tools.worker.hashes import harness_hash, kernel_hash, kernel_reference_hash
    plan, _ = load_plan(sys.argv[1])
    print(json.dumps({"harness": harness_hash(), "kernel": kernel_hash(plan.kernel),
                      "reference": kernel_reference_hash(plan.kernel), "base": {**plan.baseline, "kernel": plan.adapter.name},
                      "variants": {v.id: plan.variant_config(v) for v in plan.variants},
                      "levels": [lv.key for lv in plan.levels()]}))
""")


def _recording(path: Path, info: dict, speed: float) -> None:
    """A synthetic replay recording (v2 layout, labelled synthetic): the variant ``speed`` times the baseline's time."""
    from kinv.kernels.launch_config import config_hash

    rng = random.Random(31)
    base, (vid, var), = info["base"], *info["variants"].items()
    header = {"type": "header", "version": 2, "kernel": "row_softmax", "synthetic": True, "copy_gbps": 3000.0,
              "fingerprint": {"gpu": "a synthetic test fixture (not a measurement)", "sms": 0, "torch": "-",
                              "triton": "-"},
              "harness_hash": info["harness"], "kernel_hash": info["kernel"], "reference_hash": info["reference"],
              "env": {}, "configs": {"baseline": base, vid: var}}  # fmt: skip
    hb, hv = config_hash(base), config_hash(var)
    rows = [header]

    def row(kind, pair, role, r, key, chash, us):
        rows.append({"type": "sample", "kind": kind, "pair": pair, "role": role, "round": r, "level": key,
                     "config_hash": chash, "us": us * (1 + rng.gauss(0, 0.002)), "replays": 20, "gpu_s": 0.0002,
                     "t": r})  # fmt: skip

    for key in info["levels"]:
        for r in range(8):
            for j in range(2):
                row("aa", "aa", f"A{j}", r, key, hb, 5.0)
            row("ab", hv, "base", r, key, hb, 5.0)
            row("ab", hv, "variant", r, key, hv, 5.0 * speed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(x) + "\n" for x in rows)


def test_the_old_plugin_runs_its_plan_on_replay_and_restores_its_config(installed):
    root, target, work, env = installed
    r = subprocess.run([sys.executable, "-c", HASHES, "plan.yaml"], env=env, cwd=work, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    _recording(target / PKG / "recordings" / "synthetic" / "row_softmax.jsonl.gz", json.loads(r.stdout), speed=0.8)
    cfg = target / PKG / "configs" / "row_softmax.json"
    before = cfg.read_bytes()
    r = run_kinv(env, "run", "plan.yaml", "--backend", "replay", "--approval", "auto", cwd=work, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "synthetic test fixture" in r.stdout, r.stdout
    assert cfg.read_bytes() == before  # the plugin's live config, patched for V1 and restored byte for byte
    exps = {e["variant"]: e for e in json.loads(run_kinv(env, "experiments", "31a", "--json", cwd=work).stdout)}
    assert exps["V1"]["verdict"] == "accept", exps  # 20% faster at every level
    report = (root / "state" / "reports" / "31a-closeout.md").read_text()
    assert "| rows64/cols1000 |" in report and "r2/w4" in report and "GB/s" in report
