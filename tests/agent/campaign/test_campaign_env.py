"""A campaign over an environment variable: a backlog item's ``env`` values are screened around the incumbent config
against one incumbent process, the best are confirmed by a full A/B whose variants set them in their processes'
environment, and the campaign says what it found as a deployment's setting: a config file cannot carry it.

Measured for real on this machine: a summing loop that pays a fixed cost per chunk, its chunk size read from the
environment as a serving process reads TARGET_CTAS."""

from __future__ import annotations

import json

import yaml

from tests.utils import kinv_in_process, replay_env

WORK = """
import json, os, sys, time
chunk = int(os.environ["CHUNK"]); n = int(sys.argv[1]) * 200_000
t0 = time.perf_counter(); total = 0
for start in range(0, n, chunk):
    total += sum(range(start, min(n, start + chunk)))
print(json.dumps({"rate": n / (time.perf_counter() - t0)}))
"""


def _plan(tmp_path) -> dict:
    (tmp_path / "work.py").write_text(WORK)
    return {
        "workstream": {"id": "#12a", "title": "Chunk size of a summing loop, searched over its environment",
                       "parent": "#12", "parent_title": "A campaign over an environment variable"},
        "kernel": "command", "hypothesis": "The loop pays a fixed cost per chunk: a larger CHUNK is faster.",
        "device": "host",
        "workload": {"command": ["{python}", str(tmp_path / "work.py"), "{n}"],
                     "metric": {"json_key": "rate", "unit": "items/s"}, "timeout_s": 30, "warmup": 0,
                     "levels": [{"n": 1}, {"n": 2}]},
        "environment": {"CHUNK": "8"}, "baseline": {}, "baseline_on_disk": False, "variants": [],
        "stats": {"threshold": 0.05, "aa_rounds": 8, "aa_arms": 2, "quick_rounds": 4, "step_rounds": 2,
                  "max_rounds": 8},
        "budget": {"gpu_seconds": 120, "wall_seconds": 600},
        "campaign": {"budget": {"gpu_seconds": 120, "wall_seconds": 600}, "per_level": True,
                     "screen": {"trials": 8, "rounds": 2, "finalists": 2, "min_gain": 0.05}, "max_workstreams": 2,
                     "seed": 1},
        "backlog": [{"id": "CHUNKS", "title": "Chunk size of the loop", "targets": "elsewhere",
                     "rationale": "Each chunk costs a call; fewer, larger chunks cost fewer.",
                     "env": {"CHUNK": ["1", "8", "512"]}}],
    }  # fmt: skip


def test_a_campaign_screens_environment_values_confirms_the_best_and_leaves_the_config_file_alone(tmp_path):
    plan = tmp_path / "chunks.yaml"
    plan.write_text(yaml.safe_dump(_plan(tmp_path)))
    env = replay_env(tmp_path, tmp_path / "state")
    r = kinv_in_process(env, "campaign", str(plan), "--backend", "command", "--approval", "auto")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "screening CHUNK" in r.stdout
    written = yaml.safe_load((tmp_path / "state" / "campaigns" / "12" / "12a.yaml").read_text())
    assert written["variants"][0]["env"] == {"CHUNK": "512"} and "patch" not in written["variants"][0]
    rep = json.loads(kinv_in_process(env, "report", "12a", "--json").stdout)
    v1 = next(e for e in rep["experiments"] if e["experiment"]["variant"] == "V1")
    assert v1["experiment"]["verdict"] == "accept"  # 64x fewer chunks: several times the rate at both sizes
    assert "the environment improved n1 with CHUNK=512 (#12a); n2 with CHUNK=512 (#12a): set it where the kernel runs" \
        in " ".join(r.stdout.split())
    text = (tmp_path / "state" / "reports" / "12a-closeout.md").read_text()
    assert "CHUNK=512 in its processes (the baseline's: 8)" in text


def test_a_backlog_item_with_a_bad_environment_value_is_refused_with_one_line(tmp_path):
    data = _plan(tmp_path)
    data["backlog"][0]["env"] = {"CHUNK": ["8", "8"]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    r = kinv_in_process(replay_env(tmp_path, tmp_path / "state"), "campaign", str(tmp_path / "bad.yaml"),
                        "--backend", "command")  # fmt: skip
    assert r.returncode == 2 and "backlog.CHUNKS.env.CHUNK: give distinct values to try" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "state" / "kinv.db").exists()
