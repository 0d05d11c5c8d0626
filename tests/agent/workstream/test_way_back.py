"""There is always a way back to the baseline that needs no state dir; a person's decision is final."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.utils import kinv_in_process, leave_kinv_patch_live, replay_env

ROOT = Path(__file__).resolve().parents[3]


def _env(tmp_path, state):
    return replay_env(tmp_path, state)


def _kinv(env, *args, cwd=None):
    return kinv_in_process(env, *args, cwd=cwd)


def test_revert_to_plan_restores_the_baseline_with_the_state_dir_gone(tmp_path, state_dir):
    env = _env(tmp_path, state_dir)
    cfg = Path(env["KINV_CONFIG_DIR"]) / "mla_decode.json"
    before = cfg.read_bytes()
    leave_kinv_patch_live(cfg, {"num_warps": 8})  # a variant left live ...
    shutil.rmtree(state_dir, ignore_errors=True)  # ... and kinv.db lost
    r = _kinv(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml")
    assert r.returncode == 0 and "restored" in r.stdout, r.stdout + r.stderr
    assert cfg.read_bytes() == before  # the file of record, byte for byte
    assert not Path(state_dir).exists()  # it needed (and wrote) no state
    again = _kinv(env, "revert", "--to-plan", "plans/3a-attention-occupancy.yaml")
    assert again.returncode == 0 and "already holds its file of record" in again.stdout


def test_approve_and_reject_race_one_wins_the_other_is_told(tmp_path, state_dir, paused_3a):
    env = _env(tmp_path, state_dir)  # #3a paused at V1's approval
    aid = json.loads(_kinv(env, "pending", "--json").stdout)[0]["id"]
    procs = [subprocess.Popen([sys.executable, "-m", "kinv.agent.cli.app", *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for args in (("approve", aid), ("reject", aid, "--reason", "not on this fleet"))]  # fmt: skip
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "already" in loser and "final" in loser
    from kinv.agent.store.db import Store

    decided = Store(state_dir).approval(aid)["status"]
    winner = "approved" if results[0][0] == 0 else "rejected"
    assert decided == winner  # the recorded decision is the winner's, not the last writer's


def test_an_internal_failure_is_not_bad_input_one_line_and_the_traceback_in_a_log(tmp_path, state_dir, paused_3a):
    import sqlite3

    env = _env(tmp_path, state_dir)  # #3a paused at V1's approval
    # the run's key steps are in the state dir's log, from its first line (before the state dir existed)
    ran = (Path(state_dir) / "kinv.log").read_text()
    assert " INFO " in ran and "backend replay, approval ask" in ran and "REPLAY backend" in ran, ran
    assert "patch" in ran or "approval" in ran, ran
    assert "ended: paused: waiting for approval" in ran and "Traceback" not in ran, ran
    conn = sqlite3.connect(Path(state_dir) / "kinv.db")
    conn.execute("drop table verdicts")  # damage kinv cannot explain: a bug-shaped failure
    conn.commit()
    conn.close()
    r = _kinv(env, "show", "3")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "internal error" in r.stderr and str(Path(state_dir) / "kinv.log") in r.stderr
    log = (Path(state_dir) / "kinv.log").read_text()
    assert log.startswith(ran) and "Traceback" in log and "no such table: verdicts" in log


def test_the_error_log_follows_state_dir_not_the_working_directory(tmp_path, state_dir):
    """An internal error of `kinv --state-dir B ...` logs its traceback under B, not under ./state of the working
    directory nor under $KINV_STATE_DIR."""
    import sqlite3

    from kinv.agent.store.db import Store

    other = tmp_path / "other-state"
    Store(other).close()
    conn = sqlite3.connect(other / "kinv.db")
    conn.execute("drop table experiments")  # damage kinv cannot explain: a bug-shaped failure
    conn.commit()
    conn.close()
    cwd = tmp_path / "cwd"
    (cwd / "state").mkdir(parents=True)
    env = _env(tmp_path, state_dir)
    env["PYTHONPATH"] = str(ROOT)
    r = _kinv(env, "status", "--state-dir", str(other), cwd=cwd)
    assert r.returncode == 1 and "internal error" in r.stderr, r.stderr
    assert str(other / "kinv.log") in r.stderr
    assert "no such table: experiments" in (other / "kinv.log").read_text()
    assert not (cwd / "state" / "kinv.log").exists() and not Path(state_dir).exists()


def _corrupt_header(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[:100] = b"this is no SQLite header" + b"\0" * 76
    db.write_bytes(bytes(data))


def test_a_corrupt_kinv_db_header_is_one_line_naming_the_file_and_the_fix(tmp_path, state_dir):
    from kinv.agent.store.db import Store

    env = _env(tmp_path, state_dir)
    store = Store(state_dir)
    store.upsert_workstream({"id": "#3a", "title": "t", "kernel": "mla_decode", "status": "running",
                             "plan_path": str(ROOT / "plans" / "3a-attention-occupancy.yaml")})  # fmt: skip
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    db = Path(state_dir) / "kinv.db"
    _corrupt_header(db)
    before = db.read_bytes()
    for args in (("status",), ("resume", "3a", "--backend", "replay"), ("revert",), ("pending",)):
        r = _kinv(env, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "internal error" not in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert str(db) in lines[0] and "damaged" in lines[0] and "kinv revert --to-plan" in lines[0], (args, lines)
    r = _kinv(env, "doctor", "--json")
    assert r.returncode == 1
    found = {f["check"]: f for f in json.loads(r.stdout)}
    assert found["kinv.db"]["status"] == "bad" and "kinv revert --to-plan" in found["kinv.db"]["fix"]
    assert db.read_bytes() == before  # nothing tried to repair it behind the person's back


def test_a_full_disk_is_one_line_naming_the_state_dir_not_an_internal_error(tmp_path, state_dir):
    import resource
    import signal

    def small_disk():  # a file-size limit: writes past 8 KB fail as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    env = _env(tmp_path, state_dir)
    for args in (("run", "plans/3a-attention-occupancy.yaml", "--backend", "replay"), ("status",)):
        r = subprocess.run([sys.executable, "-m", "kinv.agent.cli.app", *args], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=120, preexec_fn=small_disk)  # fmt: skip
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "internal error" not in r.stderr, (args, r.stderr)
        assert str(Path(state_dir).resolve()) in lines[0] and "full" in lines[0], (args, lines)
