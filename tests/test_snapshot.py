"""A copy of a kernel package (the graph's baseline snapshot, a Ray actor's own copy) is what a worker imports
when it comes first on PYTHONPATH, and it is the same source: the same kernel hash, no recordings."""

from __future__ import annotations

import os
import subprocess
import sys

from kinv import IMPORT_ROOT
from kinv.agent.tools import bench, bench_worker
from kinv.agent.tools.snapshot import materialize, package_files
from kinv.kernels.adapter import get_adapter


def test_a_package_copy_shadows_the_live_kernel_and_hashes_the_same(tmp_path):
    adapter = get_adapter("mla_decode")
    files = package_files(adapter.package_dir())
    assert "mla_decode.py" in files and "configs/mla_decode.json" in files
    assert not any(f.startswith("recordings/") or "__pycache__" in f for f in files)
    live = bench.kernel_hash("mla_decode")
    root = materialize(files, tmp_path / live, adapter.package_name())
    copy_root = root / "kinv"  # the copy's kernels/ sits under kinv/, as kinv.kernels
    assert bench_worker.kernel_source_hash(adapter, root=copy_root) == live
    # a child with the copy first imports the copy, not the checkout's kernels/
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), IMPORT_ROOT]))
    out = subprocess.run([sys.executable, "-P", "-c", "import kinv.kernels.mla_decode as m; print(m.__file__)"],
                         env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.strip().startswith(str(root)), out.stdout
