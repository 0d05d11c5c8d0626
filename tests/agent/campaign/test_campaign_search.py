"""A campaign's search and its records: Optuna's ask/tell proposes (a grid where the space fits the trial budget,
TPE where it does not), kinv.db's screened table holds what each candidate measured, and a confirmation
workstream's result is read from its verdicts as a typed model."""

from __future__ import annotations

import math

import pytest

from kinv.agent.campaign.results import read_workstream
from kinv.agent.campaign.search import open_search
from kinv.agent.store.db import Store

SPACE = {"BLOCK_T": [16, 32, 64, 128], "num_warps": [4, 8]}


def _store(state_dir) -> Store:
    store = Store(str(state_dir))
    store.upsert_workstream({"id": "#7a", "title": "Token-tile sweep", "kernel": "mla_decode", "status": "open"})
    return store


def _ask_all(search):
    trials = [search.ask() for _ in range(search.batch(first=True))]
    return trials, [tuple(sorted(t.params.items())) for t in trials]


def test_a_space_that_fits_the_trial_budget_is_searched_by_a_grid_every_point_once(tmp_path):
    s = open_search(tmp_path / "optuna.db", "#7-#7a", SPACE, trials=8, seed=7, n_objectives=2)
    assert s.exhaustive and s.label.startswith("grid") and s.budget == 8
    trials, points = _ask_all(s)
    assert len(points) == len(set(points)) == 8  # the whole space, in one batch, no point twice
    for t in trials:
        s.tell(t, [0.01, 0.02])  # no Study.stop error when the grid is spent under ask/tell
    assert s.finished() == s.budget


def test_a_larger_space_is_searched_by_tpe_within_the_trial_budget(tmp_path):
    s = open_search(tmp_path / "optuna.db", "#7-#7a", SPACE, trials=6, seed=7, n_objectives=1)
    assert not s.exhaustive and s.label.startswith("TPE") and s.budget == 6
    assert s.batch(first=True) == 3 and s.batch(first=False) == 2  # startup batch, then smaller ones


def test_a_killed_search_asks_its_untold_trials_again_without_spending_its_budget(tmp_path):
    s = open_search(tmp_path / "optuna.db", "#7-#7a", SPACE, trials=8, seed=7, n_objectives=1)
    trials, _points = _ask_all(s)
    for t in trials[:5]:
        s.tell(t, [0.0])
    untold = {tuple(sorted(t.params.items())) for t in trials[5:]}  # the kill came before these were told
    again = open_search(tmp_path / "optuna.db", "#7-#7a", SPACE, trials=8, seed=7, n_objectives=1)
    assert again.requeued == 3 and again.budget == 11
    asked = [again.ask() for _ in range(again.batch(first=True))]
    assert {tuple(sorted(t.params.items())) for t in asked[:3]} == untold


def test_a_screened_candidate_is_one_row_of_kinv_db_counted_each_time_it_is_asked(state_dir):
    store = _store(state_dir)
    exp = store.new_experiment(workstream="#7a", todo="#7a.screen", variant="screen", kind="screen")
    store.screen_asked(exp, "h2", 4, "BT32", '{"BLOCK_T": 32}')
    store.screen_asked(exp, "h1", 1, "BT64", '{"BLOCK_T": 64}')
    store.screen_asked(exp, "h2", 9, "BT32", '{"BLOCK_T": 32}')
    store.screen_result(exp, "h2", "measured", gains={"b1": 0.05}, measured_on="this process")
    store.screen_result(exp, "h1", "pruned", reason="infeasible: shared memory")
    rows = store.screened(exp)
    assert [(r["config_hash"], r["trial"], r["asked"], r["status"]) for r in rows] == [
        ("h1", 1, 1, "pruned"), ("h2", 4, 2, "measured")]
    assert rows[1]["gains"] == {"b1": 0.05} and rows[1]["config_json"] == {"BLOCK_T": 32}


@pytest.mark.parametrize("final", [False, True])
def test_a_workstreams_result_is_read_from_its_verdicts(state_dir, final):
    store = _store(state_dir)
    for vid, verdict, effects in (("V1", "mixed", {"b1": 0.04, "b8": -0.02}), ("V2", "accept", {"b1": 0.02, "b8": 0.03}),
                                  ("V3", "void", {"b1": 0.5, "b8": 0.5})):  # fmt: skip
        exp = store.new_experiment(workstream="#7a", todo=f"#7a.{vid}", variant=vid, kind="ab")
        store.update_experiment(exp, status="done", verdict=verdict)
        store.add_verdicts(exp, [{"level": lv, "n": 12, "base_us": 10.0, "variant_us": 10.0 / math.exp(e),
                                  "effect": e, "ci_low": e - 0.01, "ci_high": e + 0.01, "ratio": math.exp(e),
                                  "threshold": 0.01, "conf": 0.95, "verdict": "improved" if e > 0.01 else "regressed"}
                                 for lv, e in effects.items()])  # fmt: skip
    res = read_workstream(store, "#7a", final=final)
    assert res.verdicts == {"V1": "mixed", "V2": "accept", "V3": "void"}
    if final:  # every level's change against the start, from the last variant that measured it
        assert set(res.levels) == {"b1", "b8"} and res.levels["b8"].verdict == "improved"
    else:  # a void verdict wins nothing; the largest improvement at each level does
        assert res.winners == {"b1": "V1", "b8": "V2"}
        assert res.levels["b1"].effect == pytest.approx(math.expm1(0.04))
        assert res.levels_json()["b8"]["by"] == "V2"


