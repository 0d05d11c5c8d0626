"""A copy of a kernel package (the graph's baseline snapshot, a Ray actor's own copy) is what a worker imports
when it comes first on PYTHONPATH, and it is the same source: the same kernel hash, no recordings."""

from __future__ import annotations

import os
import subprocess
import sys

from kinv import IMPORT_ROOT
from kinv.agent.tools.files.snapshot import materialize, package_files
from kinv.agent.tools.worker import hashes
from kinv.kernels.adapter import get_adapter


def test_a_package_copy_shadows_the_live_kernel_and_hashes_the_same(tmp_path):
    adapter = get_adapter("mla_decode")
    files = package_files(adapter.package_dir())
    assert "mla_decode.py" in files and "configs/mla_decode.json" in files
    assert not any(f.startswith("recordings/") or "__pycache__" in f for f in files)
    live = hashes.kernel_hash("mla_decode")
    root = materialize(files, tmp_path / live, adapter.package_name())
    copy_root = root / "kinv"  # the copy's kernels/ sits under kinv/, as kinv.kernels
    assert hashes.kernel_source_hash(adapter, root=copy_root) == live
    # a child with the copy first imports the copy, not the checkout's kernels/
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), IMPORT_ROOT]))
    out = subprocess.run([sys.executable, "-P", "-c", "import kinv.kernels.mla_decode as m; print(m.__file__)"],
                         env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.strip().startswith(str(root)), out.stdout


def test_a_copy_of_a_plugin_in_a_sub_package_shadows_the_live_one_and_keeps_its_parent_whole(tmp_path):
    """A plugin at ``mypkg.kernels``: the copy of ``kernels`` is what a child imports, the parent's own __init__
    still runs, and the parent's other modules stay importable from the live package."""
    import textwrap

    live = tmp_path / "live"
    (live / "kinv_sub_plugin" / "kernels").mkdir(parents=True)
    (live / "kinv_sub_plugin" / "__init__.py").write_text("GREETING = 'from the live parent'\n")
    (live / "kinv_sub_plugin" / "helpers.py").write_text("VALUE = 42\n")
    (live / "kinv_sub_plugin" / "kernels" / "__init__.py").write_text("")
    (live / "kinv_sub_plugin" / "kernels" / "kernel.py").write_text("SOURCE = 'patched'\n")
    # the snapshot is made where the live plugin is importable (its parent's __init__ is found there)
    env = dict(os.environ, PYTHONPATH=str(live))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from kinv.agent.tools.files.snapshot import materialize; " \
           "materialize({'__init__.py': b'', 'kernel.py': b\"SOURCE = 'baseline'\\n\"}, " \
           "__import__('pathlib').Path(sys.argv[2]), 'kinv_sub_plugin.kernels')"
    made = subprocess.run([sys.executable, "-c", code, IMPORT_ROOT, str(tmp_path / "snap")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr[-1000:]
    probe = textwrap.dedent("""
        import kinv_sub_plugin, kinv_sub_plugin.helpers as h, kinv_sub_plugin.kernels.kernel as k
        print(k.SOURCE, kinv_sub_plugin.GREETING, h.VALUE, k.__file__)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "snap"), str(live)]))
    out = subprocess.run([sys.executable, "-P", "-c", probe], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-1000:]
    words = out.stdout.split()
    assert words[0] == "baseline" and "from the live parent" in out.stdout and words[-2] == "42"
    assert words[-1].startswith(str(tmp_path / "snap")), out.stdout
