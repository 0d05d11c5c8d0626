"""The harness drill, live (GPU lane): plans/6c-harness-drill.yaml plants six tricks that reach past the kernel into
what times and judges it, and every one must be caught before a verdict, with its reason in the close-out, while
the sound variant is still measured and decided and every kernel file is restored.

The run plants source patches, so it runs on a copy of the project (tests.utils.project_copy): this checkout's
kernel is never touched.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.utils import project_copy, run_kinv

# what catches each planted trick, in the words kinv records
CAUGHT_BY = {
    "H1": ("changed its code in memory", "changed the harness's code"),  # the timer's code swapped in place
    "H2": ("outside atol", "relative error", "not finite"),  # the reference rebound: the judge is elsewhere
    "H3": ("the timed graph of round",),  # lazy after the first capture: its first timed capture is checked
    "H4": ("input set",),  # right for input set 0 only: every input set is checked
    "H5": ("changed the harness's code in memory", "yardstick"),  # the timer rebound after the set-up
    "H6": ("the timed graph of round", "outside atol", "not finite"),  # a cached answer copied under capture
}


@pytest.mark.gpu
def test_every_planted_harness_trick_is_caught_before_a_verdict(tmp_path):
    import os

    root, pythonpath = project_copy(tmp_path / "project")
    state = tmp_path / "state"
    env = dict(os.environ, PYTHONPATH=pythonpath, KINV_STATE_DIR=str(state))
    before = (root / "kernels" / "mla_decode.py").read_bytes()
    r = run_kinv(env, "run", "plans/6c-harness-drill.yaml", "--backend", "cuda", "--approval", "auto",
                 timeout=1800, cwd=root)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert (root / "kernels" / "mla_decode.py").read_bytes() == before  # every patch reverted
    db = sqlite3.connect(state / "kinv.db")
    db.row_factory = sqlite3.Row
    rows = {e["variant"]: dict(e) for e in db.execute("select * from experiments where kind = 'ab' order by id")}
    for vid, words in CAUGHT_BY.items():
        e = rows[vid]
        assert e["verdict"] not in ("accept", "mixed"), (vid, e["verdict"], e["reason"])
        assert any(w in (e["reason"] or "") for w in words), (vid, e["verdict"], e["reason"])
    assert rows["V1"]["verdict"] in ("accept", "reject", "mixed", "equivalent", "undecided")
    res = json.loads(rows["V1"]["resources"] or "{}")
    assert res["rules"]["verified"], "the sound variant's timed captures were checked by the judge"
    report = state / "reports" / "6c-closeout.md"
    text = report.read_text()
    for vid in CAUGHT_BY:
        assert f"## {vid}:" in text
