"""Several workstreams and a campaign in one process (as a campaign and the MCP server run them), each with its
own environment variants: nothing one sets up reaches the next, and every process each measures is checked to
have run in its arm's environment.  The commands end within milliseconds, the hardest case for that check."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kinv.agent.store.db import Store
from tests.utils import kinv_in_process, replay_env

ROOT = Path(__file__).resolve().parents[2]
# twice the threads, twice the rate (a few tenths of a percent of noise): a run that ends at once
QUICK = ("import os, json, random; n = int(os.environ['OMP_NUM_THREADS']); "
         "print(json.dumps({{'rate': 100.0 * n * (1 + random.gauss(0, 0.002))}}))  # {n}")


def quick_plan(ws: str, variants: dict[str, str], backlog: list[str] | None = None) -> dict:
    data = yaml.safe_load((ROOT / "plans" / "cpu-matmul-threads.yaml").read_text())
    data["workstream"]["id"] = ws
    data["workload"] = {"command": ["{python}", "-I", "-S", "-c", QUICK], "levels": [{"n": 1}], "timeout_s": 30,
                        "metric": {"json_key": "rate", "unit": "runs/s"}, "warmup": 0}  # fmt: skip
    data["environment"] = {"OMP_NUM_THREADS": "2"}
    data["variants"] = [{**data["variants"][0], "id": v, "env": {"OMP_NUM_THREADS": n}} for v, n in variants.items()]
    data["stats"].update(aa_rounds=8, aa_arms=2, quick_rounds=2, step_rounds=2, max_rounds=4, threshold=0.05)
    if backlog:
        data["variants"] = []
        data["workstream"].update(parent="#13", parent_title="Threads, searched")
        data["campaign"] = {"budget": {"gpu_seconds": 120, "wall_seconds": 600}, "per_level": True, "seed": 1,
                            "screen": {"trials": 8, "rounds": 2, "finalists": 1, "min_gain": 0.05},
                            "max_workstreams": 1}  # fmt: skip
        data["backlog"] = [{"id": "THREADS", "title": "Threads", "targets": "elsewhere", "rationale": "more threads",
                            "env": {"OMP_NUM_THREADS": backlog}}]  # fmt: skip
    return data


def test_workstreams_and_a_campaign_in_one_process_each_measure_in_their_own_environment(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    runs = [("11a", quick_plan("#11a", {"T1": "1", "T3": "3"}), "run"), ("11b", quick_plan("#11b", {"T3": "3", "T4": "4"}), "run"),
            ("13", quick_plan("#13a", {}, backlog=["1", "2", "4"]), "campaign")]  # fmt: skip
    for name, data, command in runs:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        r = kinv_in_process(env, command, str(path), "--backend", "command", "--approval", "auto")
        assert r.returncode == 0, f"{name}: " + r.stdout[-2000:] + r.stderr[-2000:]
    checks = Store(tmp_path / "state").env_checks()
    assert checks and all(c["ok"] for c in checks), [c["mismatch"] for c in checks if not c["ok"]]
    seen = {json.loads(c["seen"])["OMP_NUM_THREADS"] if isinstance(c["seen"], str) else c["seen"]["OMP_NUM_THREADS"]
            for c in checks}  # fmt: skip
    assert {"1", "2", "3", "4"} <= seen  # every workstream's variants, and the campaign's confirmation of 4 threads
    workstreams = {w["id"]: w["status"] for w in Store(tmp_path / "state").workstreams()}
    assert workstreams["#11a"] == workstreams["#11b"] == "closed" and workstreams.get("#13a") == "closed"
