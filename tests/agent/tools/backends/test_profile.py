"""The profile step's parsing and sentences, on Nsight Compute's own output of the seed's baseline (BT16/w4/s2)
and its num_warps-8 variant at V4-Flash / 4096 / batch 64, captured on the H200 (tests/data/ncu/), and its
behaviour where no profiler is at hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinv.agent.report.resources import bound_of, explain, next_step
from kinv.agent.tools.backends import profile

DATA = Path(__file__).resolve().parents[3] / "data" / "ncu"
SEED = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
B8 = {"shape": "v4flash", "heads": 16, "page_size": 64, "context": 4096, "batch": 8}


@pytest.fixture(scope="module")
def w4():
    return profile.summarize(profile.parse_raw((DATA / "raw_w4_b64.csv").read_text()))


@pytest.fixture(scope="module")
def w8():
    return profile.summarize(profile.parse_raw((DATA / "raw_w8_b64.csv").read_text()))


def test_the_raw_page_parses_into_the_figures_that_explain_the_occupancy_verdict(w4, w8):
    # the figures Nsight Compute printed for stage 1: registers, the binding block limit, waves, DRAM
    assert (w4["registers"], w4["ctas_per_sm"], w4["limited_by"]) == (126, 4, "registers")
    assert (w8["registers"], w8["ctas_per_sm"], w8["limited_by"]) == (93, 2, "registers")
    assert w4["waves"] == pytest.approx(0.97, abs=0.01) and w8["waves"] == pytest.approx(1.94, abs=0.01)
    assert w4["dram_pct"] == pytest.approx(50.1, abs=0.5) and w8["dram_pct"] == pytest.approx(29.5, abs=0.5)
    assert w8["duration_ns"] > 1.5 * w4["duration_ns"]  # the slower variant is slower under the profiler too
    assert w8["top_stalls"] and w8["top_stalls"][0][0] == "short scoreboard"
    assert all(k in w4 for k in ("achieved_occupancy_pct", "theoretical_occupancy_pct", "issued_per_cycle",
                                 "eligible_per_cycle", "memory_pct"))  # fmt: skip


def test_a_launch_of_another_kernel_or_program_output_before_the_table_is_not_a_row():
    text = (DATA / "raw_w4_b64.csv").read_text()
    assert text.splitlines()[0].startswith("==")  # the profiled program's own lines come first
    assert profile.parse_raw("no table here\n") == [] and profile.summarize([]) is None


def test_the_variant_sentence_states_its_register_limit_and_its_waves(w4, w8):
    s = explain(w4, w8)
    assert "93 registers/thread (baseline 126)" in s
    assert "2 CTAs/SM, limited by registers (baseline 4, registers)" in s
    assert "1.94 waves per SM (baseline 0.97)" in s
    assert "DRAM throughput 30% of peak (baseline 50%)" in s


def test_the_baselines_bound_points_the_next_step(w4):
    assert bound_of(w4).startswith("latency-bound at 50% of DRAM peak")
    assert "one wave" in bound_of(w4)
    assert "more CTAs that would need a second wave" in next_step(w4)
    busy = {**w4, "dram_pct": 88.0, "waves": 3.0}
    assert bound_of(busy).startswith("bandwidth-bound at 88%") and "fewer bytes" in next_step(busy)


def test_without_ncu_the_step_is_one_line_and_no_failure(monkeypatch, tmp_path):
    from kinv.kernels.adapter import get_adapter

    monkeypatch.delenv("KINV_NCU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu on it
    a = get_adapter("mla_decode")
    figures, why, secs = profile.run(a, SEED, a.level(B8), {})
    assert figures is None and secs == 0.0 and why.endswith(profile.SKIPPED) and "not installed" in why


def test_a_profiler_that_fails_is_skipped_with_its_last_line(monkeypatch, tmp_path):
    from kinv.kernels.adapter import get_adapter

    fake = tmp_path / "ncu"  # an ncu that cannot profile: exits 1 with one line, as a driver without permission
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM: no permission to GPU counters' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KINV_NCU", str(fake))
    a = get_adapter("mla_decode")
    figures, why, _ = profile.run(a, SEED, a.level(B8), {})
    assert figures is None and "ERR_NVGPUCTRPERM" in why and why.endswith(profile.SKIPPED)


def test_a_plan_asking_for_a_profile_on_replay_without_recorded_profiles_closes_out_with_one_line(closed_3a, state_dir):
    text = (state_dir / "reports" / "3a-closeout.md").read_text()
    if "Why, by the profiler" in text:  # recordings carry profiles: the evidence is there instead
        assert "registers/thread" in text and "waves per SM" in text
    else:
        lines = [ln for ln in text.splitlines() if "Profile step" in ln]
        assert lines == ["- Profile step: skipped — Replay has no recorded profiles of mla_decode; "
                         "the profile step was skipped."]  # fmt: skip
