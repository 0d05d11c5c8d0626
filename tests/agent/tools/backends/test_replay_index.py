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
        fh.write("\n".join(lines[:last] + lines[last + 1:]) + "\n")
    os.utime(victim, ns=(1, 1))  # even a file whose mtime went backwards is a new file: its size changed
    again = Recording.load(files, "mla_decode")
    assert again is not first
    rows = lambda rec: sum(len(c) for c in rec.cells.values())  # noqa: E731
    assert rows(again) == rows(first) - 1
