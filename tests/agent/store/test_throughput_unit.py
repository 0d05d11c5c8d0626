"""A stored throughput carries its unit: the adapter's (tok/s for MLA decode, TFLOP/s for the MoE expert GEMM),
never a column named for one of them; a kinv.db written before the unit was stored still opens, its rows
labelled with the unit their kernel's adapter declares."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from kinv.agent import store as store_mod
from kinv.agent.store.db import Store
from tests.utils import kinv_in_process as run_kinv
from tests.utils import replay_env

ROOT = Path(__file__).resolve().parents[3]


def test_bench_stores_the_moe_kernels_throughput_in_tflops_and_says_so(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    shutil.copy(ROOT / "kernels" / "configs" / "moe_expert_gemm.json", Path(env["KINV_CONFIG_DIR"]))
    r = run_kinv(env, "bench", "--plan", "plans/4a-expert-gemm-tiles.yaml", "--backend", "replay", "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown and all(m["throughput_unit"] == "TFLOP/s" and m["throughput"] > 0 for m in shown)
    assert all("tokens_per_s" not in m for m in shown)
    store = Store(str(state_dir))
    (exp,) = [e for e in store.experiments() if e["kind"] == "bench"]
    rows = store.measurements(exp["id"])
    assert len(rows) == len(shown)
    for row, m in zip(rows, shown):
        assert "tokens_per_s" not in row
        assert row["throughput_unit"] == "TFLOP/s" and row["throughput"] == m["throughput"]


def test_an_old_db_with_a_tokens_per_s_column_opens_and_its_rows_get_their_kernels_unit(tmp_path, monkeypatch):
    old = [m for m in store_mod.schema.MIGRATIONS if m[0] <= "m007"]
    monkeypatch.setattr(store_mod.schema, "MIGRATIONS", old)
    s = Store(tmp_path / "state")
    ids = {}
    for kernel in ("mla_decode", "moe_expert_gemm", "gone_plugin"):
        ids[kernel] = s.new_experiment(kind="bench", variant="config", backend="replay",
                                       config_json=json.dumps({"kernel": kernel}))  # fmt: skip
        s.conn.execute("insert into measurements (experiment, level, us, tokens_per_s) values (?, 'l', 10.0, 4.5)",
                       [ids[kernel]])  # fmt: skip
    s.conn.commit()
    s.close()
    monkeypatch.undo()
    s = Store(tmp_path / "state")  # migrated on open
    units = {k: s.measurements(e)[0] for k, e in ids.items()}
    assert units["mla_decode"]["throughput_unit"] == "tok/s" and units["mla_decode"]["throughput"] == 4.5
    assert units["moe_expert_gemm"]["throughput_unit"] == "TFLOP/s" and units["moe_expert_gemm"]["throughput"] == 4.5
    assert units["gone_plugin"]["throughput_unit"] is None  # a kernel kinv cannot load here: unit unknown, not guessed
    cols = {r[1] for r in sqlite3.connect(tmp_path / "state" / "kinv.db").execute("pragma table_info(measurements)")}
    assert "tokens_per_s" not in cols and {"throughput", "throughput_unit"} <= cols
