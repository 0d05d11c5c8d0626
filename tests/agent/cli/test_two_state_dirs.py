"""The live config belongs to the checkout: two state dirs on one checkout never edit it at once, and a
refusal names the other state dir and its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.utils import write_seed_config

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"


def test_a_second_state_dir_is_refused_while_the_first_edits_the_config(tmp_path):
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    write_seed_config(cfg_dir)
    base = dict(os.environ, KINV_CONFIG_DIR=str(cfg_dir), TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1",
                PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")  # fmt: skip
    env_a = dict(base, KINV_STATE_DIR=str(tmp_path / "a"))
    env_b = dict(base, KINV_STATE_DIR=str(tmp_path / "b"))
    before = (cfg_dir / "mla_decode.json").read_bytes()
    a = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "run", str(PLAN), "--backend", "replay", "--approval",
                          "auto"], env=env_a, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline:
        line = a.stdout.readline()
        if "V1: patched" in line or (not line and a.poll() is not None):
            break
    assert a.poll() is None, "run A ended before V1 was patched"
    os.kill(a.pid, signal.SIGSTOP)  # held with V1 live, however fast its check: B must meet the edit, not its end
    try:
        b = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "run", str(ROOT / "plans" / "3b-tile-shape.yaml"),
                            "--backend", "replay", "--approval", "auto"], env=env_b, cwd=ROOT, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert b.returncode == 1, b.stdout + b.stderr
    assert str((tmp_path / "a").resolve()) in b.stderr and f"pid {a.pid}" in b.stderr
    assert len(b.stderr.strip().splitlines()) == 1
    a.stdout.read()
    assert a.wait(timeout=300) == 0
    assert (cfg_dir / "mla_decode.json").read_bytes() == before  # A restored it; B never touched it
    b2 = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "run", str(ROOT / "plans" / "3b-tile-shape.yaml"),
                         "--backend", "replay", "--approval", "auto"], env=env_b, cwd=ROOT, capture_output=True,
                        text=True, timeout=300)  # fmt: skip
    assert b2.returncode == 0, b2.stdout + b2.stderr  # once A is done, B runs
    assert (cfg_dir / "mla_decode.json").read_bytes() == before
