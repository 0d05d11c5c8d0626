"""The GPU benchmarks behind the kernel's figures (benchmarks/mla_peer.py, benchmarks/mla_anatomy.py) on a machine
without a GPU: one line and exit 2, nothing written; and the parts of them that need no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("script, args", [("mla_peer.py", ["--peer-source", "peer.py"]), ("mla_anatomy.py", [])])
def test_without_a_gpu_a_benchmark_says_so_in_one_line_and_writes_nothing(tmp_path, script, args):
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"{script} needs a CUDA GPU; none is visible here"]
    assert not out.exists()


def test_the_peer_runs_as_written_with_its_own_split_count(tmp_path):
    import mla_peer

    # vLLM's TARGET_CTAS=512 rule at one head tile: 64 splits at batch 1 and 8, then 512 / batch rounded up
    assert [mla_peer.peer_splits(b) for b in (1, 8, 32, 64, 96)] == [64, 64, 16, 8, 6]
    wrong = tmp_path / "not_the_peer.py"
    wrong.write_text("import triton\n")
    with pytest.raises(SystemExit, match=r"has no _fwd_grouped_kernel_stage1; pass vLLM's triton_decode_attention.py"):
        mla_peer.load_peer(wrong)


def test_the_table_puts_batch_one_in_microseconds_against_the_floor_and_the_rest_against_copy_bandwidth():
    import mla_peer

    result = {"gpu": "NVIDIA H100 80GB HBM3", "copy_gbps": 3000.0, "floor": {"4096": 3.5}, "levels": [
        {"shape": "v3", "context": 4096, "batch": 1, "us": {"kinv:shipped": 10.5, "peer:BN64/w8/s2": 21.0},
         "pct_copy": {"kinv:shipped": 15.0}, "best_peer": "peer:BN64/w8/s2"},
        {"shape": "v3", "context": 4096, "batch": 8, "us": {"kinv:shipped": 30.0, "peer:BN32/w4/s2": 45.0},
         "pct_copy": {"kinv:shipped": 41.94}, "best_peer": "peer:BN32/w4/s2"}]}  # fmt: skip
    text = mla_peer.table(result)
    assert "| V3, 4096 | 10.5 µs (3.0x floor) | 41.9% |" in text
    assert "| peer best ÷ kinv | 2.00-2.00× | 1.50-1.50× |" in text
    assert text.endswith("copy 3000 GB/s on NVIDIA H100 80GB HBM3; batch-1 floor 4096: 3.50 µs")
