"""The Store's experiment and campaign rows, read back as a caller reads them: JSON columns come back as data, a
killed node finds its running or finished experiment, a discarded experiment takes its samples and verdicts with
it, and a campaign's ledger counts stored and lost samples."""

from __future__ import annotations

import time

from kinv.agent.store.db import Store


def _store(tmp_path) -> Store:
    store = Store(tmp_path / "state")
    store.upsert_workstream({"id": "#9a", "title": "rows", "status": "running"})
    return store


def _sample(exp: int, level: str, gpu_s: float, place: str | None = None) -> dict:
    return {"experiment": exp, "round": 0, "arm": "A", "level": level, "us": 10.0, "gpu_s": gpu_s, "place": place,
            "env": {"X": "1"}}


def test_an_experiments_rows_round_trip_and_a_discard_takes_its_samples_and_verdicts(tmp_path):
    store = _store(tmp_path)
    dev = store.device({"gpu": "NVIDIA H100", "sms": 132, "note": "not part of the id"})
    assert dev == store.device({"gpu": "NVIDIA H100", "sms": 132})  # the id is of the stable fields only
    assert store.device_fingerprint(dev)["note"] == "not part of the id"
    exp = store.new_experiment(workstream="#9a", todo="#9a.V1", kind="ab", variant="V1", device=dev, version=1,
                               resources={"levels": ["b1"]})
    assert store.running_experiment("#9a", "#9a.V1", "ab")["id"] == exp
    store.merge_resources(exp, compiled={"b1": {"registers": 96}})
    store.add_samples([_sample(exp, "b1", 0.5, "GPU0"), _sample(exp, "b8", 0.25, "GPU1"),
                       _sample(exp, "b1", 0.5, "GPU0")])
    store.add_verdicts(exp, [{"level": "b1", "n": 2, "effect": 0.02, "verdict": "improved"}])
    store.update_experiment(exp, status="done", verdict="accept", correctness={"ok": True})
    row = store.experiment(exp)
    assert '"registers": 96' in row["resources"] and '"levels"' in row["resources"]
    assert row["correctness"] == '{"ok": true}'
    assert store.running_experiment("#9a", "#9a.V1", "ab") is None
    assert store.done_experiment("#9a", "#9a.V1", "ab", 1)["id"] == exp
    assert store.done_experiment("#9a", "#9a.V1", "ab", 2) is None  # another plan version measures again
    assert store.places([exp]) == {"GPU0": ["b1"], "GPU1": ["b8"]}
    assert store.sample_count(exp) == 3 and [v["verdict"] for v in store.verdicts(exp)] == ["improved"]
    store.discard_experiment(exp)
    assert store.experiment(exp) is None and store.sample_count() == 0 and store.verdicts(exp) == []


def test_a_campaigns_row_and_its_ledger_count_stored_and_lost_samples(tmp_path):
    store = _store(tmp_path)
    store.upsert_campaign({"id": "#c1", "status": "running", "incumbent": {"num_warps": 4}, "steps": []})
    store.upsert_campaign({"id": "#c1", "steps": [{"ws": "#9a"}]})
    got = store.campaign("#c1")
    assert got["incumbent"] == {"num_warps": 4} and got["steps"] == [{"ws": "#9a"}] and got["status"] == "running"
    assert [c["id"] for c in store.campaigns()] == ["#c1"]
    exp = store.new_experiment(workstream="#9a", todo="#9a.V1", kind="ab")
    store.add_samples([_sample(exp, "b1", 0.5), _sample(exp, "b8", 0.25)])
    store.event("#9a", "sample.lost", "b1 lost its sample", {"experiment": exp, "gpu_s": 0.125})
    assert store.ledger_sums([exp], []) == (0.75, 2, 0.125, 1)
    assert store.ledger_sums([], ["#9a"]) == (0.75, 2, 0.125, 1)
    assert store.ledger_sums([], []) == (0.0, 0, 0.0, 0)
    store.add_node_run("#9a", 1, "setup", started=time.time() - 2.0, decision=None, outcome="ok")
    assert 1.9 < store.campaign_wall_s(["#9a"]) < 60.0  # the node's two seconds (no screening ran)
    assert store.campaign_wall_s([]) == 0.0
