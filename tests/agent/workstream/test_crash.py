"""Crash safety: SIGKILL at the write points, and every start recovers.

* Unit level: a child process patches a config file (and a kernel source) and
  reverts it, and is SIGKILLed at each fault point of that sequence in turn
  (agent/faults.py); the next recovery puts the baseline bytes back and leaves
  no dangling journal row.  The case the issue names, a kill right after the
  file was replaced and before ``applied`` was journaled, is among them and has
  its own test.
* End to end: benchmarks/crash_harness.py kills `kinv run` of a small 3a plan
  at 40 random points (KINV_CRASH_KILLS changes the number; the harness's own
  command, in benchmarks/RESULTS.md, runs 100) and checks every recovery and
  every finished investigation's verdicts against an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "kernels" / "configs" / "mla_decode.json"

# patch a config (or a copy of a kernel source), then revert it: the sequence whose every point is killed
CHILD = r"""
import json, sys
from pathlib import Path
from kinv.agent.store.db import Store
from kinv.agent.tools.files import configs
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
from kinv.agent.store.db import Store
from kinv.agent.tools.files import configs

store = Store(sys.argv[1])
done = configs.recover(store)
print(json.dumps({"done": done, "dangling": store.dangling_patches(),
                  "states": [p["state"] for p in store.patches()]}))
"""



def _run_3a_until_v1_is_patched(env: dict) -> subprocess.Popen:
    """#3a on replay in a subprocess, returned once V1's patch is live on disk (its output read up to there)."""
    proc = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "run", str(PLAN3A), "--backend", "replay",
                             "--approval", "auto"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines = []
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "V1: patched" in line or (not line and proc.poll() is not None):
            break
    if "V1: patched" not in lines[-1]:
        proc.kill()
        raise AssertionError("".join(lines))
    return proc

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


def test_random_sigkills_across_investigations_recover_and_reach_the_same_verdicts(tmp_path):
    harness = _harness()
    # a sample of the harness's kills (benchmarks/RESULTS.md records its 100-kill run); KINV_CRASH_KILLS for more
    kills = int(os.environ.get("KINV_CRASH_KILLS", "14"))
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
    """The baseline and noise nodes find their committed experiment after a kill that came before the
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


# --------------------------------------------------------------------------- #
# a live run, then a kill -9, then damaged or lost state
# --------------------------------------------------------------------------- #
PLAN3A = ROOT / "plans" / "3a-attention-occupancy.yaml"


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its exit status is left


def _kinv(env, *args, cwd=ROOT):
    from tests.utils import run_kinv

    return run_kinv(env, *args, cwd=cwd)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """#3a on replay, observed while V1's patch is live (doctor from its own and from a second state dir, its
    correctness child), then killed with SIGKILL; returns what was seen and the state it left."""

    from tests.utils import replay_env

    tmp = tmp_path_factory.mktemp("killed")
    env = replay_env(tmp, tmp / "state", PYTHONUNBUFFERED="1")
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    seen = {"baseline": cfg.read_bytes()}
    proc = _run_3a_until_v1_is_patched(env)
    children = []
    try:
        seen["live"] = cfg.read_bytes()
        deadline = time.time() + 60
        while time.time() < deadline and not children:  # V1's correctness check runs in a child
            children = _children(proc.pid)
            time.sleep(0.01)
        for c in children:  # held mid-check, so V1 stays live however slow the doctor calls below are
            with contextlib.suppress(OSError):
                os.kill(c, signal.SIGSTOP)
        seen["children"] = children
        seen["doctor"] = _kinv(env, "doctor", "--json")
        from kinv.agent.store.db import Store

        Store(tmp / "other").close()  # a second terminal's state dir on the same checkout
        seen["doctor_other"] = _kinv(dict(env, KINV_STATE_DIR=str(tmp / "other")), "doctor", "--json")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for c in children:  # let a held child run on: it must notice by itself that its run is gone
            with contextlib.suppress(OSError):
                os.kill(c, signal.SIGCONT)
        t0 = time.time()
        while time.time() - t0 < 5 and any(_alive(c) for c in children):
            time.sleep(0.1)
        seen["children_alive"] = [c for c in children if _alive(c)]
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in seen.get("children_alive", children):  # leave nothing behind, whatever the verdict
            with contextlib.suppress(OSError):
                os.kill(c, signal.SIGKILL)
    seen["env"], seen["cfg"], seen["tmp"] = env, cfg, tmp
    return seen


def _copy_state(seen: dict, name: str) -> tuple[dict, Path]:
    """A copy of the killed run's state dir and of its live config (V1 still on disk)."""
    tmp = seen["tmp"] / name
    shutil.copytree(seen["tmp"] / "state", tmp / "state")
    shutil.copytree(seen["cfg"].parent, tmp / "configs")
    return dict(seen["env"], KINV_STATE_DIR=str(tmp / "state"), KINV_CONFIG_DIR=str(tmp / "configs")), tmp


def test_doctor_during_a_healthy_live_run_reports_it_running_not_a_bad_patch(killed_run):
    r = killed_run["doctor"]
    assert r.returncode == 0, r.stdout + r.stderr
    found = {f["check"]: f for f in json.loads(r.stdout)}
    assert found["patches"]["status"] == "ok" and "running" in found["patches"]["detail"], found["patches"]
    assert "pid" in found["patches"]["detail"] and found["patches"]["fix"] != "kinv revert"
    other = killed_run["doctor_other"]
    assert other.returncode == 0, other.stdout + other.stderr
    cfg = {f["check"]: f for f in json.loads(other.stdout)}["config mla_decode"]
    assert cfg["status"] == "ok" and "edited by hand" not in cfg["detail"], cfg
    assert str(killed_run["tmp"] / "state") in cfg["detail"]  # the lock names the run's state dir


