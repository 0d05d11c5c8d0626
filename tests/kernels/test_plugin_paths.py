"""A kernel named as ``package.module:Class`` is that class, in every kinv process: the CLI, the correctness child
and the benchmark workers (which start with ``python -P``), whether or not its package is installed."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.kernels.test_plugin import _recording, _write_package

PKG = "kinv_demo_matmul_uninstalled"  # not the name test_plugin.py's fixture installs (the two may run at once)

ROOT = Path(__file__).resolve().parents[2]


def test_an_adapter_is_looked_up_by_its_full_spec_not_by_its_name(tmp_path, monkeypatch):
    """Two adapters may share a kernel name: ``pkg.module:Class`` gives that class, not whichever came first."""
    pkg = tmp_path / "kinv_same_name_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "adapter.py").write_text(textwrap.dedent("""
        from kinv.kernels.mla_decode_adapter import MLADecodeAdapter

        class Other(MLADecodeAdapter):
            throughput_unit = "other/s"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.mla_decode_adapter import MLADecodeAdapter

    first = get_adapter("mla_decode")
    other = get_adapter("kinv_same_name_plugin.adapter:Other")
    assert type(other).__name__ == "Other" and other.throughput_unit == "other/s"
    assert type(get_adapter("mla_decode")) is MLADecodeAdapter and get_adapter("mla_decode") is first
    assert get_adapter("kinv_same_name_plugin.adapter:Other") is other


@pytest.mark.slow  # a whole run
def test_a_plan_naming_an_uninstalled_adapter_class_runs_in_the_correctness_child_and_workers_too(tmp_path):
    """The plugin is not installed: the CLI imports it from the working directory, and its children (``python
    -P``, started elsewhere) get the same import path."""
    src = _write_package(tmp_path, PKG)
    ref = f"{PKG}.adapter:TiledMatmulAdapter"
    plan = (src / "plan.yaml").read_text().replace("kernel: tiled_matmul", f"kernel: {ref}")
    (src / "plan-ref.yaml").write_text(plan)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KINV_")}
    env.update(TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1", KINV_STATE_DIR=str(tmp_path / "state"),
               KINV_RECORDINGS=str(tmp_path / "recordings"), PYTHONPATH=str(ROOT))  # kinv only, not the plugin
    import subprocess

    assert subprocess.run([sys.executable, "-c", f"import {PKG}"], env=env, cwd=tmp_path,
                          capture_output=True).returncode != 0  # not installed: importable only from its folder
    _recording(tmp_path / "recordings" / "tiled_matmul.jsonl.gz", env, kernel=ref, cwd=src)
    cfg = src / PKG / "configs" / "tiled_matmul.json"
    before = cfg.read_bytes()
    r = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "run", "plan-ref.yaml", "--backend", "replay",
                        "--approval", "auto"], env=env, cwd=src, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert cfg.read_bytes() == before
    exps = {e["variant"]: e for e in json.loads(subprocess.run(
        [sys.executable, "-m", "kinv.agent.cli.app", "experiments", "9a", "--json"], env=env, cwd=src,
        capture_output=True, text=True).stdout)}  # fmt: skip
    assert exps["V1"]["verdict"] == "accept", exps
    # a benchmark worker (python -P, its cwd kinv's checkout) imports the same class; on this CPU machine its
    # set-up then stops where it needs a GPU, past the import
    code = textwrap.dedent(f"""
        from kinv.agent.tools.worker.client import WorkerError, WorkerProcess
        from kinv.kernels.adapter import get_adapter
        a = get_adapter("{ref}")
        cfg = a.validate_config({{"kernel": "tiled_matmul", "TILE_M": 16, "TILE_N": 16, "TILE_K": 16, "num_warps": 1}})
        with WorkerProcess(label="plugin") as w:
            try:
                s = w.request("setup", kernel="{ref}", config=cfg, level={{"M": 32, "N": 32, "K": 32}})
                print("set up:", s["correct"])
            except WorkerError as exc:
                print("worker error:", exc)
    """)
    w = subprocess.run([sys.executable, "-c", code], env=env, cwd=src, capture_output=True, text=True, timeout=300)
    assert w.returncode == 0 and w.stdout.strip(), w.stdout + w.stderr
    assert "cannot import" not in w.stdout and "No module named" not in w.stdout, w.stdout
