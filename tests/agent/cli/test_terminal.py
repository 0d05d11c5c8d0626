"""What the terminal shows: every label, state word and column whole, at 80 columns and when piped.

A level-conditional config's label carries its overrides in brackets ("BT64/BH16/w8/s2 [b<=1: w8; b2-8: BT32]");
rich would read them as a style tag and drop them.  Tables fold a cell rather than drop a column, the status
tree wraps a line rather than cut its state word, and piped output (a log, ``| grep``) is never wrapped or cut.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

from benchmarks.demo_store import populate_demo
from kinv.agent.report import render, views
from kinv.agent.store.db import Store

ROOT = Path(__file__).resolve().parents[3]
LABEL = "BT64/BH16/w8/s2 [b<=1: w8; b2-8: BT32]"
LONG_FILE = "/a/rather/long/checkout/path/of/a/user/kernels/configs/mla_decode.json"


def _populate(d: Path) -> dict:
    store = Store(d)
    ids = populate_demo(store, n_experiments=3, n_samples=60)
    store.upsert_workstream({"id": "#7c", "parent": "#7", "parent_title": "Decode throughput ceiling",
                             "title": "Campaign #7: its config against the starting baseline", "kernel": "mla_decode",
                             "status": "interrupted", "backend": "replay", "approval": "ask"})  # fmt: skip
    store.upsert_todo({"id": "#7c.V1", "workstream": "#7c", "content": f"V1: {LABEL}", "status": "in_progress",
                       "reason": "a rather long reason that runs on and on past the right edge of an 80-column "
                                 "terminal, then says the state word at its very end: interrupted",
                       "position": 0})  # fmt: skip
    exp = store.new_experiment(workstream="#7c", todo="#7c.V1", variant=LABEL, kind="ab", backend="replay",
                               status="done", verdict="accept", reason=f"{LABEL} improved at b1 (+71.95%)",
                               rounds=8, gpu_s=1.0)  # fmt: skip
    store.add_verdicts(exp, [{"level": f"v4flash/h16/p64/ctx4096/b{b}", "n": 8, "base_us": 10.0, "variant_us": 9.0,
                              "effect": 0.1, "ci_low": 0.05, "ci_high": 0.15, "ratio": 1.1, "threshold": 0.01,
                              "verdict": "improved"} for b in (1, 8, 32, 64, 96)])  # fmt: skip
    store.add_backup(LONG_FILE, str(d / "backups" / "7c" / "mla_decode.json.0123456789abcdef"), "0123456789abcdef",
                     "#7c")  # fmt: skip
    store.close()
    return {**ids, "label_exp": exp}


def _kinv(state: Path, *args, columns: int = 80):
    from tests.utils import kinv_in_process

    env = dict(os.environ, KINV_STATE_DIR=str(state), COLUMNS=str(columns), LINES="40", PYTHONPATH=str(ROOT))
    return kinv_in_process(env, *args)  # its output piped, as a child's


def _flat(text: str) -> str:
    """The words of a rendering, whatever wrapped them: tree guides, table padding and line breaks removed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"[│├└─┃━┡┩┏┓┗┛┳┻╇]+", " ", text)
    return re.sub(r"\s+", " ", text)