def test_a_killed_runs_correctness_child_does_not_outlive_it(killed_run):
    assert killed_run["children"], "no child of the run was seen during V1's correctness check"
    assert killed_run["children_alive"] == [], f"still running 5 s after the run was killed: {killed_run['children_alive']}"


def test_after_a_kill_status_says_not_running_with_the_live_patch_and_the_way_back(killed_run):
    assert killed_run["live"] != killed_run["baseline"]
    env, tmp = _copy_state(killed_run, "status")
    r = _kinv(env, "status")
    out = r.stdout + r.stderr
    assert "not running" in out and "V1" in out and "mla_decode.json" in out, out
    assert "kinv resume 3a" in out and "kinv revert" in out, out
    ws = next(w for w in json.loads(_kinv(env, "status", "--json").stdout)["workstreams"] if w["id"] == "#3a")
    assert "running" != ws["status"] and ws["live_patches"], ws
    r = _kinv(env, "doctor", "--json")
    assert r.returncode == 1
    patches = {f["check"]: f for f in json.loads(r.stdout)}["patches"]
    assert patches["status"] == "bad" and "kinv resume 3a" in patches["fix"], patches


@pytest.mark.parametrize("damage", ["truncated", "wal deleted"])
def test_a_truncated_kinv_db_or_its_deleted_wal_after_a_kill_is_an_alarm(killed_run, damage):
    env, tmp = _copy_state(killed_run, damage.replace(" ", "-"))
    db = tmp / "state" / "kinv.db"
    if damage == "truncated":
        db.write_bytes(b"")
    else:
        Path(f"{db}-wal").unlink()
        Path(f"{db}-shm").unlink(missing_ok=True)
    live = (tmp / "configs" / "mla_decode.json").read_bytes()
    assert live == killed_run["live"]  # V1 is still on disk
    r = _kinv(env, "doctor", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    bad = [f for f in json.loads(r.stdout) if f["status"] == "bad"]
    live_patch = [f for f in bad if "mla_decode.json" in f["detail"] and "num_warps" in f["detail"]]
    assert live_patch, bad  # the file that differs from its file of record, and how
    assert any("kinv revert --to-plan" in f["fix"] and "3a-attention-occupancy.yaml" in f["fix"] for f in live_patch)
    for args in (("status",), ("resume", "3a", "--backend", "replay")):
        r = _kinv(env, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "unknown workstream" not in r.stderr and "internal error" not in r.stderr, (args, r.stderr)
        assert "mla_decode.json" in r.stdout + r.stderr and "kinv revert --to-plan" in r.stdout + r.stderr, args
    assert (tmp / "configs" / "mla_decode.json").read_bytes() == live  # nothing was done behind the person's back


def test_kinv_db_deleted_during_a_run_fails_loudly_with_the_kernel_restored(tmp_path):
    from tests.utils import replay_env

    env = replay_env(tmp_path, tmp_path / "state", PYTHONUNBUFFERED="1")
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    proc = _run_3a_until_v1_is_patched(env)
    try:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{tmp_path / 'state' / 'kinv.db'}{suffix}").unlink(missing_ok=True)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert "kinv.db" in out and "deleted" in out and "close-out" not in out.splitlines()[-1], out
    assert cfg.read_bytes() == before  # V1 reverted although its journal is gone with the file
    r = _kinv(env, "status")
    assert r.returncode == 1 and "no kinv state" not in r.stderr and "kinv.db" in r.stderr, r.stderr


def test_a_kill_inside_reject_never_loses_the_rejected_event(tmp_path, paused_3a):
    """Every fault point of `kinv reject` killed in turn: the decision and its event are both there, or neither."""
    from tests.utils import replay_env

    env = replay_env(tmp_path, tmp_path / "state")  # #3a paused at V1's approval
    aid = json.loads(_kinv(env, "pending", "--json").stdout)[0]["id"]

    def reject(state: Path, **extra):
        e = {**_env(**extra), "KINV_STATE_DIR": str(state), "KINV_CONFIG_DIR": env["KINV_CONFIG_DIR"]}
        return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", "reject", aid, "--reason", "not on sm_120"],
                              env=e, cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip

    count = tmp_path / "count"
    shutil.copytree(tmp_path / "state", count)
    assert reject(count, KINV_COUNT_POINTS=str(tmp_path / "points")).returncode == 0
    n_points = len((tmp_path / "points").read_text().splitlines())
    assert n_points >= 2
    for n in range(1, n_points + 1):
        state = tmp_path / f"k{n}"
        shutil.copytree(tmp_path / "state", state)
        r = reject(state, KINV_CRASH_AT=str(n))
        assert r.returncode == -signal.SIGKILL, (n, r.returncode, r.stderr)
        db = sqlite3.connect(state / "kinv.db")
        status = db.execute("select status from approvals where id = ?", [aid]).fetchone()[0]
        events = db.execute("select count(*) from events where kind = 'approval' and message like ?",
                            [f"{aid} rejected%"]).fetchone()[0]  # fmt: skip
        db.close()
        assert (status, events) in (("pending", 0), ("rejected", 1)), f"killed at point {n}: {status}, {events} event(s)"
