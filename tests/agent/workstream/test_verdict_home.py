"""A verdict has one home, the store: the run's graph state holds each decided variant's experiment id, and the
rules (moot, next, the ranking) read the verdicts from kinv.db.  A run checkpointed by an earlier kinv (its state
held each result itself, with its experiment id) resumes; one whose results carry no ids is refused in one line."""

from __future__ import annotations

import json
import sqlite3

import pytest

from kinv.agent.errors import StateDamaged
from kinv.agent.store.db import Store
from kinv.agent.workstream import planner
from tests.utils import replay_env, run_kinv

PLAN = "plans/3a-attention-occupancy.yaml"
LEVELS = ("b1", "b8")


def _decided_v1(store: Store, verdict: str, level_verdicts: dict[str, str]) -> int:
    store.upsert_workstream({"id": "#3a", "title": "occupancy", "kernel": "mla_decode", "status": "running"})
    exp = store.new_experiment(workstream="#3a", todo="#3a.V1", variant="V1", kind="ab", backend="replay",
                               config_hash="v1", base_config_hash="base", status="done", verdict=verdict,
                               reason=f"{verdict} at every level")  # fmt: skip
    store.add_verdicts(exp, [{"level": lv, "n": 8, "effect": -0.1, "verdict": v} for lv, v in level_verdicts.items()])
    return exp


def test_the_rules_read_a_decided_variant_from_the_store(state_dir):
    store = Store(state_dir)
    exp = _decided_v1(store, "reject", dict.fromkeys(LEVELS, "regressed"))
    got = planner.results(store, planner.decided({"decided": {"V1": exp}}))
    assert got == {"V1": {"verdict": "reject", "reason": "reject at every level", "exp_id": exp,
                          "levels": {"b1": "regressed", "b8": "regressed"}}}  # fmt: skip


def test_an_earlier_kinvs_checkpoint_is_read_by_its_experiment_ids(state_dir):
    """Its ``results`` held each verdict itself; only the id is taken: the verdict is the store's."""
    store = Store(state_dir)
    exp = _decided_v1(store, "reject", dict.fromkeys(LEVELS, "regressed"))
    old = {"results": {"V1": {"verdict": "reject", "reason": "stale copy", "levels": {}, "exp_id": exp}}}
    assert planner.decided(old) == {"V1": exp}
    assert planner.results(store, planner.decided(old))["V1"]["levels"] == {"b1": "regressed", "b8": "regressed"}
    # a checkpoint that has both (resumed once by this kinv): the earlier ids and the new ones together
    assert planner.decided({**old, "decided": {"V2": exp + 1}}) == {"V1": exp, "V2": exp + 1}


def test_a_checkpoint_whose_results_carry_no_experiment_id_is_refused_in_one_line():
    with pytest.raises(StateDamaged) as e:
        planner.decided({"results": {"V1": {"verdict": "reject", "levels": {}}}})
    line = str(e.value)
    assert "\n" not in line and "V1" in line and "--new-version" in line


def test_a_checkpoint_naming_an_experiment_kinv_db_lacks_is_refused(state_dir):
    with pytest.raises(StateDamaged, match="experiment 99 for V1"):
        planner.results(Store(state_dir), {"V1": 99})


def _to_earlier_shape(state_dir, store: Store) -> None:
    """Rewrite the newest checkpoint as the earlier kinv wrote it: ``results`` (each with its exp_id), no ids."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    db = sqlite3.connect(state_dir / "checkpoints.db")
    serde = SqliteSaver(db).serde
    row = db.execute("select rowid, type, checkpoint from checkpoints order by checkpoint_id desc limit 1").fetchone()
    ck = serde.loads_typed((row[1], row[2]))
    decided = ck["channel_values"].pop("decided")
    assert decided  # V1 was decided before V2's approval
    ck["channel_values"]["results"] = {vid: {"verdict": store.experiment(e)["verdict"], "levels": {}, "exp_id": e}
                                       for vid, e in decided.items()}  # fmt: skip
    ck["channel_versions"]["results"] = ck["channel_versions"].pop("decided")
    db.execute("update checkpoints set type = ?, checkpoint = ? where rowid = ?", [*serde.dumps_typed(ck), row[0]])
    db.commit()
    db.close()


@pytest.mark.slow
def test_a_run_checkpointed_by_an_earlier_kinv_resumes_with_its_verdicts_from_the_store(tmp_path, state_dir):
    env = replay_env(tmp_path, state_dir)
    assert run_kinv(env, "run", PLAN, "--backend", "replay", "--approval", "ask").returncode == 3  # V1's approval

    def approve_next() -> int:
        aid = next(a["id"] for a in json.loads(run_kinv(env, "pending", "--json").stdout) if a["status"] == "pending")
        assert run_kinv(env, "approve", aid).returncode == 0
        return run_kinv(env, "resume", "3a", "--approval", "ask").returncode

    assert approve_next() == 3  # V1 decided; paused at V2's approval
    store = Store(str(state_dir))
    _to_earlier_shape(state_dir, store)
    r = approve_next()
    assert r == 0
    todos = {t["id"]: t for t in store.todos("#3a")}
    # V3 needs V1 to improve somewhere: the rule read V1's per-level verdicts from kinv.db by the old checkpoint's id
    v1_levels = {row["verdict"] for e in store.experiments("#3a") if e["variant"] == "V1" for row in store.verdicts(e["id"])}
    if v1_levels == {"regressed"}:
        assert todos["#3a.V3"]["status"] == "cancelled" and "V1 regressed at every level" in todos["#3a.V3"]["reason"]
    assert todos["#3a.V2"]["status"] == "completed" and (state_dir / "reports" / "3a-closeout.md").is_file()
