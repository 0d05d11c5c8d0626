"""Crash safety (issue 6, part 1): SIGKILL at the write points, and every start recovers.

* Unit level: a child process patches a config file (and a kernel source) and
  reverts it, and is SIGKILLed at each fault point of that sequence in turn
  (agent/faults.py); the next recovery puts the baseline bytes back and leaves
  no dangling journal row.  The case the issue names, a kill right after the
  file was replaced and before ``applied`` was journaled, is among them and has
  its own test.
* End to end: benchmarks/crash_harness.py kills `kinv run` of a small 3a plan
  at 100 random points (KINV_CRASH_KILLS changes the number) and checks every
  recovery and every finished investigation's verdicts against an
  uninterrupted run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "kernels" / "configs" / "mla_decode.json"

# patch a config (or a copy of a kernel source), then revert it: the sequence whose every point is killed
CHILD = r"""
import json, sys
from pathlib import Path
from kinv.agent.store import Store
from kinv.agent.tools import configs
state, target, kind = sys.argv[1:4]
store = Store(state)
if kind == "config":
    cfg = json.loads(Path(target).read_text())
    row = configs.patch_config(store, target, {k: v for k, v in cfg.items() if k != "description"} | {"num_warps": 8},
                               "#t", None)
else:
    text = Path(target).read_text()
    line = text.splitlines(keepends=True)[0]
    diff = f"--- a/{Path(target).name}\n+++ b/{Path(target).name}\n@@ -1,1 +1,2 @@\n+# patched by the crash test\n {line}"
    row = configs.patch_source(store, target, diff, "#t", None)
configs.revert(store, row["id"])
print("DONE")
"""

RECOVER = r"""
import json, sys
from kinv.agent.store import Store
from kinv.agent.tools import configs

store = Store(sys.argv[1])
done = configs.recover(store)
print(json.dumps({"done": done, "dangling": store.dangling_patches(),
                  "states": [p["state"] for p in store.patches()]}))
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KINV_CRASH_AT", "KINV_COUNT_POINTS", "KINV_STOP_AT")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _target(tmp: Path, kind: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    if kind == "config":
        return Path(shutil.copy(CONFIG, tmp / CONFIG.name))
    return Path(shutil.copy(ROOT / "kernels" / "mla_decode.py", tmp / "mla_decode.py"))


def _child(state: Path, target: Path, kind: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(state), str(target), kind], cwd=ROOT,
                          env=_env(**env), capture_output=True, text=True, timeout=120)  # fmt: skip


def _points(tmp: Path, kind: str) -> list[str]:
    """The fault points of one uninterrupted patch-and-revert, in order."""
    log = tmp / "points"
    r = _child(tmp / "state", _target(tmp / "files", kind), kind, KINV_COUNT_POINTS=str(log))
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines()]


