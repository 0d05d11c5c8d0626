"""The bound on what more GPUs can take off campaign #7, read from the H200 run's own database."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "benchmarks" / "results" / "ray_campaign_h200"
SCRIPT = ROOT / "benchmarks" / "campaign_critical_path.py"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip


def test_the_one_gpu_campaign_is_accounted_for_and_two_gpus_cannot_give_1_8x(tmp_path):
    db = RUNS / "local" / "kinv.db"
    wall = json.loads((RUNS / "local" / "wall.json").read_text())["wall_s"]
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    out = tmp_path / "cp.json"
    r = run(db, "--wall", wall, "--gpus", 2, 4, "--out", out)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    # the parts cover the measured wall time (within 2%), and the chain of the campaign is all there
    assert abs(result["accounted_s"] - wall) / wall < 0.02
    assert set(result["workstreams"]) == {"#7a", "#7b", "#7c"}
    assert result["levels"] == 5
    assert result["parts_s"]["screening"] > 30 and result["parts_s"]["closeout"] > 5
    # the many-GPU targets (1.8x on 2 GPUs, 3.3x on 4) are above even the optimistic bound
    two, four = result["bounds"]["2"], result["bounds"]["4"]
    assert 1.0 < two["speedup_levels_spread"] <= two["speedup_with_finalists_at_once"] < 1.8
    assert four["speedup_with_finalists_at_once"] < 3.3
    assert four["speedup_levels_spread"] > two["speedup_levels_spread"]
    # the recorded database is read from a copy, never written
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_missing_database_is_one_line_and_a_nonzero_exit(tmp_path):
    r = run(tmp_path / "nope.db")
    assert r.returncode == 2
    assert "no database at" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
