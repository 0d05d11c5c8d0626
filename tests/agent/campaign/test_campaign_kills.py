"""SIGKILLs at random points of a campaign (its search's trial creation, its screening, its confirmation workstream,
its final A/B and adoption): every next `kinv campaign` continues, and each campaign that finishes chose what an
uninterrupted one chose, screened every point once and left no trial untold (benchmarks/campaign_kills.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[3]


def _harness():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("campaign_kills", ROOT / "benchmarks" / "campaign_kills.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["campaign_kills"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind, kills", [("env", 14), ("config", 6)])
def test_a_campaign_killed_again_and_again_continues_to_the_same_choice(tmp_path, kind, kills):
    kills = int(os.environ.get("KINV_CAMPAIGN_KILLS", kills))
    summary = _harness().run_harness(kills=kills, seed=int(os.environ.get("KINV_CRASH_SEED", "0")),
                                     work=tmp_path / "kills", log=lambda *a, **k: None, kind=kind)  # fmt: skip
    print(json.dumps(summary, indent=2))
    assert summary["held"] == summary["kills"] >= kills and summary["campaigns_completed"] >= 1
    assert summary["kills_by_phase"].get("trial creation", 0) >= 1  # a trial cut before its parameters were set
    if kind == "config":  # the screening, the workstream and the final A/B all reached by some kill
        assert len(summary["kills_by_phase"]) >= 3, summary["kills_by_phase"]