def _recover(state: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", RECOVER, str(state)], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _kill_and_recover(tmp: Path, kind: str, n: int) -> tuple[bytes, bytes, dict, list]:
    """Kill the child at its n-th point; returns (baseline bytes, bytes at death, recovery, journal at death)."""
    target = _target(tmp / "files", kind)
    baseline = target.read_bytes()
    r = _child(tmp / "state", target, kind, KINV_CRASH_AT=str(n))
    assert r.returncode == -signal.SIGKILL, (n, r.returncode, r.stderr)
    at_death = target.read_bytes()
    db = sqlite3.connect(tmp / "state" / "kinv.db")
    journal = db.execute("select state from patches order by id").fetchall()
    db.close()
    rec = _recover(tmp / "state")
    return baseline, at_death, rec, journal


@pytest.mark.parametrize("kind", ["config", "source"])
def test_kill_at_every_point_of_patch_and_revert_recovers_to_baseline(tmp_path, kind):
    names = _points(tmp_path / "count", kind)
    assert {"backup.replaced", "journal.intent.after", "patch.tmp-written", "patch.replaced",
            "journal.applied.after", "restore.replaced", "journal.reverted.after"} <= set(names)  # fmt: skip
    patched_seen = 0
    for n, name in enumerate(names, 1):
        baseline, at_death, rec, _ = _kill_and_recover(tmp_path / f"k{n}", kind, n)
        target = tmp_path / f"k{n}" / "files" / (CONFIG.name if kind == "config" else "mla_decode.py")
        patched_seen += at_death != baseline
        assert target.read_bytes() == baseline, f"killed at {n} ({name}): not restored"
        assert rec["dangling"] == [], f"killed at {n} ({name}): dangling {rec['dangling']}"
        assert [p.name for p in target.parent.iterdir()] == [target.name], f"killed at {n} ({name}): temp file left"
    assert patched_seen > 0  # some kills really left the file patched


def test_kill_after_the_file_write_before_applied_is_journaled_recovers(tmp_path):
    names = _points(tmp_path / "count", "config")
    n = names.index("patch.replaced") + 1  # os.replace is done; journal_set(applied) not yet
    baseline, at_death, rec, journal = _kill_and_recover(tmp_path / "kill", "config", n)
    assert at_death != baseline and b'"num_warps": 8' in at_death  # it died with the new bytes on disk
    assert journal == [("intent",)]  # ... and the journal still saying intent
    assert (tmp_path / "kill" / "files" / CONFIG.name).read_bytes() == baseline
    assert rec["dangling"] == [] and rec["states"] == ["reverted"]
    assert [d["action"] for d in rec["done"]] == ["restored"]


def _harness():
    spec = importlib.util.spec_from_file_location("crash_harness", ROOT / "benchmarks" / "crash_harness.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["crash_harness"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_100_random_sigkills_across_investigations_recover_and_reach_the_same_verdicts(tmp_path):
    harness = _harness()
    kills = int(os.environ.get("KINV_CRASH_KILLS", "100"))
    lanes = max(1, min(4, (os.cpu_count() or 1) + 1))  # one more than the cores: runs wait on fsync too
    summary = harness.run_harness(kills=kills, lanes=lanes, seed=int(os.environ.get("KINV_CRASH_SEED", "0")),
                                  work=tmp_path / "crash", log=lambda *a, **k: None)  # fmt: skip
    print(json.dumps(summary, indent=2))
    assert summary["kills"] >= kills
    assert summary["investigations_completed"] >= 1
    assert summary["recoveries_checked"] >= summary["investigations_completed"]  # each finish was checked too
    # the kills land all over the investigation, patches included
    assert summary["killed_with_config_patched"] > 0
    assert summary["distinct_point_names"] >= 10


def test_restart_resumes_when_a_step_checkpoint_was_lost(tmp_path):
    """A kill between a node's saved writes and its step's checkpoint must resume, not begin again.

    LangGraph saves a finished task's writes, then the step's checkpoint (in the background, with the default
    'async' durability).  A kill in between leaves a last checkpoint whose only task already has its writes:
    ``get_state().next`` is then empty although the graph is not finished.  Simulated here exactly: kill a run
    in V1's measure node, then drop the newest checkpoint (the one taken after the gate).
    """
    harness = _harness()
    plan = harness.tiny_plan(tmp_path / "plan.yaml")
    inv = harness.Investigation(tmp_path / "inv", plan)
    proc, _, log = inv.start(stop_at="store.verdicts.before")  # V1's measure: its rounds are in, no verdict yet
    assert harness.wait_stop_or_exit(proc)[0] == "stopped", log.read_text()
    os.kill(proc.pid, signal.SIGKILL)
    os.waitpid(proc.pid, 0)
    ck = sqlite3.connect(inv.state / "checkpoints.db")
    newest = ck.execute("select max(checkpoint_id) from checkpoints").fetchone()[0]
    ck.execute("delete from writes where checkpoint_id = ?", [newest])
    ck.execute("delete from checkpoints where checkpoint_id = ?", [newest])
    latest = ck.execute("select max(checkpoint_id) from checkpoints").fetchone()[0]
    assert ck.execute("select count(*) from writes where checkpoint_id = ?", [latest]).fetchone()[0] > 0
    ck.commit()
    ck.close()
    proc, _, log = inv.start()
    assert harness.wait_stop_or_exit(proc) == ("exited", 0), log.read_text()
    assert "resuming" in log.read_text(), log.read_text()
    assert inv.fresh_starts() == 1, "the restart began the investigation again instead of resuming it"
    assert inv.config.read_bytes() == inv.baseline and not inv.dangling()
    samples = (
        sqlite3.connect(inv.state / "kinv.db")
        .execute("select count(*) from samples s join experiments e on e.id = s.experiment where e.kind = 'noise'")
        .fetchone()[0]
    )
    assert samples == 2 * 2 * 8  # the A/A rounds were not measured again (2 arms x 2 levels x 8 rounds)


@pytest.mark.parametrize("point", ["node.baseline.committed", "node.noise.committed"])
def test_a_kill_after_baseline_or_noise_committed_but_before_the_checkpoint_measures_nothing_twice(tmp_path, point):
    """Issue 12.5: the baseline and noise nodes find their committed experiment after a kill that came before the
    graph's checkpoint; one baseline and one A/A experiment, the A/A's samples once, the same verdicts."""
    harness = _harness()
    plan = harness.tiny_plan(tmp_path / "plan.yaml")
    inv = harness.Investigation(tmp_path / "inv", plan)
    proc, _, log = inv.start(stop_at=point)
    assert harness.wait_stop_or_exit(proc)[0] == "stopped", log.read_text()
    os.kill(proc.pid, signal.SIGKILL)
    os.waitpid(proc.pid, 0)
    proc, _, log = inv.start()
    assert harness.wait_stop_or_exit(proc) == ("exited", 0), log.read_text()
    db = sqlite3.connect(inv.state / "kinv.db")
    kinds = [k for (k,) in db.execute("select kind from experiments where kind in ('baseline', 'noise')")]
    assert sorted(kinds) == ["baseline", "noise"], kinds
    samples = db.execute("select count(*) from samples s join experiments e on e.id = s.experiment "
                         "where e.kind = 'noise'").fetchone()[0]  # fmt: skip
    assert samples == 2 * 2 * 8
    assert inv.config.read_bytes() == inv.baseline and not inv.dangling()
