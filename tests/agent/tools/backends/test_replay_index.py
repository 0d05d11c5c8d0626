"""The replay index is parsed once per process while its files stay as they are, and anew when one changes."""

from __future__ import annotations

import gzip
import json
import os
import shutil

from kinv.agent.tools.backends.replay import ReplayBackend
from kinv.agent.tools.backends.replay_index import Recording
from kinv.kernels.adapter import KERNELS_DIR


def test_a_recording_is_parsed_once_per_process_and_again_when_a_file_is_rewritten(tmp_path):
    src = sorted((KERNELS_DIR / "recordings").rglob("*.jsonl.gz"))
    files = []
    for f in src:
        files.append(tmp_path / f.name)
        shutil.copy(f, files[-1])
    first = Recording.load(files, "mla_decode")
    assert Recording.load(files, "mla_decode") is first  # the same files: the same parse
    be1, be2 = ReplayBackend(tmp_path), ReplayBackend(tmp_path)
    assert be1.for_kernel("mla_decode") is be2.for_kernel("mla_decode") is first
    # drop the last sample row of one file: the re-written file is parsed anew and serves one cell fewer row
    victim = next(f for f in files if f.name.startswith("mla_decode"))
    lines = gzip.open(victim, "rt").read().splitlines()
    last = max(i for i, ln in enumerate(lines) if json.loads(ln).get("type") == "sample")
    with gzip.open(victim, "wt") as fh:
        fh.write("\n".join(lines[:last] + lines[last + 1 :]) + "\n")
    os.utime(victim, ns=(1, 1))  # even a file whose mtime went backwards is a new file: its size changed
    again = Recording.load(files, "mla_decode")
    assert again is not first
    rows = lambda rec: sum(len(c) for c in rec.cells.values())  # noqa: E731
    assert rows(again) == rows(first) - 1


def test_a_config_against_itself_is_served_two_workers_of_that_config():
    """A pair of one config on both sides (a revision against itself) is served by two workers that timed that very
    config: never the base worker of an A/B it was recorded in as the variant (that worker ran the baseline, and
    the self-comparison would read as the variant's whole change)."""
    rec = Recording.load(sorted((KERNELS_DIR / "recordings").rglob("*.jsonl.gz")), "mla_decode")
    from kinv.agent.errors import NoRecording

    variants = {k[1] for k in rec.cells if k[0] == "ab" and k[2] == "variant"}
    served = 0
    for chash in variants:
        try:
            slots = {role: rec.slot_for(chash, chash, None, role) for role in ("base", "variant")}
        except NoRecording:  # no two workers of it in one session (a config recorded only as an A/B's variant)
            continue
        served += 1
        assert slots["base"] != slots["variant"]
        for role, slot in slots.items():
            cell = next(c for k, c in rec.cells.items() if k[:3] == slot)
            assert {row["config_hash"] for row in cell.values()} == {chash}, (role, slot)
    assert served >= 3  # BT16/w8/s2, BT16/w4/s3 and BT32/w4/s2 are in a sweep: R0 and R1