def _cut_trial(db, name, fixed=None):
    """A trial as a kill inside ``ask`` leaves it: created (RUNNING), none of its parameters set."""
    import optuna

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    if fixed is not None:  # a requeued trial popped from the queue, cut before its parameters were suggested
        study.enqueue_trial(fixed)
        return study._storage.get_trial(study._pop_waiting_trial_id()).number
    return study._storage.get_trial(study._storage.create_new_trial(study._study_id)).number


@pytest.mark.parametrize("space_trials", [8, 6], ids=["grid", "tpe"])
def test_a_trial_cut_before_its_parameters_were_set_does_not_wedge_the_search(tmp_path, space_trials):
    import optuna

    db = tmp_path / "optuna.db"
    s = open_search(db, "#7-#7a", SPACE, trials=space_trials, seed=7, n_objectives=1)
    for t in [s.ask() for _ in range(3)]:
        s.tell(t, [0.01])
    _cut_trial(db, "#7-#7a")
    _cut_trial(db, "#7-#7a", fixed={})  # an empty requeue left by an earlier start: it must not wedge either
    optuna.load_study(study_name="#7-#7a", storage=f"sqlite:///{db}").enqueue_trial({})  # nor one still queued
    again = open_search(db, "#7-#7a", SPACE, trials=space_trials, seed=7, n_objectives=1)
    asked = [again.ask() for _ in range(again.batch(first=False))]  # raised before: "All parameters must be ..."
    assert asked and all(set(t.params) == set(SPACE) for t in asked)
    assert again.budget - again.finished() == space_trials - 3  # no cut or queued trial used up the budget
    third = open_search(db, "#7-#7a", SPACE, trials=space_trials, seed=7, n_objectives=1)  # and a kill again
    assert all(set(t.params) == set(SPACE) for t in [third.ask()])


def test_a_grid_trial_cut_after_its_grid_point_was_chosen_is_asked_again_at_that_point(tmp_path):
    import itertools

    import optuna

    db = tmp_path / "optuna.db"
    s = open_search(db, "#7-#7a", SPACE, trials=8, seed=7, n_objectives=1)
    seven = [s.ask() for _ in range(7)]
    for t in seven:
        s.tell(t, [0.01])
    study = optuna.load_study(study_name="#7-#7a", storage=f"sqlite:///{db}")
    done = [study._storage.get_trial(t._trial_id).system_attrs for t in seven]
    # the eighth point was chosen (its grid id written) and the kill came before its parameters were
    tid = study._storage.create_new_trial(study._study_id)
    study._storage.set_trial_system_attr(tid, "grid_id", (set(range(8)) - {a["grid_id"] for a in done}).pop())
    study._storage.set_trial_system_attr(tid, "search_space", done[0]["search_space"])
    left = {tuple(sorted(zip(SPACE, p))) for p in itertools.product(*SPACE.values())}
    left -= {tuple(sorted(t.params.items())) for t in seven}
    again = open_search(db, "#7-#7a", SPACE, trials=8, seed=7, n_objectives=1)
    assert again.budget - again.finished() == 1
    assert {tuple(sorted(again.ask().params.items()))} == left  # completed from the grid, not a random point


def test_a_study_that_cannot_be_loaded_is_one_line_naming_the_way_back(tmp_path):
    from kinv.agent.errors import StateDamaged

    db = tmp_path / "optuna.db"
    db.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StateDamaged) as e:
        open_search(db, "#7-#7a", SPACE, trials=8, seed=7, n_objectives=1)
    msg = str(e.value)
    assert "\n" not in msg and str(db) in msg and "kinv.db" in msg and "mv " in msg


def test_kinv_doctor_names_the_way_back_for_a_damaged_study(tmp_path, state_dir):
    import json
    import os

    from tests.utils import kinv_in_process

    store = _store(state_dir)
    store.conn.execute("insert into campaigns (id, plan_path, status) values ('#7', 'plans/7-decode-ceiling.yaml', "
                       "'running')")  # fmt: skip
    store.conn.commit()
    (state_dir / "optuna.db").write_bytes(b"not a database at all" * 100)
    r = kinv_in_process(dict(os.environ), "doctor", "--json")
    found = {f["check"]: f for f in json.loads(r.stdout)}
    assert r.returncode == 1 and found["search study"]["status"] == "bad"
    assert found["search study"]["fix"].startswith(f"mv {state_dir / 'optuna.db'} ")
    assert "kinv campaign plans/7-decode-ceiling.yaml" in found["search study"]["fix"]
