"""One installed namespace: kinv.agent and kinv.kernels, no top-level `kernels` or `agent`.

A plain `pip install .` puts everything under kinv/ (the folders agent/ and kernels/ are mapped there),
a source checkout imports the same names with nothing installed, and a baseline snapshot laid out as
``<snapshot>/kinv/kernels`` shadows the live kernel package in a child process started from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kinv import IMPORT_ROOT
from kinv.agent.tools.worker import hashes

ROOT = Path(__file__).resolve().parents[1]


def _py(code: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.slow
def test_a_plain_pip_install_puts_everything_under_kinv_and_runs(tmp_path):
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    top = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")}
    assert "kinv" in top and not {"kernels", "agent"} & top  # nothing that collides with other distributions
    assert (target / "kinv" / "kernels" / "configs" / "mla_decode.json").is_file()
    assert (target / "kinv" / "kernels" / "recordings" / "h200" / "mla_decode-v4flash.jsonl.gz").is_file()
    env = dict(os.environ, PYTHONPATH=str(target))
    r = _py("import kinv.kernels.adapter as a, kinv.agent.cli.app; ad = a.get_adapter('mla_decode'); "
            "print(a.__file__); print(ad.config_path())", env, tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    module_file, config = r.stdout.split()
    assert module_file.startswith(str(target)) and config.startswith(str(target))
    r = subprocess.run([sys.executable, "-P", "-m", "kinv.agent.cli.app", "kernels", "--json"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert {"mla_decode", "moe_expert_gemm"} <= {k["name"] for k in json.loads(r.stdout)}


def test_a_baseline_snapshot_shadows_the_live_kernel_package_in_a_child_started_from_the_checkout(tmp_path):
    snap = tmp_path / "snap"
    shutil.copytree(ROOT / "kernels", snap / "kinv" / "kernels", ignore=shutil.ignore_patterns("__pycache__",
                                                                                             "recordings"))
    f = snap / "kinv" / "kernels" / "mla_decode.py"
    f.write_text(f.read_text() + "\nSNAPSHOT_OWN_CODE = 1\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(snap), IMPORT_ROOT]))
    code = ("import kinv.kernels.mla_decode as m\nfrom kinv.agent.tools.worker import hashes as w\n"
            "from kinv.kernels.adapter import get_adapter\n"
            "print(m.__file__)\nprint(w.kernel_source_hash(get_adapter('mla_decode')))")  # fmt: skip
    r = _py(code, env, ROOT)  # the checkout is the cwd, as for kinv's workers: -P keeps it behind the snapshot
    assert r.returncode == 0, r.stderr
    module_file, khash = r.stdout.split()
    assert Path(module_file) == f
    assert khash != hashes.kernel_hash("mla_decode")  # the baseline arm would time the snapshot, not the live file


def test_a_source_checkout_imports_kinv_with_nothing_installed():
    # -S: no site-packages at all (so no editable install either); the checkout is the cwd
    r = subprocess.run([sys.executable, "-S", "-c", "import kinv.kernels.adapter as a, kinv.agent.tools.worker.client "
                        "as w; print(a.__file__); print(w.__file__)"], cwd=ROOT, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [Path(p) for p in r.stdout.split()] == [ROOT / "kernels" / "adapter.py",
                                                    ROOT / "agent" / "tools" / "worker" / "client.py"]