def _column(out: str, head: str, next_head: str) -> str:
    """One column of a rendered table, its folded cell lines joined (the slice under its header, row by row)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in out.splitlines()]
    hl = next(ln for ln in lines if re.search(rf"\b{head}\b", ln) and re.search(rf"\b{next_head}\b", ln))
    a, b = re.search(rf"\b{head}\b", hl).start(), re.search(rf"\b{next_head}\b", hl).start()
    return "".join(ln[a:b].strip() for ln in lines[lines.index(hl) + 1 :] if not set(ln.strip()) <= set("─ "))


def _no_ws(text: str) -> str:
    return re.sub(r"\s+", "", _flat(text))


@pytest.fixture
def filled(state_dir):
    return _populate(state_dir)


def test_show_status_and_experiments_print_a_level_conditional_label_whole_when_piped(state_dir, filled):
    for args in (("show", str(filled["label_exp"])), ("status",), ("experiments", "7c")):
        r = _kinv(state_dir, *args)
        assert r.returncode == 0, r.stderr
        assert LABEL in r.stdout, (args, r.stdout)


def test_piped_status_at_80_and_200_columns_cuts_no_line(state_dir, filled):
    for cols in (80, 200):
        out = _kinv(state_dir, "status", columns=cols).stdout
        assert "…" not in out
        # the header's state word, the todo's reason to its last word, the verdict line's reason to its end
        assert "Campaign #7: its config against the starting baseline — interrupted" in out
        assert "then says the state word at its very end: interrupted" in out
        assert f"{LABEL} improved at b1 (+71.95%)" in out
        for line in out.splitlines():  # every verdict line whole (a noise band, a reason)
            if line.lstrip().startswith("verdict "):
                assert line.rstrip().endswith(")") or "—" in line, line


def test_piped_backups_compare_and_kernels_keep_every_column(state_dir, filled):
    out = _kinv(state_dir, "backups").stdout
    for head in ("id", "workstream", "file", "backup", "sha"):
        assert re.search(rf"\b{head}\b", out.splitlines()[1] if out.startswith(" ") else out), (head, out)
    assert LONG_FILE in out and "0123456789abcdef" in out
    assert re.search(r"^\s*\d+\s+#7c\s", out, re.M), out  # the id column is there, with its value
    a, b = filled["by_variant"]["V1"][0], filled["label_exp"]
    out = _kinv(state_dir, "compare", str(a), str(b)).stdout
    assert "level" in out and all(f"b{n} " in out for n in (1, 8, 32, 64, 96)), out
    out = _kinv(state_dir, "kernels").stdout
    assert "kinv.kernels.mla_decode_adapter:MLADecodeAdapter" in out
    assert "kinv.kernels.moe_expert_gemm_adapter:MoEExpertGemmAdapter" in out
    assert "BLOCK_T 16/32/64/128/256" in out and "…" not in out


def _tty(width: int = 80):
    from rich.console import Console

    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system="standard", highlight=False)


def test_on_an_80_column_terminal_status_wraps_and_keeps_every_state_word(state_dir, filled):
    con = _tty()
    store = Store(state_dir, create=False)
    render.status(con, views.status(store))
    out = con.file.getvalue()
    assert "…" not in out
    flat = _flat(out)
    assert "— interrupted" in flat
    for word in ("completed", "cancelled", "in_progress", "pending"):
        assert word in flat, word
    assert _no_ws(f"V1: {LABEL}") in _no_ws(out)  # the label, wrapped perhaps, but whole
    assert "theverywordatitsveryend".replace("very", "state", 1) in _no_ws(out).replace("statestate", "state")


def test_on_an_80_column_terminal_tables_fold_and_drop_no_column(state_dir, filled):
    store = Store(state_dir, create=False)
    con = _tty()
    render.backups(con, views.backups(store))
    out = con.file.getvalue()
    assert "…" not in out
    head = _flat(out)
    for word in ("id", "workstream", "file", "backup", "sha"):
        assert re.search(rf"\b{word}\b", head), (word, out)
    assert _no_ws(LONG_FILE) in _column(out, "file", "backup") and "#7c" in out
    con = _tty()
    render.experiments(con, views.experiments(store, "#7c"))
    assert _no_ws(LABEL) in _no_ws(_column(con.file.getvalue(), "variant", "kind")) and "…" not in con.file.getvalue()
    from kinv.agent.workstream.commands import kernels_command

    con = _tty()
    kernels_command(False, con)
    out = con.file.getvalue()
    assert "…" not in out
    adapters, tunables = _no_ws(_column(out, "adapter", "tunables")), _no_ws(_column(out, "tunables", "dimensions"))
    assert "kinv.kernels.mla_decode_adapter:MLADecodeAdapter" in adapters, out
    assert "BLOCK_T16/32/64/128/256" in tunables and "num_stages1/2/3/4/5" in tunables, out


def test_a_data_string_is_never_read_as_markup(state_dir, filled):
    """Reasons, titles and approval text print as written, brackets and all."""
    store = Store(state_dir, create=False)
    con = _tty(200)
    render.show(con, views.show(store, filled["label_exp"]))
    render.pending(con, views.pending(store))
    out = re.sub(r"\x1b\[[0-9;]*m", "", con.file.getvalue())
    assert f"#7c {LABEL} (ab, replay): accept — {LABEL} improved at b1 (+71.95%)" in out


def test_bench_prints_a_conditional_label_whole(tmp_path, state_dir):
    """`kinv bench` of a level-conditional config (replayable: each level's config was recorded) names it whole."""
    import json

    cfg = tmp_path / "cond.json"
    label = "BT64/BH16/w4/s2 [b<=1: w8; b2-8: BT32]"
    cfg.write_text(json.dumps({"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
                               "overrides": [{"batch_max": 1, "num_warps": 8},
                                             {"batch_min": 2, "batch_max": 8, "BLOCK_T": 32}]}))  # fmt: skip
    r = _kinv(state_dir, "bench", "--config", str(cfg), "--backend", "replay", "--samples", "2")
    assert r.returncode == 0, r.stderr
    assert f"{label} at v4flash/h16/p64/ctx4096/*: median of 2 samples per level" in r.stdout, r.stdout
