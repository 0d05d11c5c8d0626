"""Replay never pairs samples of two recording sessions.

The shipped config file's recording and the campaign sweep both hold BT32/BH16/w4/s2 and BT16/BH16/w4/s2.
A pair of configs must be served from one session (same H200 warm-up, same clocks, same rounds), so a config
recorded in two sessions keeps two sets of workers, and a pair is served from the oldest session holding both.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kinv.agent.tools.backends.replay_index import Recording
from kinv.kernels.launch_config import config_hash, effective

H200 = Path(__file__).resolve().parents[3] / "kernels" / "recordings" / "h200"
BT32 = {"kernel": "mla_decode", "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
BT16 = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
B8 = "v4flash/h16/p64/ctx4096/b8"


def _file_rows(name: str, chash: str, level: str, role: str = "R0") -> dict[int, float]:
    out = {}
    with gzip.open(H200 / name, "rt") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("type") == "sample" and row["pair"] == chash and row["role"] == role and row["level"] == level:
                out[row["round"]] = row["us"]
    return out


def test_a_config_recorded_in_two_sessions_is_never_served_as_a_mix_of_both():
    rec = Recording(sorted(H200.glob("*.jsonl.gz")), "mla_decode")
    h = config_hash(BT32)
    old = _file_rows("mla_decode-v4flash-sweep.jsonl.gz", h, B8)
    new = _file_rows("mla_decode-v4flash-shipped.jsonl.gz", h, B8)
    assert old and new, "both sessions hold BT32 at b8"
    served = {r: row["us"] for r, row in rec.cell(rec.sweep_slot(h, None, None, "variant"), B8).items()}
    assert served in (old, new), "the rounds served come from one session only"
    assert served == old  # the oldest session: a newer recording never changes what an older pair served


def test_a_pair_is_served_from_the_session_that_holds_both_sides():
    rec = Recording(sorted(H200.glob("*.jsonl.gz")), "mla_decode")
    live_b8 = {"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2, "CTAS_PER_SM": 2}
    from kinv.kernels.adapter import get_adapter
    a = get_adapter("mla_decode")
    lv = a.level({"shape": "v4flash", "heads": 16, "page_size": 64, "context": 4096, "batch": 8})
    live_h = config_hash(effective(a, a.validate_config(live_b8), lv))
    base = rec.sweep_slot(live_h, config_hash(BT32), None, "base")
    var = rec.sweep_slot(config_hash(BT32), live_h, None, "variant")
    assert base[1].split("@")[1] == var[1].split("@")[1], (base, var)
    served = {r: row["us"] for r, row in rec.cell(var, B8).items()}
    assert served == _file_rows("mla_decode-v4flash-shipped.jsonl.gz", config_hash(BT32), B8, "R1")
    assert {row["config_hash"] for row in rec.cell(var, B8).values()} == {config_hash(BT32)}
    # BT16 against BT32 (both in both sessions): the campaign sweep's pair, as before
    s1 = rec.sweep_slot(config_hash(BT16), config_hash(BT32), None, "base")
    s2 = rec.sweep_slot(config_hash(BT32), config_hash(BT16), None, "variant")
    assert s1[1].split("@")[1] == s2[1].split("@")[1]
