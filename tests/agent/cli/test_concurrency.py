"""Concurrency: one writer per workstream; readers run beside it.

"If two `kinv run`s start on the same workstream, the second refuses and names
the first one's pid.  Readers such as `kinv status` run while a writer works,
with no lock errors and no lost rows."

The writer is frozen deterministically with KINV_STOP_AT (agent/faults.py):
it stops itself with SIGSTOP right after V1's patch was written and journaled
``applied``, outside any transaction, with its locks held.  The second run
starts then, which is the worst moment: a second process that recovered
before taking the lock would revert the first one's live patch.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.utils import write_seed_config

pytestmark = pytest.mark.slow  # the slow lane: kills, races, fuzzing, drills (python -m pytest -m slow)

ROOT = Path(__file__).resolve().parents[3]
PLAN = ROOT / "plans" / "3a-attention-occupancy.yaml"


@pytest.fixture
def env(tmp_path, state_dir):
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    write_seed_config(cfg_dir)
    e = {k: v for k, v in os.environ.items() if k not in ("KINV_CRASH_AT", "KINV_COUNT_POINTS", "KINV_STOP_AT")}
    e.update(KINV_STATE_DIR=str(state_dir), KINV_CONFIG_DIR=str(cfg_dir), TRITON_INTERPRET="1", KINV_FORCE_NO_GPU="1",
             PYTHONPATH=str(ROOT))  # fmt: skip
    return e


def kinv(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def start_run(env, tmp_path, name, **extra):
    log = open(tmp_path / f"{name}.log", "wb")  # a file, not a pipe: a stopped or busy writer never blocks on it
    proc = subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", "run", str(PLAN), "--backend", "replay", "--approval",
                             "auto"], env={**env, **extra}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    log.close()
    return proc


def wait_stopped_or_exit(proc, timeout=300) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid:
            if os.WIFSTOPPED(status):
                return "stopped"
            proc.returncode = os.waitstatus_to_exitcode(status)
            return "exited"
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"pid {proc.pid} neither stopped nor exited in {timeout} s")


def db_rows(env, sql):
    conn = sqlite3.connect(Path(env["KINV_STATE_DIR"]) / "kinv.db", timeout=30)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_second_run_refuses_naming_the_first_pid_and_leaves_its_patch_alone(env, tmp_path):
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    baseline = cfg.read_bytes()
    first = start_run(env, tmp_path, "first", KINV_STOP_AT="journal.applied.after")
    try:
        assert wait_stopped_or_exit(first) == "stopped", (tmp_path / "first.log").read_text()
        patched = cfg.read_bytes()
        assert patched != baseline and b'"num_warps": 8' in patched  # V1 is live on disk, journaled applied
        assert db_rows(env, "select state from patches") == [("applied",)]

        second = kinv(env, "run", str(PLAN), "--backend", "replay", "--approval", "auto", timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "Traceback" not in second.stderr, second.stderr
        # the refused run touched nothing: the first run's patch is still live and still journaled applied
        assert cfg.read_bytes() == patched
        assert db_rows(env, "select state from patches") == [("applied",)]
        assert db_rows(env, "select count(*) from events where kind = 'patch.recovered'") == [(0,)]
        assert db_rows(env, "select pid from locks where workstream = '#3a'") == [(first.pid,)]
        resume = kinv(env, "resume", "3a", "--backend", "replay", "--approval", "auto", timeout=120)
        assert resume.returncode == 1 and f"pid {first.pid}" in resume.stderr  # resume is refused the same way
        revert = kinv(env, "revert", timeout=120)  # and so is a manual revert of the live patch
        assert revert.returncode == 1 and f"pid {first.pid}" in revert.stderr, revert.stdout + revert.stderr
        assert cfg.read_bytes() == patched
        assert db_rows(env, "select state from patches") == [("applied",)]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert wait_stopped_or_exit(first) == "exited" and first.returncode == 0, (tmp_path / "first.log").read_text()
    assert cfg.read_bytes() == baseline
    t = {x["id"]: x for x in json.loads(kinv(env, "todos", "3a", "--json").stdout)}
    assert t["#3a.V1"]["reason"].startswith("reject") and t["#3a.V2"]["reason"].startswith("inconclusive")
    assert db_rows(env, "select count(*) from locks") == [(0,)]  # both locks released


def test_readers_run_beside_a_writer_without_lock_errors_or_lost_rows(env, tmp_path):
    # the state exists before the readers start (a reader never creates it)
    first = start_run(env, tmp_path, "writer", KINV_STOP_AT="lock.acquired")
    assert wait_stopped_or_exit(first) == "stopped"
    calls: list[tuple[str, int, str, str, bool]] = []
    done = threading.Event()

    def reader():
        i = 0
        while not done.is_set() or i < 20:
            cmd = ("status", "--json") if i % 2 == 0 else ("experiments", "3a", "--json")
            r = kinv(env, *cmd, timeout=120)
            calls.append((cmd[0], r.returncode, r.stdout, r.stderr, not done.is_set()))  # True: the writer was running
            i += 1

    t = threading.Thread(target=reader)
    os.kill(first.pid, signal.SIGCONT)
    t.start()
    try:
        state = wait_stopped_or_exit(first)
    finally:
        done.set()
        t.join()
    assert state == "exited" and first.returncode == 0, (tmp_path / "writer.log").read_text()
    assert sum(c[4] for c in calls) >= 20, f"only {sum(c[4] for c in calls)} reads while the writer ran"
    seen = []
    for cmd, rc, out, err, _ in calls:
        assert "locked" not in err.lower() and "Traceback" not in err, err
        if cmd == "experiments" and rc != 0 and "unknown workstream" in err:
            continue  # before the writer wrote its workstream row
        assert rc == 0, err
        data = json.loads(out)  # valid JSON every time
        if cmd == "experiments":
            seen.append(sum(e["samples"] for e in data))
    assert len(seen) >= 5
    assert seen == sorted(seen), f"a reader saw fewer samples than an earlier one: {seen}"
    final = db_rows(env, "select count(*) from samples")[0][0]
    assert final > 0 and max(seen) <= final
    last = json.loads(kinv(env, "experiments", "3a", "--json").stdout)
    assert sum(e["samples"] for e in last) == final  # nothing lost: the readers' view equals the store
