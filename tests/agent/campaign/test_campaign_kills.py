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


@pytest.mark.parametrize("kind, kills, reached", [
    ("env", 14, {"trial creation", "screening", "confirmation"}),
    ("config", 8, {"trial creation", "final A/B"})])  # fmt: skip
def test_a_campaign_killed_again_and_again_continues_to_the_same_choice(tmp_path, kind, kills, reached):
    """Each fresh campaign's first kill aims at one phase in turn (a trial created with none of its parameters
    first); the kills after it fall where they fall.  22 kills in all."""
    kills = int(os.environ.get("KINV_CAMPAIGN_KILLS", kills))
    summary = _harness().run_harness(kills=kills, seed=int(os.environ.get("KINV_CRASH_SEED", "0")),
                                     work=tmp_path / "kills", log=lambda *a, **k: None, kind=kind)  # fmt: skip
    print(json.dumps(summary, indent=2))
    assert summary["held"] == summary["kills"] >= kills and summary["campaigns_completed"] >= 2
    # a first kill is aimed at a phase by a point the uninterrupted run passed while in it (kinv.db read every 20 ms);
    # under load a point may fall a step earlier or later, so one aimed phase may be missed, never trial creation
    hit = reached & set(summary["kills_by_phase"])
    assert "trial creation" in hit and len(hit) >= len(reached) - 1, summary["kills_by_phase"]


def test_a_campaign_killed_between_its_adoptions_write_and_its_record_adopts_on_the_next_start(tmp_path):
    """The adoption is the last patch the campaign writes: a kill right after the file was written and journaled
    "applied", before it was marked adopted, leaves the next start to revert it and adopt again, as the uninterrupted
    campaign did (and kinv doctor finds nothing live)."""
    h = _harness()
    plan = h.config_plan(tmp_path / "campaign-config.yaml")
    code = h.snapshot(tmp_path / "code")
    ref = h.Chain(tmp_path / "reference", plan, code, "replay")
    rc, points, out = ref.start(None)
    assert rc == 0, out
    expected = ref.outcome()
    assert expected["adopted"], expected
    names = [ln.split(" ", 1)[1] for ln in points.read_text().splitlines()]
    at = max(i for i, n in enumerate(names, 1) if n == "journal.applied.after")  # the adoption's write, journaled
    ch = h.Chain(tmp_path / "killed", plan, code, "replay")
    rc, _, out = ch.start(at)
    assert rc == -9, out
    rc, _, out = ch.start(None)
    assert rc == 0, out
    got = ch.outcome()
    assert got["adopted"] and got["levels"] == expected["levels"] and not got["bad"], got
