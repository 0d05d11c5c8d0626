"""`kinv export` and `kinv compare`: per-level effects as a person quotes them (the throughput change,
its interval and that interval's real coverage), for spreadsheets and for replay-vs-live checks."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tests.utils import kinv_in_process, replay_env

ROOT = Path(__file__).resolve().parents[3]


def test_export_csv_and_compare_agree_with_the_close_out(tmp_path, state_dir, closed_3a):
    env = replay_env(tmp_path, state_dir)

    def kinv(*args):
        return kinv_in_process(env, *args)

    out = kinv("export", "3a", "--csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    v1 = [r for r in rows if r["variant"] == "V1"]
    assert len(v1) == 5 and all(r["verdict"] == "regressed" for r in v1)
    b8 = next(r for r in v1 if r["level"].endswith("/b8"))
    assert float(b8["change_low"]) < float(b8["change"]) < float(b8["change_high"]) < 0
    closeout = (state_dir / "reports" / "3a-closeout.md").read_text()
    assert f"{float(b8['change']):+.2%}" in closeout  # the same number the close-out prints
    assert 0.99 < float(b8["conf"]) < 1  # the interval's real coverage, not "95%"
    exps = {e["variant"]: e["id"] for e in json.loads(kinv("experiments", "3a", "--json").stdout)}
    cmp = json.loads(kinv("compare", str(exps["V1"]), str(exps["V2"]), "--json").stdout)
    assert len(cmp) == 5 and all(c["difference"] > 0 for c in cmp)  # V2 hurts less than V1 at every level
    assert kinv("compare", str(exps["V1"]), "999").returncode == 2
