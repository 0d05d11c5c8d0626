"""Plausibility: a level timed faster than its roofline is flagged, with the figures that show it."""

from __future__ import annotations

from kinv.agent.tools.measure import plausibility
from kinv.kernels.adapter import get_adapter

MLA = get_adapter("mla_decode")
B64 = MLA.level({"shape": "v4flash", "heads": 16, "page_size": 64, "context": 4096, "batch": 64})
COPY = 4000.0  # GB/s, the order of the H200's measured device-to-device copy


def test_a_variant_faster_than_copy_bandwidth_is_flagged_and_an_honest_one_is_not():
    floor_us = MLA.bytes_moved(B64) / (COPY * 1e9) * 1e6  # 302 MB of KV at copy bandwidth: about 76 µs
    honest = {"level": B64.key, "base_us": 114.1, "variant_us": 200.5}  # the measured b64 stage-1 figures
    cheat = {"level": B64.key, "base_us": 114.1, "variant_us": floor_us / 2}  # half the time physics allows
    assert plausibility.flags(MLA, [B64], [honest], COPY, 686.0) == {}
    why = plausibility.flags(MLA, [B64], [cheat], COPY, 686.0)[B64.key]
    assert "the variant moves" in why and "above the copy bandwidth (4,000 GB/s)" in why
    assert "the baseline" not in why  # the honest arm is not blamed


def test_a_working_set_that_fits_in_l2_is_flagged_whatever_the_time():
    row = {"level": B64.key, "base_us": 114.1, "variant_us": 110.0}
    timed = {B64.key: {"working_set": 40 * 2**20, "l2_bytes": 60 * 2**20}}
    why = plausibility.flags(MLA, [B64], [row], COPY, 686.0, timed)[B64.key]
    assert "fits in L2 (60 MiB)" in why
    assert plausibility.flags(MLA, [B64], [row], COPY, 686.0, {B64.key: {"working_set": 3 * 60 * 2**20,
                                                                         "l2_bytes": 60 * 2**20}}) == {}


def test_the_void_reason_names_each_flagged_level():
    text = plausibility.void_reason({B64.key: "the variant moves 9,000 GB/s"}, {B64.key: "b64"})
    assert text.startswith("implausible timing") and "b64: the variant moves 9,000 GB/s" in text
    assert "no level is decided" in text
