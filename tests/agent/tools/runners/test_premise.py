"""Did a variant move what its hypothesis is about?  The premise line, its three outcomes, the profile deciding where
it reads, "not measured" without figures, a premise a kernel declares, and the planner keeping an untested lead."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kinv.agent.tools.runners import premise
from kinv.agent.words import PremiseOutcome
from kinv.kernels.adapter import Premise

ROOT = Path(__file__).resolve().parents[4]
LABELS = ("b1", "b32")


def figs(ctas, warps, regs=126, waves=0.97, profile=None, stages=2, tile="[16 heads x 16 tokens] x 512", splits=4,
         grid=512):  # fmt: skip
    return {"compiled": {"ctas_per_sm": ctas, "warps_per_sm": ctas * warps, "registers": regs, "waves": waves},
            "params": {"num_warps": warps, "num_stages": stages, "BLOCK_T": 16},
            "why": {"tile": tile, "mma_tile": "[16,16]", "ctas": grid, "num_splits": splits},
            "profile": profile, "items": 32.0}  # fmt: skip


def check(target, base, var, labels=LABELS, adapter=None):
    return premise.check("V1", target, [(lab, base, var) for lab in labels], adapter, "tok")


def test_the_seeds_num_warps_8_did_not_move_warps_per_sm():
    """4 CTAs x 4 warps -> 2 x 8 (registers bind): 16 warps per SM either way; its verdict says nothing."""
    got = check("occupancy", figs(4, 4), figs(2, 8, regs=93, waves=1.94))
    assert got.outcome == PremiseOutcome.NOT_MOVED and not got.tested and not got.speaks
    assert got.line() == ("Premise (occupancy, warps per SM and achieved occupancy): warps per SM 16 → 16 (4 CTAs × "
                          "4 warps → 2 CTAs × 8 warps) at b1, b32; did not move: V1's verdict says nothing about "
                          "occupancy.")  # fmt: skip


@pytest.mark.parametrize("var,outcome,end", [
    (figs(4, 8), PremiseOutcome.TESTED, "moved as predicted: V1 tested its premise"),
    (figs(6, 4), PremiseOutcome.TESTED, "moved as predicted: V1 tested its premise"),
    (figs(2, 4), PremiseOutcome.OPPOSITE, "moved the other way: V1's verdict says nothing for or against"),
])  # fmt: skip
def test_warps_per_sm_raised_either_way_tests_the_premise_and_lowered_moves_it_the_other_way(var, outcome, end):
    got = check("occupancy", figs(4, 4), var)
    assert got.outcome == outcome and end in got.line(), got.line()
    assert got.tested == (outcome == PremiseOutcome.TESTED)


def test_the_profile_decides_where_it_reads_achieved_occupancy():
    """Compiled warps per SM doubled, but Nsight Compute saw achieved occupancy move one point at b32: there the
    premise did not move; at b1 (not profiled) the compiled table decides."""
    base = figs(4, 4, profile={"achieved_occupancy_pct": 23.6})
    var = figs(4, 8, profile={"achieved_occupancy_pct": 24.6})
    got = premise.check("V1", "occupancy", [("b1", figs(4, 4), figs(4, 8)), ("b32", base, var)])
    assert got.at("b1") == PremiseOutcome.TESTED and got.at("b32") == PremiseOutcome.NOT_MOVED
    assert got.outcome == "partly" and got.tested
    line = got.line()
    assert "achieved occupancy (profiled) 23.6% → 24.6% at b32" in line and "moved as predicted at b1" in line, line
    assert "not moved at b32" in line, line


def test_without_compiled_or_profiled_figures_the_premise_is_not_measured_never_guessed():
    """The command backend or the interpreter: no compiled kernel, no profile; the config alone proves nothing."""
    bare = {"compiled": None, "params": {"num_warps": 4, "num_stages": 2}, "why": {}, "profile": None, "items": 1.0}
    for target in ("occupancy", "pipelining", "tile_shape", "parallelism", "bytes_moved"):
        got = check(target, bare, {**bare, "params": {"num_warps": 8, "num_stages": 3}})
        assert got.outcome == PremiseOutcome.NOT_MEASURED and got.speaks and not got.readings, target
        assert "not measured (no compiled or profiled figures" in got.line()
    assert check("roofline_gap", bare, bare) is None and check(None, bare, bare) is None


def test_stages_tile_ctas_and_bytes_per_token_each_read_their_own_quantity():
    assert check("pipelining", figs(4, 4), figs(4, 4, stages=3)).outcome == PremiseOutcome.TESTED
    assert check("pipelining", figs(4, 4), figs(4, 4, stages=1)).outcome == PremiseOutcome.OPPOSITE
    tile = check("tile_shape", figs(4, 4), figs(4, 4, tile="[16 heads x 32 tokens] x 512"))
    assert tile.outcome == PremiseOutcome.TESTED and "[16 heads x 16 tokens] x 512, MMA [16,16] →" in tile.line()
    assert check("tile_shape", figs(4, 4), figs(4, 4)).outcome == PremiseOutcome.NOT_MOVED
    par = check("parallelism", figs(4, 4, splits=4), figs(4, 4, splits=8, grid=1024, waves=1.94))
    assert (
        par.outcome == PremiseOutcome.TESTED and "CTAs 512 → 1,024 (4 splits, 0.97 waves → 8 splits, 1.94" in par.line()
    )
    few = check("bytes_moved", figs(4, 4, profile={"dram_bytes": 32e6}), figs(4, 4, profile={"dram_bytes": 16e6}))
    assert few.outcome == PremiseOutcome.TESTED and "DRAM bytes per tok 1,000,000 → 500,000" in few.line(), few.line()
    same = check("bytes_moved", figs(4, 4, profile={"dram_bytes": 32e6}), figs(4, 4, profile={"dram_bytes": 32.3e6}))
    assert same.outcome == PremiseOutcome.NOT_MOVED  # within 2%: the same bytes


def test_a_kernel_may_declare_a_premise_of_its_own():
    adapter = SimpleNamespace(premises={"spills": Premise("spilled bytes", "down", lambda f: (
        (f.get("compiled") or {}).get("spills"), "") if f.get("compiled") else None)})  # fmt: skip
    base, var = figs(4, 4), figs(6, 4)
    base["compiled"]["spills"], var["compiled"]["spills"] = 64, 0
    got = check("spills", base, var, adapter=adapter)
    assert got.outcome == PremiseOutcome.TESTED and "spilled bytes 64 → 0" in got.line(), got.line()


def test_a_plan_names_only_targets_kinv_or_its_kernel_knows(tmp_path):
    from kinv.agent.errors import PlanError
    from kinv.agent.plan_file import load_plan

    premise_plan = tmp_path / "p.yaml"
    text = (ROOT / "plans" / "occupancy-premise.yaml").read_text()
    premise_plan.write_text(
        text.replace("targets: occupancy\n    expect: regress", "targets: ocupancy\n    expect: regress")
    )
    with pytest.raises(
        PlanError,
        match=r"variants\.W8\.targets: 'ocupancy' is not a target; valid: occupancy, "
        r"pipelining, tile_shape, parallelism, bytes_moved, roofline_gap, elsewhere",
    ):
        load_plan(premise_plan)
    plan, _ = load_plan(ROOT / "plans" / "occupancy-premise.yaml")
    assert [(v.targets, v.expect) for v in plan.variants] == [("occupancy", "improve"), ("occupancy", "improve"),
                                                               ("occupancy", "regress")]  # fmt: skip
    assert [plan.variant_config(v)["maxnreg"] for v in plan.variants] == [80, 64, 0]


# ---- the planner ------------------------------------------------------------------------------------------------
def _plan():
    from kinv.agent.plan_file import load_plan

    return load_plan(ROOT / "plans" / "3a-attention-occupancy.yaml")[0]


def test_the_planner_keeps_an_untested_lead_at_its_prior_and_proposes_the_test():
    plan = _plan()
    results = {"V1": {"verdict": "reject", "levels": {}}, "V2": {"verdict": "inconclusive", "levels": {}}}
    silent = {"V1": check("occupancy", figs(4, 4), figs(2, 8))}
    from kinv.agent.workstream.planner import recommend

    regrw = next(r for r in recommend(plan, results, None, premises=silent) if r["id"] == "REGRW")
    assert regrw["score"] == 0.4 and "occupancy untested here (V1: warps per SM and achieved occupancy not moved)" \
        in regrw["evidence"], regrw  # fmt: skip
    assert "maxnreg" in regrw["proposal"] and "more warps per CTA" in regrw["proposal"]


def test_the_planner_refutes_occupancy_only_by_variants_that_moved_it():
    from kinv.agent.workstream.planner import recommend

    plan = _plan()
    results = {"V1": {"verdict": "reject", "levels": {}}, "V2": {"verdict": "inconclusive", "levels": {}}}
    moved = {"V1": check("occupancy", figs(4, 4), figs(4, 8))}
    regrw = next(r for r in recommend(plan, results, None, premises=moved) if r["id"] == "REGRW")
    assert regrw["score"] == 0.04 and "occupancy refuted here: V1 reject" in regrw["evidence"] and not regrw["proposal"]
    never = next(r for r in recommend(plan, {"V1": {"verdict": "incorrect", "levels": {}}}, None, premises={})
                 if r["id"] == "REGRW")  # fmt: skip
    assert never["score"] == 0.4 and "V1 never timed (incorrect)" in never["evidence"], never
